"""Request generator and invariant checker for fuzzing sampling masks over HTTP.

One copy, two drivers: `tests/http/test_fuzz.py` (hypothesis, a bounded deterministic
slice against conftest's shared `mask_server`) and `scripts/fuzz_masks.py` (the
long run: a seeded `random.Random`, until a token goal is met). Both draw through
the same `Draw` interface, so the generator is the same code; hypothesis shrinks
a failing example, the script prints the failing example's seed and requests.

What one example is: a batch of requests over the three routes
(`/inference/v1/generate` mainly, `/v1/completions`, `/v1/chat/completions`),
streamed or not, some aborted by the client (a stream closed after k events, a
non-streamed request cancelled after a delay), all sent concurrently. What every
outcome must satisfy (`Checker.check`):

- a request the server must refuse (decided here, independently, from the
  documented rules: a `return_sampling_mask` that is not true, false or null;
  true with temperature 0, or with a top_k above --max-sampling-mask-size; a
  whitespace-only bad word; vLLM's own "greedy with n > 1") is a 400 whose
  message names the parameter;
- otherwise: a completed request has its n choices; every choice that should
  carry a mask (documented rule: true; null with temperature > 0 and top_k,
  top_p < 1 or min_p > 0) has exactly one support per generated token, the
  sampled token inside, ids strictly ascending within [0, vocab), no support
  wider than the limit, no banned id (bad words, min_tokens' stop ids) inside;
  a choice that should not carry one has `sampling_mask: null` (every chunk);
- a stream's chunks each carry the supports of exactly their own tokens;
- the only allowed error is the size-limit one, and only for a request that
  asked for its mask (true): its message names `--max-sampling-mask-size <limit>`;
  a request that left the switch null is never failed by it: with a top_k above the
  limit it has no mask, and a step wider than the limit turns its mask null, with
  `sampling_mask_reason`, from that chunk on (a "size-limit drop");
- no 5xx, no hang; after every example `/health` is 200 and the engine runs and
  waits for nothing (no request left behind by an abort);
- supports are exact against an independent float32 reference (the demo model
  in transformers; logit_bias, bad words, min_tokens and the three penalties
  modelled from their definitions), ids within eps of a threshold excepted, and
  each returned logprob is log_softmax over the returned support.

`replay_crowd` adds: a seeded request gives the same tokens and masks alone and
among other requests. Its crowd is all-seeded and temperature > 0: written when
vLLM's V1 CPU sampler honoured seeds only in all-seeded batches (fixed since by
`patches/cpu_seeded_sampling`; mixed crowds: tests/llm/test_seeded_replay_v1.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import string
import time
from collections import Counter

import httpx
import torch

from conftest import (PROMPTS, SERVER_MAX_MASK_SIZE, SERVER_MAX_NUM_SEQS, hf_logits,
                      reference_support)

from vllm_sampling_mask import DEMO_MODEL

VOCAB = 4096          # the demo model's vocabulary
EOS = 2               # the demo model's eos_token_id
LIMIT = SERVER_MAX_MASK_SIZE
MAX_NUM_SEQS = SERVER_MAX_NUM_SEQS
SIZE_ERROR = f"--max-sampling-mask-size {LIMIT}"
GREEDY_EPS = 1e-5     # vLLM: temperature below this is greedy
ROUTES = {"generate": "/inference/v1/generate", "completions": "/v1/completions",
          "chat": "/v1/chat/completions"}
MISSING = "missing"   # the body has no return_sampling_mask field at all
BAD_WORDS = ["self", " self", "def", " return", "(", ")", ":", "import", "x", " the",
             "print(", "if __name__", ":\n"]
# Whitespace only: refused with a 400 naming bad_words (upstream 0.27.1 indexed the
# empty encoding of `word.lstrip()`: a 500; the package's input checks refuse it).
BLANK_BAD_WORDS = ["\n", " ", "    ", "\t\n"]
STOP_STRINGS = ["\n", "(", ")", ":", " ", "e", "def", "\n\n", "self."]
ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\t" + "éß中🙂"


# --------------------------------------------------------------------------- draws

class RandomDraw:
    """The script's source of choices: a seeded `random.Random`."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def chance(self, percent: int) -> bool:
        return self.rng.randrange(100) < percent

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def real(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def ids(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(lo, hi))]

    def text(self, lo: int, hi: int) -> str:
        return "".join(self.rng.choice(ALPHABET) for _ in range(self.rng.randint(lo, hi)))


class HypothesisDraw:
    """The test's source of choices: hypothesis' `st.data()`, so that a failing
    example shrinks (towards the first choice, small numbers, no options)."""

    def __init__(self, data):
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def chance(self, percent: int) -> bool:
        return self.data.draw(self.st.integers(0, 99)) >= 100 - percent

    def choice(self, seq):
        return self.data.draw(self.st.sampled_from(list(seq)))

    def real(self, lo: float, hi: float) -> float:
        return self.data.draw(self.st.floats(lo, hi, allow_nan=False, allow_infinity=False))

    def ids(self, lo: int, hi: int) -> list[int]:
        return self.data.draw(self.st.lists(self.st.integers(0, VOCAB - 1),
                                            min_size=lo, max_size=hi))

    def text(self, lo: int, hi: int) -> str:
        return self.data.draw(self.st.text(alphabet=ALPHABET, min_size=lo, max_size=hi))


# ------------------------------------------------------------------------ requests

@dataclasses.dataclass
class Req:
    route: str                     # a key of ROUTES
    stream: bool
    prompt: list[int] | str        # token ids, or text (completions, chat)
    sp: dict                       # sampling fields, every one explicit
    mask_field: object = MISSING   # True, False, None (sent as null) or MISSING
    abort: tuple | None = None     # ("events", k) for a stream, ("after", seconds)
    usage: bool = False            # stream_options.include_usage

    def describe(self) -> str:
        """The body, long id lists shortened (the full body: `body(req)`)."""
        b = body(self)[1]
        ids = b.get("token_ids", b.get("prompt"))
        if isinstance(ids, list) and len(ids) > 12:
            key = "token_ids" if "token_ids" in b else "prompt"
            b[key] = f"{ids[:6]}...{ids[-3:]} ({len(ids)} ids)"
        return json.dumps(b, ensure_ascii=True)


def draw_sampling(d, *, seeded: bool | None = None, greedy: bool = True) -> dict:
    """Every sampling field, explicit (so no server default decides anything)."""
    r = d.int(0, 99)
    if greedy and r < 15:
        temperature = 0.0
    elif r < 20:
        temperature = 0.01       # vLLM's smallest non-greedy temperature
    else:
        temperature = round(d.real(0.2, 2.0), 3)
    k = d.int(0, 99)
    if k < 30:
        top_k = d.choice([0, 0, 0, -1])
    elif k < 85:
        top_k = d.int(1, 100)
    elif k < 95:
        top_k = d.int(101, LIMIT + 12)          # around the size limit
    else:
        top_k = d.int(LIMIT + 1, 600)           # above it
    top_p = 1.0 if d.chance(55) else round(d.real(0.05, 1.0), 3)
    min_p = 0.0 if d.chance(75) else round(d.real(0.01, 0.5), 3)
    penalties = d.chance(25)
    max_tokens = d.int(1, 32)
    sp = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        presence_penalty=round(d.real(-2.0, 2.0), 3) if penalties else 0.0,
        frequency_penalty=round(d.real(-2.0, 2.0), 3) if penalties else 0.0,
        repetition_penalty=round(d.real(0.5, 2.0), 3) if penalties else 1.0,
        logit_bias=({d.int(0, VOCAB - 1): round(d.real(-10.0, 10.0), 2)
                     for _ in range(d.int(1, 5))} if d.chance(20) else {}),
        bad_words=([d.choice(BAD_WORDS) for _ in range(d.int(1, 3))]
                   if d.chance(15) else []),
        stop=[d.choice(STOP_STRINGS) for _ in range(d.int(1, 2))] if d.chance(15) else [],
        stop_token_ids=([d.choice([5, 10, 14, 28, 201, 280, 308, d.int(0, VOCAB - 1)])
                         for _ in range(d.int(1, 3))] if d.chance(15) else []),
        n=d.choice([1, 1, 1, 1, 2, 3]),
        seed=(d.int(0, 2**31 - 1) if (seeded if seeded is not None else d.chance(50))
              else None),
        min_tokens=0,
        max_tokens=max_tokens,
        ignore_eos=d.chance(35),
        logprobs=d.choice([None, None, 0, 1, 3]),
    )
    if d.chance(20):
        sp["min_tokens"] = d.int(0, max_tokens)
    if d.chance(2):
        sp["bad_words"] = sp["bad_words"] + [d.choice(BLANK_BAD_WORDS)]
    return sp


def draw_prompt(d, route: str) -> list[int] | str:
    if route == "generate" or (route == "completions" and d.chance(40)):
        return d.ids(1, 16) if d.chance(70) else d.ids(17, 200)
    if d.chance(50):
        return d.choice(PROMPTS)
    return d.text(1, 60)


def draw_request(d, *, seeded: bool | None = None, greedy: bool = True,
                 aborts: bool = True) -> Req:
    route = d.choice(["generate", "generate", "generate", "completions", "chat"])
    stream = d.chance(40)
    prompt = draw_prompt(d, route)
    sp = draw_sampling(d, seeded=seeded, greedy=greedy)
    mask_field = d.choice([None, MISSING, True, True, False])
    if d.chance(3):
        mask_field = d.choice(["yes", 1, 0, "true"])      # not a strict boolean: a 400
    abort = None
    if aborts and d.chance(12):
        abort = ("events", d.int(0, 8)) if stream else ("after", round(d.real(0.02, 0.8), 3))
    return Req(route, stream, prompt, sp, mask_field, abort, usage=stream and d.chance(50))


def draw_batch(d) -> list[Req]:
    """A concurrent batch: 1 to 8 requests (n up to 3 each, so at times more
    sequences than the server's --max-num-seqs 8, which queue)."""
    return [draw_request(d) for _ in range(d.int(1, 8))]


def draw_crowd(d) -> list[Req]:
    """For `replay_crowd`: 2 to 5 requests, all seeded, temperature > 0, no aborts.
    top_p = 1 rows may sit beside top_p < 1 rows: upstream then cut a top_p = 1
    row's zero-probability ids (`patches/worker/fixes/top_p_one_rows` keeps them)."""
    return [draw_request(d, seeded=True, greedy=False, aborts=False)
            for _ in range(d.int(2, 5))]


def body(req: Req) -> tuple[str, dict]:
    sp = dict(req.sp)
    b: dict = {"model": DEMO_MODEL, "stream": req.stream}
    if req.stream and req.usage:
        b["stream_options"] = {"include_usage": True}
    if req.mask_field is not MISSING:
        b["return_sampling_mask"] = req.mask_field
    if req.route == "generate":
        sp["logit_bias"] = {str(k): v for k, v in sp["logit_bias"].items()}
        if sp["logprobs"] is None:
            del sp["logprobs"]
        b.update(token_ids=list(req.prompt), sampling_params=sp)
        return ROUTES["generate"], b
    sp["logit_bias"] = {str(k): v for k, v in sp["logit_bias"].items()}
    logprobs = sp.pop("logprobs")
    b.update(sp, return_token_ids=True)
    if req.route == "completions":
        b["prompt"] = req.prompt
        if logprobs is not None:
            b["logprobs"] = logprobs
    else:
        b["messages"] = [{"role": "user", "content": req.prompt}]
        if logprobs is not None:
            b.update(logprobs=True, top_logprobs=logprobs)
    return ROUTES[req.route], b


# ----------------------------------------------------------- the documented rule

def is_greedy(req: Req) -> bool:
    return req.sp["temperature"] < GREEDY_EPS


def expected_refusals(req: Req) -> list[str]:
    """Why the server must refuse `req` (empty: it must not): each reason as what
    the 400's message then names. With several reasons, naming one is enough."""
    reasons = []
    if req.mask_field not in (True, False, None, MISSING) or type(req.mask_field) is int:
        # the body field: true, false or null (on the generate route pydantic may
        # first build the sampling parameters, whose own checks then answer)
        reasons.append("return_sampling_mask")
    if is_greedy(req) and req.sp["n"] > 1:
        reasons.append("n must be 1")        # vLLM's own rule
    if req.mask_field is True:
        if is_greedy(req):
            reasons.append("temperature")
        elif req.sp["top_k"] > LIMIT:
            reasons.append("top_k")
    if any(w and not w.strip() for w in req.sp["bad_words"]):
        reasons.append("bad_words")
    return reasons


def expects_mask(req: Req) -> bool:
    """docs/sampling_mask.md, 'Which requests get a mask' (engine flag on)."""
    if req.mask_field is True:
        return True
    if req.mask_field is False:
        return False
    sp = req.sp
    if LIMIT < sp["top_k"] < VOCAB:   # null: known up front to outgrow the limit
        return False
    return sp["temperature"] > 0 and (sp["top_k"] > 0 or sp["top_p"] < 1
                                      or sp["min_p"] > 0)


# ------------------------------------------------------------------------ sending

@dataclasses.dataclass
class Choice:
    tokens: list = dataclasses.field(default_factory=list)
    masks: list = dataclasses.field(default_factory=list)   # per chunk: list or None
    reasons: list = dataclasses.field(default_factory=list)  # per chunk: sampling_mask_reason
    logprobs: list = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: object = None
    problems: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outcome:
    status: int | None = None         # None: no response (cancelled, or transport error)
    error: str | None = None          # a 400's message, or a stream's error event
    aborted: bool = False             # the client went away before the end
    done: bool = False                # a stream ended with [DONE]
    transport: str | None = None      # a transport failure (not an abort)
    choices: dict = dataclasses.field(default_factory=dict)
    prompt_ids: list | None = None
    events: int = 0


def _logprob_values(route: str, logprobs) -> list[float]:
    if not logprobs:
        return []
    if route == "completions":
        return list(logprobs["token_logprobs"])
    return [entry["logprob"] for entry in logprobs["content"]]


def _absorb(out: Outcome, req: Req, event: dict, streamed: bool) -> None:
    if event.get("prompt_token_ids"):
        out.prompt_ids = event["prompt_token_ids"]
    for c in event.get("choices") or []:
        ch = out.choices.setdefault(c["index"], Choice())
        if c.get("prompt_token_ids"):
            out.prompt_ids = c["prompt_token_ids"]
        tokens = c.get("token_ids") or []
        mask = c.get("sampling_mask")
        if streamed and mask is not None and len(mask) != len(tokens):
            ch.problems.append(f"a chunk carries {len(mask)} supports for "
                               f"{len(tokens)} tokens")
        ch.tokens += tokens
        ch.masks.append(mask)
        ch.reasons.append(c.get("sampling_mask_reason"))
        ch.logprobs += _logprob_values(req.route, c.get("logprobs"))
        if c.get("finish_reason") is not None:
            ch.finish_reason = c["finish_reason"]
            ch.stop_reason = c.get("stop_reason")


def _error_message(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"]
    except Exception:  # noqa: BLE001 - keep whatever the server sent
        return text


async def send(client: httpx.AsyncClient, base: str, req: Req) -> Outcome:
    path, b = body(req)
    out = Outcome()

    async def run():
        if not req.stream:
            r = await client.post(base + path, json=b)
            out.status = r.status_code
            if r.status_code == 200:
                _absorb(out, req, r.json(), streamed=False)
            else:
                out.error = _error_message(r.text)
            return
        async with client.stream("POST", base + path, json=b) as r:
            out.status = r.status_code
            if r.status_code != 200:
                out.error = _error_message((await r.aread()).decode(errors="replace"))
                return
            async for line in r.aiter_lines():
                if not line:
                    continue
                if req.abort and out.events >= req.abort[1]:
                    out.aborted = True
                    return              # leaving the block closes the connection
                assert line.startswith("data: "), line
                data = line[len("data: "):]
                if data == "[DONE]":
                    out.done = True
                    continue
                event = json.loads(data)
                out.events += 1
                if "error" in event:
                    out.error = event["error"].get("message", str(event["error"]))
                    continue
                _absorb(out, req, event, streamed=True)

    try:
        if req.abort and req.abort[0] == "after":
            await asyncio.wait_for(run(), timeout=req.abort[1])
        else:
            await run()
    except (asyncio.TimeoutError, TimeoutError):
        if req.abort and req.abort[0] == "after":
            out.aborted = True
        else:
            out.transport = "timeout"
    except httpx.HTTPError as exc:
        out.transport = f"{type(exc).__name__}: {exc}"
    if req.abort and req.abort[0] == "events" and out.done:
        out.aborted = False       # the stream ended before the abort point
    return out


async def _send_all(base: str, reqs: list[Req], timeout: float) -> list[Outcome]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        return list(await asyncio.gather(*(send(client, base, r) for r in reqs)))


def send_batch(base: str, reqs: list[Req], timeout: float = 300) -> list[Outcome]:
    """All of `reqs` at once, each on its own connection."""
    return asyncio.run(_send_all(base, reqs, timeout))


def server_state(base: str) -> tuple[int, float, float]:
    """(/health status, requests running, requests waiting) from /metrics."""
    health = httpx.get(base + "/health", timeout=30).status_code
    running = waiting = 0.0
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            running += float(line.split()[-1])
        elif line.startswith("vllm:num_requests_waiting{"):
            waiting += float(line.split()[-1])
    return health, running, waiting


def settle(base: str, timeout: float = 120) -> str | None:
    """After an example: /health is 200 and, within `timeout` (a hang detector,
    not a timing bound), no request is running or waiting. A problem, or None."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            health, running, waiting = server_state(base)
        except httpx.HTTPError as exc:
            return f"/health or /metrics unreachable: {type(exc).__name__}: {exc}"
        if health != 200:
            return f"/health answered {health}"
        if running == 0 and waiting == 0:
            return None
        if time.monotonic() > deadline:
            return (f"{running:g} requests still running and {waiting:g} waiting "
                    f"{timeout:g} s after the example's last response")
        time.sleep(0.2)


# ----------------------------------------------------------------------- checking

def bad_word_variants(tokenizer, words: list[str]) -> list[list[int]]:
    """The token sequences vLLM bans for `bad_words` (its documented behaviour:
    each word as it is, and with a leading space when that tokenizes to a
    different first token of the same length)."""
    variants: list[list[int]] = []
    for word in words:
        plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        variants.append(plain)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != plain[0] and len(spaced) == len(plain):
            variants.append(spaced)
    return variants


def banned_at(variants: list[list[int]], previous: list[int]) -> set[int]:
    """Ids bad words forbid after the generated tokens `previous`."""
    banned = set()
    for v in variants:
        prefix = v[:-1]
        if len(prefix) <= len(previous) and (
                not prefix or previous[len(previous) - len(prefix):] == prefix):
            banned.add(v[-1])
    return banned



@dataclasses.dataclass
class Stats:
    examples: int = 0                  # drawn examples: batches and crowds
    crowds: int = 0
    rounds: int = 0                    # concurrent rounds sent (a crowd sends several)
    requests: int = 0
    completed_choices: int = 0
    tokens_checked: int = 0            # generated tokens of completed choices
    supports_checked: int = 0          # of those, tokens whose support was checked
    supports_vs_reference: int = 0     # of those, compared with the reference
    logprobs_vs_reference: int = 0
    ambiguous_ids: int = 0             # reference ids within eps of a threshold
    ties_at_cut: int = 0               # ids whose logit ties (within eps) the cut's
    replays: int = 0                   # seeded requests compared alone vs in a crowd
    aborts: int = 0
    size_limit_errors: int = 0
    size_limit_drops: int = 0          # null switch: the mask dropped, the request served
    refusals: Counter = dataclasses.field(default_factory=Counter)
    routes: Counter = dataclasses.field(default_factory=Counter)
    violations: list = dataclasses.field(default_factory=list)

    def report(self) -> str:
        lines = [
            f"examples {self.examples} ({self.examples - self.crowds} batches, "
            f"{self.crowds} seeded crowds; {self.rounds} rounds), requests {self.requests} "
            f"({', '.join(f'{k} {v}' for k, v in sorted(self.routes.items()))})",
            f"completed choices {self.completed_choices}, tokens checked "
            f"{self.tokens_checked}, of which with a support {self.supports_checked}",
            f"supports compared against the reference {self.supports_vs_reference} "
            f"(ids within eps of a threshold: {self.ambiguous_ids}, near-ties at the "
            f"cut: {self.ties_at_cut}); logprobs "
            f"compared {self.logprobs_vs_reference}",
            f"seeded requests replayed alone vs in a crowd {self.replays}",
            f"refusals {sum(self.refusals.values())} "
            f"({', '.join(f'{k!r}: {v}' for k, v in sorted(self.refusals.items()))}), "
            f"size-limit errors {self.size_limit_errors}, drops "
            f"{self.size_limit_drops}, aborts {self.aborts}",
            f"violations {len(self.violations)}",
        ]
        lines += [f"  VIOLATION {v}" for v in self.violations[:20]]
        return "\n".join(lines)


class Checker:
    """Checks outcomes against the invariants; counts; keeps the violations."""

    def __init__(self, hf_model, tokenizer, reference_every: int = 1):
        self.model, self.tokenizer = hf_model, tokenizer
        self.reference_every = reference_every   # compare every k-th masked choice
        self.stats = Stats()
        self.failures: list[dict] = []        # every violation with its full body
        self._masked_choices = 0

    def violation(self, req: Req, what: str) -> None:
        self.stats.violations.append(f"{what} | {req.route} stream={req.stream} "
                                     f"body={req.describe()}")
        self.failures.append({"what": what, "path": body(req)[0], "body": body(req)[1]})

    def check(self, req: Req, out: Outcome) -> None:
        s = self.stats
        s.requests += 1
        s.routes[req.route] += 1
        refusals = expected_refusals(req)
        if out.transport is not None:
            self.violation(req, f"transport failure: {out.transport}")
            return
        if out.aborted:
            s.aborts += 1
            if out.status not in (None, 200, 400):
                self.violation(req, f"HTTP {out.status} before the abort: {out.error}")
            for ch in out.choices.values():       # what arrived must be aligned
                self._check_choice(req, out, ch, complete=False)
            return
        if out.status is None or out.status >= 500:
            self.violation(req, f"HTTP {out.status}: {out.error}")
            return
        if refusals:
            named = [r for r in refusals if r in (out.error or "")]
            if out.status == 400 and named:
                s.refusals[named[0]] += 1
            else:
                self.violation(req, f"expected a 400 naming one of {refusals}, got "
                                    f"HTTP {out.status}: {out.error}")
            return
        if out.error is not None or out.status != 200:
            if (out.status in (200, 400) and SIZE_ERROR in out.error
                    and req.mask_field is True):
                s.size_limit_errors += 1
                for ch in out.choices.values():   # chunks before the error event
                    self._check_choice(req, out, ch, complete=False)
            else:
                self.violation(req, f"HTTP {out.status}, error {out.error!r}")
            return
        if req.stream and not out.done:
            self.violation(req, "stream ended without [DONE]")
        if sorted(out.choices) != list(range(req.sp["n"])):
            self.violation(req, f"choices {sorted(out.choices)} for n={req.sp['n']}")
        for ch in out.choices.values():
            self._check_choice(req, out, ch, complete=True)

    def _check_choice(self, req: Req, out: Outcome, ch: Choice, complete: bool) -> None:
        sp, tokens = req.sp, ch.tokens
        for problem in ch.problems:
            self.violation(req, problem)
        want = expects_mask(req)
        chunk_masks = [m for m in ch.masks if m is not None]
        if not want:
            if chunk_masks:
                self.violation(req, "a mask on a request that resolves to none")
            masks = None
        elif len(chunk_masks) != len(ch.masks):
            first = next(i for i, m in enumerate(ch.masks) if m is None)
            if req.mask_field is True or any(m is not None for m in ch.masks[first:]) \
                    or not all(ch.reasons[first:]):
                self.violation(req, "a null mask on a request that must carry one "
                                    "(or, switch null, not null from one chunk on with "
                                    f"sampling_mask_reason): {ch.reasons}")
                return
            if SIZE_ERROR in ch.reasons[first]:
                self.stats.size_limit_drops += 1
            masks = None      # dropped: no support to check
        else:
            masks = [s for m in chunk_masks for s in m]
        if complete:
            self.stats.completed_choices += 1
            self.stats.tokens_checked += len(tokens)
            if not 1 <= len(tokens) <= sp["max_tokens"]:
                self.violation(req, f"{len(tokens)} tokens for max_tokens={sp['max_tokens']}")
            if ch.finish_reason == "length" and len(tokens) != sp["max_tokens"]:
                self.violation(req, f"finish 'length' after {len(tokens)} tokens")
            if isinstance(ch.stop_reason, int) and tokens and (
                    tokens[-1] != ch.stop_reason or len(tokens) <= sp["min_tokens"]):
                self.violation(req, f"stop_reason {ch.stop_reason} but tokens end "
                                    f"{tokens[-3:]} ({len(tokens)} tokens, min_tokens "
                                    f"{sp['min_tokens']})")
            if sp["logprobs"] is not None and len(ch.logprobs) != len(tokens):
                self.violation(req, f"{len(ch.logprobs)} logprobs for {len(tokens)} tokens")
        if any(not 0 <= t < VOCAB for t in tokens):
            self.violation(req, f"generated id out of range: {tokens}")
            return
        variants = bad_word_variants(self.tokenizer, sp["bad_words"]) if sp["bad_words"] else []
        stop_ids = set(sp["stop_token_ids"]) | {EOS}
        for t, token in enumerate(tokens):
            banned = banned_at(variants, tokens[:t])
            if t < sp["min_tokens"]:
                banned |= stop_ids
            if token in banned:
                self.violation(req, f"token {t} is {token}, which bad words or "
                                    f"min_tokens forbid")
        if masks is None:
            return
        if len(masks) != len(tokens):
            self.violation(req, f"{len(masks)} supports for {len(tokens)} tokens")
            return
        for t, (token, support) in enumerate(zip(tokens, masks)):
            where = f"token {t} ({token}), support of {len(support)}"
            if not support:
                self.violation(req, f"{where}: empty")
                continue
            if any(b <= a for a, b in zip(support, support[1:])):
                self.violation(req, f"{where}: not strictly ascending")
            if support[0] < 0 or support[-1] >= VOCAB:
                self.violation(req, f"{where}: ids out of [0, {VOCAB})")
            if token not in support:
                self.violation(req, f"{where}: the sampled token is not inside")
            if len(support) > LIMIT:
                self.violation(req, f"{where}: wider than the limit {LIMIT}")
            banned = banned_at(variants, tokens[:t])
            if t < sp["min_tokens"]:
                banned |= stop_ids
            if banned & set(support):
                self.violation(req, f"{where}: holds forbidden ids "
                                    f"{sorted(banned & set(support))}")
        if complete:
            self.stats.supports_checked += len(tokens)
            self._masked_choices += 1
            if (self._masked_choices - 1) % self.reference_every == 0:
                self._against_reference(req, out, ch, masks)

    def prompt_ids(self, req: Req, out: Outcome) -> list[int] | None:
        return list(req.prompt) if req.route == "generate" else out.prompt_ids

    def processed_row(self, req: Req, logits_row: torch.Tensor, prompt: list[int],
                      previous: list[int], variants) -> torch.Tensor:
        """The logits the sampler draws from, before temperature, from their
        definitions in vLLM's V1 sampler order: bad words, min_tokens and
        logit_bias, then the repetition, frequency and presence penalties."""
        sp = req.sp
        row = logits_row.clone()
        for token, bias in sp["logit_bias"].items():
            row[token] += bias
        banned = banned_at(variants, previous)
        if len(previous) < sp["min_tokens"]:
            banned |= set(sp["stop_token_ids"]) | {EOS}
        for token in banned:
            row[token] = float("-inf")
        rp = sp["repetition_penalty"]
        if rp != 1.0:
            seen = torch.tensor(sorted(set(prompt) | set(previous)), dtype=torch.long)
            vals = row[seen]
            row[seen] = torch.where(vals > 0, vals / rp, vals * rp)
        if previous:
            counts = torch.bincount(torch.tensor(previous), minlength=VOCAB).float()
            row -= sp["frequency_penalty"] * counts
            row -= sp["presence_penalty"] * (counts > 0).float()
        return row

    def _against_reference(self, req: Req, out: Outcome, ch: Choice, masks) -> None:
        prompt = self.prompt_ids(req, out)
        if not prompt:
            self.violation(req, "no prompt_token_ids to compare with the reference")
            return
        sp, tokens = req.sp, ch.tokens
        temperature = max(sp["temperature"], 1e-2)   # vLLM raises (0, 0.01) to 0.01
        eps = 1e-5 * max(1.0, 1.0 / temperature)     # float32 noise scales with 1/T
        variants = bad_word_variants(self.tokenizer, sp["bad_words"]) if sp["bad_words"] else []
        logits = hf_logits(self.model, prompt, tokens)
        for t, (token, support) in enumerate(zip(tokens, masks)):
            row = self.processed_row(req, logits[t], prompt, tokens[:t], variants)
            surely_in, surely_out = reference_support(
                row, temperature, sp["top_k"], sp["top_p"], sp["min_p"], eps=eps)
            got = set(support)
            missing, extra = surely_in - got, got & surely_out
            if missing or extra:
                # a near-tie at the cut: two ids whose logits differ by less than
                # float32 noise sort either way in two implementations, so the one
                # kept at a top-k or top-p cut may be either
                x = row.double() / temperature
                kept_min = x[list(got)].min()
                dropped = torch.ones_like(x, dtype=torch.bool)
                dropped[list(got)] = False
                dropped_max = x[dropped & torch.isfinite(x)].max()
                near_cut = {i for i in missing | extra
                            if min(abs(x[i] - kept_min), abs(x[i] - dropped_max)) < eps}
                self.stats.ties_at_cut += len(near_cut)
                missing, extra = missing - near_cut, extra - near_cut
            if missing or extra:
                self.violation(req, f"token {t} ({token}): support differs from the "
                                    f"reference: missing {sorted(missing)[:10]}, "
                                    f"extra {sorted(extra)[:10]}")
            self.stats.ambiguous_ids += VOCAB - len(surely_in) - len(surely_out)
            self.stats.supports_vs_reference += 1
            if t < len(ch.logprobs) and ch.logprobs[t] is not None:
                x = row.double() / temperature
                ids = torch.tensor(support)
                ref = (x[token] - torch.logsumexp(x[ids], 0)).item()
                got_lp = ch.logprobs[t]
                if not math.isfinite(got_lp) or abs(got_lp - ref) > 1e-3 / min(1.0, temperature):
                    self.violation(req, f"token {t} ({token}): logprob {got_lp} but "
                                        f"log_softmax over its support is {ref}")
                self.stats.logprobs_vs_reference += 1


# ----------------------------------------------------------------------- examples

def run_example(base: str, checker: Checker, reqs: list[Req]) -> list[Outcome]:
    """One example: the batch at once, every outcome checked, then the server
    must be healthy and idle."""
    outs = send_batch(base, reqs)
    for req, out in zip(reqs, outs):
        checker.check(req, out)
    problem = settle(base)
    if problem is not None:
        checker.stats.violations.append(f"after the example: {problem}")
    checker.stats.rounds += 1
    return outs


def _signature(req: Req, out: Outcome):
    """What a seeded replay must reproduce: the outcome kind, and per choice the
    tokens and the (joined) masks."""
    if out.error is not None or out.status != 200:
        kind = "size-limit" if out.error and SIZE_ERROR in out.error else f"http {out.status}"
        return (kind,)
    return ("ok", tuple((i, tuple(ch.tokens),
                         None if all(m is None for m in ch.masks)
                         else tuple(tuple(s) for m in ch.masks if m for s in m))
                        for i, ch in sorted(out.choices.items())))


def replay_crowd(base: str, checker: Checker, crowd: list[Req]) -> None:
    """Each seeded request alone (one after the other), then all at once: the
    same outcome, tokens and masks. Every outcome is also checked."""
    alone = [run_example(base, checker, [req])[0] for req in crowd]
    together = run_example(base, checker, crowd)
    for req, a, b in zip(crowd, alone, together):
        checker.stats.replays += 1
        sa, sb = _signature(req, a), _signature(req, b)
        if sa != sb:
            detail = f"{sa[0]} vs {sb[0]}"
            if sa[0] == sb[0] == "ok":
                for (i, ta, ma), (_, tb, mb) in zip(sa[1], sb[1]):
                    if ta != tb:
                        at = next((t for t, (x, y) in enumerate(zip(ta, tb)) if x != y),
                                  min(len(ta), len(tb)))
                        detail += f"; choice {i}: tokens differ from token {at}"
                    elif ma != mb:
                        at = next(t for t, (x, y) in enumerate(zip(ma or (), mb or ()))
                                  if x != y) if ma and mb else 0
                        detail += f"; choice {i}: same tokens, supports differ at token {at}"
            checker.violation(req, f"seeded request differs alone vs in a crowd of "
                                   f"{len(crowd)}: {detail}")


def fuzz_example(base: str, checker: Checker, d, crowd: bool = False) -> list[str]:
    """One drawn example, a concurrent batch or a seeded crowd: its new violations."""
    before = len(checker.stats.violations)
    if crowd:
        replay_crowd(base, checker, draw_crowd(d))
        checker.stats.crowds += 1
    else:
        run_example(base, checker, draw_batch(d))
    checker.stats.examples += 1
    return checker.stats.violations[before:]
