"""Soak test: many concurrent clients against a real `vllm serve`, mask on vs off.

    python scripts/soak.py [--duration 120] [--clients 64] [--json soak.json]
    python scripts/soak.py --server http://127.0.0.1:8000 [--server-mask off]

By default it starts the demo model's server twice on the loopback interface
(`vllm_sampling_mask.tools.demo.serving`, with `VLLM_SAMPLING_MASK_DEBUG_STATE=1`
for the state route): first with `--return-sampling-mask` ("on"), then the
same command without it ("off"; both keep `--logprobs-mode processed_logprobs`,
so they differ in the mask alone). Against each, `--clients` asyncio clients
send requests back to back for `--duration` seconds, over the three routes
(`/inference/v1/generate`, `/v1/completions`, `/v1/chat/completions`), streamed
or not, with random sampling parameters (temperature, top-k, top-p, min-p,
penalties, seed, n, max_tokens) and random disconnects (a stream closed after a
few chunks, a request cancelled after a random delay). The request sequence of
each client is the same in both phases (seeded).

Every completed choice is checked: on the mask server, one support per token,
the sampled token inside it, ids ascending, unique and within the vocabulary,
a mask present whenever `return_sampling_mask` was true and absent when false (with
the switch null it may be dropped, `sampling_mask_reason`, never partial);
on the off server, no mask. Reported per phase: requests, completed, aborted,
4xx (expected: wide supports over `--max-sampling-mask-size` of requests that asked),
5xx (goal 0),
connection errors, mask violations (goal 0), tokens, p50/p99 latency, the server
process tree's RSS after a warm-up and at the end (goal: growth < 5%), and,
once the load has stopped (by default every client with a request in flight
disconnects at that moment, `--end abort`; `--end drain` lets them finish) and
the aborts have settled, the counts of `GET /debug/sampling_mask/state` (goal:
all zero).

`tests/server/test_soak.py` imports this file and runs `run_phase` for ~25 s against
the test suite's shared server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import aiohttp

STATE_PATH = "/debug/sampling_mask/state"
ROUTES = ("generate", "completions", "chat")
PATHS = {"generate": "/inference/v1/generate", "completions": "/v1/completions",
         "chat": "/v1/chat/completions"}
PROMPTS = ["def main():\n    ", "import os\nimport sys\n\n", "class Parser:\n    def ",
           "    for i in range(", "# Copyright 2001 Python Software Foundation\n",
           "        return self.", "if __name__ == '__main__':\n", "    raise ValueError("]
MESSAGES = ["Write a function that reverses a list.", "Parse a config file.",
            "Sort a dict by value.", "Open a socket."]


# ---------------------------------------------------------------- requests


@dataclass
class Plan:
    """One request: its route, body and how the client treats it."""
    route: str
    body: dict
    stream: bool
    mask_arg: bool | None      # the body's return_sampling_mask (None: absent)
    may_be_wide: bool          # a mask may be taken without a top-k under the limit
    abort_after_chunks: int | None = None   # streamed: close after this many events
    abort_after_s: float | None = None      # not streamed: cancel after this delay


def make_plan(rng: random.Random, model: str, mask_server: bool, vocab: int,
              mask_limit: int, abort_rate: float) -> Plan:
    """A random request. The rng draws the same numbers for both phases; only
    `return_sampling_mask: true` is left out on the server without masks."""
    route = rng.choice(ROUTES)
    stream = rng.random() < 0.5
    greedy = rng.random() < 0.1
    temperature = 0.0 if greedy else round(rng.uniform(0.5, 1.5), 3)
    top_k = rng.choice([0, 0, 1, 5, 20, 50, 100]) if rng.random() < 0.9 else 0
    top_k = min(top_k, mask_limit - 16) if top_k else 0
    wide = rng.random() < 0.05           # a few requests without top-k: may be too wide
    if not wide and not greedy and top_k == 0:
        top_k = rng.choice([10, 40])
    top_p = round(rng.uniform(0.8, 0.99), 3) if rng.random() < 0.4 else 1.0
    min_p = rng.choice([0.0, 0.0, 0.0, 0.02, 0.1])
    n = 2 if rng.random() < 0.15 and not greedy else 1   # greedy takes n = 1 only
    max_tokens = rng.randint(1, 48)
    params = {"temperature": temperature, "max_tokens": max_tokens, "n": n}
    if top_k:
        params["top_k"] = top_k
    if top_p < 1.0:
        params["top_p"] = top_p
    if min_p:
        params["min_p"] = min_p
    if rng.random() < 0.3:
        params["seed"] = rng.randint(0, 2**31 - 1)
    if rng.random() < 0.2:
        params["repetition_penalty"] = round(rng.uniform(1.0, 1.5), 3)
    if rng.random() < 0.2:
        params["presence_penalty"] = round(rng.uniform(0.0, 1.0), 3)
    if rng.random() < 0.3:
        params["ignore_eos"] = True
    if greedy:
        mask_arg = rng.choice([None, False])
    else:
        mask_arg = rng.choices([True, None, False], weights=[7, 2, 1])[0]
    if not mask_server and mask_arg is True:
        mask_arg = None          # the off server refuses true; the same request otherwise
    truncated = bool(top_k or top_p < 1.0 or min_p)
    may_mask = mask_server and not greedy and (
        mask_arg is True or (mask_arg is None and truncated))
    # a size-limit error only for a request that asked: a null switch drops the mask
    may_be_wide = may_mask and not top_k and mask_arg is True
    abort_after_chunks = abort_after_s = None
    if rng.random() < abort_rate:
        if stream:
            abort_after_chunks = rng.randint(1, 4)
        else:
            abort_after_s = round(rng.uniform(0.05, 1.5), 3)

    if route == "generate":
        length = rng.randint(2, 40)
        body = {"model": model, "token_ids": [rng.randrange(3, vocab) for _ in range(length)],
                "sampling_params": params}
    else:
        body = {"model": model, "return_token_ids": True, **params}
        if route == "completions":
            body["prompt"] = rng.choice(PROMPTS)
        else:
            body["messages"] = [{"role": "user", "content": rng.choice(MESSAGES)}]
    if stream:
        body["stream"] = True
    if mask_arg is not None:
        body["return_sampling_mask"] = mask_arg
    return Plan(route, body, stream, mask_arg, may_be_wide, abort_after_chunks,
                abort_after_s)


# ---------------------------------------------------------------- checks


def check_choice(token_ids, mask, plan: Plan, mask_server: bool, vocab: int) -> list[str]:
    """The invariants of one completed choice; a list of violations."""
    if not mask_server or plan.mask_arg is False:
        return [] if mask is None else ["a mask on a request that asked for none"]
    if mask is None:
        return (["no mask though return_sampling_mask was true"]
                if plan.mask_arg is True and token_ids else [])
    if len(mask) != len(token_ids):
        return [f"{len(mask)} supports for {len(token_ids)} tokens"]
    problems = []
    for t, (token, support) in enumerate(zip(token_ids, mask)):
        if not support:
            problems.append(f"token {t}: empty support")
        elif token not in support:
            problems.append(f"token {t}: sampled {token} outside its support")
        elif any(a >= b for a, b in zip(support, support[1:])):
            problems.append(f"token {t}: ids not ascending and unique")
        elif support[0] < 0 or support[-1] >= vocab:
            problems.append(f"token {t}: ids outside the vocabulary [0, {vocab})")
    return problems


# ---------------------------------------------------------------- statistics


@dataclass
class Stats:
    requests: int = 0
    completed: int = 0
    aborted: int = 0
    aborted_streamed: int = 0      # closed after a few chunks
    aborted_full: int = 0          # not streamed, cancelled after a delay
    aborted_at_stop: int = 0       # in flight when the load stopped (end="abort")
    status_4xx: int = 0
    unexpected_4xx: int = 0        # a 4xx on a request that could not be too wide
    status_5xx: int = 0
    error_events: int = 0          # error events inside a 200 stream (4xx codes)
    connection_errors: int = 0
    mask_violations: int = 0
    missing_choices: int = 0       # a completed response with fewer than n choices
    tokens: int = 0
    masked_tokens: int = 0
    by_route: dict = field(default_factory=lambda: {r: 0 for r in ROUTES})
    latencies: list = field(default_factory=list)        # completed, seconds
    first_chunk: list = field(default_factory=list)      # streamed, seconds
    examples: list = field(default_factory=list)         # first violations / 5xx / 4xx

    def note(self, kind: str, plan: Plan, detail) -> None:
        if len(self.examples) < 20:
            self.examples.append({"kind": kind, "route": plan.route, "stream": plan.stream,
                                  "body": plan.body, "detail": str(detail)[:500]})


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ---------------------------------------------------------------- one request


async def run_one(session: aiohttp.ClientSession, base: str, plan: Plan, stats: Stats,
                  mask_server: bool, vocab: int) -> None:
    stats.requests += 1
    stats.by_route[plan.route] += 1
    start = time.perf_counter()
    try:
        if plan.stream:
            await _streamed(session, base, plan, stats, mask_server, vocab, start)
        elif plan.abort_after_s is not None:
            try:
                await asyncio.wait_for(
                    _full(session, base, plan, stats, mask_server, vocab, start),
                    plan.abort_after_s)
            except asyncio.TimeoutError:
                stats.aborted += 1
                stats.aborted_full += 1
        else:
            await _full(session, base, plan, stats, mask_server, vocab, start)
    except asyncio.CancelledError:   # the load stopped with this request in flight
        stats.aborted += 1
        stats.aborted_at_stop += 1
        raise
    except (aiohttp.ClientError, ConnectionError) as exc:
        stats.connection_errors += 1
        stats.note("connection", plan, repr(exc))


def _count_error(code: int, what: str, detail, plan: Plan, stats: Stats,
                 client_error: str) -> None:
    """Count an error answer (an HTTP status or a stream's error event): a 5xx, or a
    4xx counted under `client_error`, unexpected unless the request may be wide."""
    if code >= 500:
        stats.status_5xx += 1
        stats.note(f"{what} {code}", plan, detail)
        return
    setattr(stats, client_error, getattr(stats, client_error) + 1)
    if not plan.may_be_wide:
        stats.unexpected_4xx += 1
        stats.note(f"{what} {code}", plan, detail)


def _status(resp_status: int, text, plan: Plan, stats: Stats) -> bool:
    """Count a non-200 answer; True if the request is done."""
    if resp_status == 200:
        return False
    _count_error(resp_status, "http", text, plan, stats, "status_4xx")
    return True


def _tokens_and_mask(choice: dict):
    return choice.get("token_ids") or [], choice.get("sampling_mask")


def _record(stats: Stats, plan: Plan, choices: dict, mask_server: bool, vocab: int,
            latency: float) -> None:
    """A completed request: check each choice, count tokens, keep the latency."""
    stats.completed += 1
    stats.latencies.append(latency)
    n = plan.body.get("n", plan.body.get("sampling_params", {}).get("n", 1))
    if sorted(choices) != list(range(n)):
        stats.missing_choices += 1
        stats.note("choices", plan, f"choices {sorted(choices)} for n = {n}")
    for index, (tokens, mask) in choices.items():
        stats.tokens += len(tokens)
        if mask is not None:
            stats.masked_tokens += len(mask)
        for problem in check_choice(tokens, mask, plan, mask_server, vocab):
            stats.mask_violations += 1
            stats.note("mask", plan, f"choice {index}: {problem}")


async def _full(session, base, plan: Plan, stats: Stats, mask_server, vocab, start):
    async with session.post(base + PATHS[plan.route], json=plan.body) as resp:
        text = await resp.text()
        if _status(resp.status, text, plan, stats):
            return
    data = json.loads(text)
    choices = {c["index"]: _tokens_and_mask(c) for c in data["choices"]}
    _record(stats, plan, choices, mask_server, vocab, time.perf_counter() - start)


async def _streamed(session, base, plan: Plan, stats: Stats, mask_server, vocab, start):
    joined: dict[int, tuple[list, list | None]] = {}
    dropped: set[int] = set()   # choices whose mask stopped (sampling_mask_reason)
    events = 0
    errored = False
    async with session.post(base + PATHS[plan.route], json=plan.body) as resp:
        if resp.status != 200:
            _status(resp.status, await resp.text(), plan, stats)
            return
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[len(b"data: "):]
            if payload == b"[DONE]":
                if not errored:
                    _record(stats, plan, joined, mask_server, vocab,
                            time.perf_counter() - start)
                return
            chunk = json.loads(payload)
            if events == 0:
                stats.first_chunk.append(time.perf_counter() - start)
            events += 1
            if "error" in chunk and "choices" not in chunk:
                errored = True     # [DONE] follows; the request did not complete
                _count_error(chunk["error"].get("code") or 500, "error event", chunk, plan,
                             stats, "error_events")
                continue
            for c in chunk.get("choices") or []:
                tokens, mask = _tokens_and_mask(c)
                have_tokens, have_mask = joined.setdefault(c["index"], ([], None))
                have_tokens.extend(tokens)
                if c.get("sampling_mask_reason"):
                    # switch null, mask dropped from here on: the choice has none
                    dropped.add(c["index"])
                    joined[c["index"]] = (have_tokens, None)
                elif mask is not None and c["index"] not in dropped:
                    joined[c["index"]] = (have_tokens, (have_mask or []) + mask)
            if plan.abort_after_chunks is not None and events >= plan.abort_after_chunks:
                resp.close()       # the client goes away mid-stream
                stats.aborted += 1
                stats.aborted_streamed += 1
                return
    # the server ended the stream without [DONE]
    stats.connection_errors += 1
    stats.note("stream", plan, "ended without [DONE]")


# ---------------------------------------------------------------- the server


async def get_state(session: aiohttp.ClientSession, base: str) -> dict | None:
    async with session.get(base + STATE_PATH) as resp:
        if resp.status != 200:
            return None
        return await resp.json()


async def served_model(session, base: str) -> str:
    async with session.get(base + "/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


def server_pid(base: str) -> int | None:
    """The pid listening on the loopback port of `base` (None if not visible)."""
    import psutil
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def tree_rss_by_process(pid: int | None) -> dict[str, int] | None:
    """Resident memory (bytes) of a process and each of its descendants, by
    "name[pid]" (vLLM names its processes: VLLM::EngineCore, VLLM::Worker)."""
    if pid is None:
        return None
    import psutil
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    rss = {}
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            rss[f"{p.name()}[{p.pid}]"] = p.memory_info().rss
    return rss


def tree_rss(pid: int | None) -> int | None:
    """Resident memory of a process and all its descendants, in bytes."""
    by_process = tree_rss_by_process(pid)
    return None if by_process is None else sum(by_process.values())


# ---------------------------------------------------------------- one phase


async def run_phase(base: str, *, duration: float, clients: int, mask_server: bool,
                    seed: int = 0, abort_rate: float = 0.15, mask_limit: int = 4096,
                    vocab: int | None = None, warmup: float | None = None,
                    settle_timeout: float = 30.0, end: str = "abort", grace: float = 60.0,
                    progress: float = 10.0, measure_rss: bool = True,
                    log=print) -> dict:
    """Drive `clients` concurrent clients for `duration` s; returns the phase's report.

    `warmup` (default: a sixth of the duration, at most 20 s) is when the baseline RSS
    is taken. After `duration`, no new request starts; `end="abort"` cancels the
    requests in flight at once (every client disconnects; counted as aborted),
    `end="drain"` gives them `grace` seconds first. Then the state route is polled
    until its total is 0 or `settle_timeout` passes."""
    if end not in ("abort", "drain"):
        raise ValueError(f"end must be 'abort' or 'drain', not {end!r}")
    vocab = vocab or demo_vocab_size()
    warmup = min(20.0, duration / 6) if warmup is None else warmup
    stats = Stats()
    pid = server_pid(base) if measure_rss else None
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = await served_model(session, base)
        state_route = await get_state(session, base) is not None
        t0 = time.perf_counter()
        stop_at = t0 + duration
        busiest_state = 0

        async def client(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.perf_counter() < stop_at:
                plan = make_plan(rng, model, mask_server, vocab, mask_limit, abort_rate)
                await run_one(session, base, plan, stats, mask_server, vocab)

        tasks = [asyncio.create_task(client(i)) for i in range(clients)]
        rss_base = rss_peak = rss_base_by_process = None
        rss_samples = []    # (seconds, MiB) at each progress line
        next_report = t0 + progress
        base_at = t0 + warmup
        while time.perf_counter() < stop_at:
            await asyncio.sleep(min(1.0, max(0.0, stop_at - time.perf_counter())))
            now = time.perf_counter()
            if measure_rss:
                rss = tree_rss(pid)
                if rss_base is None and now >= base_at:
                    rss_base_by_process = tree_rss_by_process(pid)
                    rss_base = rss
                if rss is not None and rss_base is not None:
                    rss_peak = max(rss_peak or 0, rss)
            if now >= next_report:
                next_report += progress
                if measure_rss and rss:
                    rss_samples.append((round(now - t0), round(rss / 2**20)))
                if state_route:
                    busy = await get_state(session, base)
                    busiest_state = max(busiest_state, busy["total"] if busy else 0)
                log(f"  [{now - t0:5.0f}s] requests {stats.requests}  completed "
                    f"{stats.completed}  aborted {stats.aborted}  4xx {stats.status_4xx}"
                    f"+{stats.error_events}ev  5xx {stats.status_5xx}  conn "
                    f"{stats.connection_errors}  violations {stats.mask_violations}  "
                    f"missing choices {stats.missing_choices}  "
                    f"tokens {stats.tokens}" + (f"  rss {rss / 2**20:.0f} MiB"
                                                if measure_rss and rss else ""))
        load_s = time.perf_counter() - t0
        done, pending = await asyncio.wait(tasks, timeout=grace if end == "drain" else 0)
        for task in pending:
            task.cancel()   # run_one counts the request it was in as aborted
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        drained_s = time.perf_counter() - t0

        state, settled_s = None, None
        if state_route:
            settle_start = time.perf_counter()
            while True:
                state = await get_state(session, base)
                if state["total"] == 0 or time.perf_counter() - settle_start > settle_timeout:
                    break
                await asyncio.sleep(0.5)
            settled_s = round(time.perf_counter() - settle_start, 2)
        rss_end_by_process = tree_rss_by_process(pid) if measure_rss else None
        rss_end = None if rss_end_by_process is None else sum(rss_end_by_process.values())

    lat = stats.latencies
    report = {k: v for k, v in asdict(stats).items()
              if k not in ("latencies", "first_chunk")}
    report.update({
        "mask_server": mask_server, "clients": clients, "duration_s": duration,
        "end": end,
        "load_s": round(load_s, 1), "drained_s": round(drained_s, 1),
        "requests_per_s": round(stats.requests / load_s, 2),
        "tokens_per_s": round(stats.tokens / load_s, 1),
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
        "latency_mean_s": statistics.fmean(lat) if lat else None,
        "first_chunk_p50_s": percentile(stats.first_chunk, 50),
        "first_chunk_p99_s": percentile(stats.first_chunk, 99),
        "server_pid": pid, "rss_after_warmup": rss_base, "rss_peak": rss_peak,
        "rss_end": rss_end,
        "rss_mib_samples": rss_samples,
        "rss_mib_by_process": None if not (rss_base_by_process and rss_end_by_process) else {
            name: [round(rss_base_by_process.get(name, 0) / 2**20, 1),
                   round(end / 2**20, 1)] for name, end in rss_end_by_process.items()},
        "rss_growth_pct": (round(100 * (rss_end - rss_base) / rss_base, 2)
                           if rss_base and rss_end else None),
        "state_route": state_route, "state_busiest_total": busiest_state,
        "state_after": state, "state_settle_s": settled_s,
    })
    return report


def demo_vocab_size() -> int:
    from vllm_sampling_mask import DEMO_MODEL
    with open(os.path.join(DEMO_MODEL, "config.json")) as f:
        return json.load(f)["vocab_size"]


# ---------------------------------------------------------------- the report


ROWS = [("requests", "requests"), ("completed", "completed"), ("aborted", "aborted"),
        ("  mid-stream", "aborted_streamed"), ("  mid-request", "aborted_full"),
        ("  at the stop", "aborted_at_stop"),
        ("4xx (+ error events)", None), ("unexpected 4xx", "unexpected_4xx"),
        ("5xx (goal 0)", "status_5xx"), ("connection errors", "connection_errors"),
        ("mask violations (goal 0)", "mask_violations"),
        ("responses missing choices (goal 0)", "missing_choices"), ("tokens", "tokens"),
        ("masked tokens", "masked_tokens"), ("requests/s", "requests_per_s"),
        ("tokens/s", "tokens_per_s"), ("latency p50 (s)", "latency_p50_s"),
        ("latency p99 (s)", "latency_p99_s"), ("first chunk p50 (s)", "first_chunk_p50_s"),
        ("first chunk p99 (s)", "first_chunk_p99_s"), ("RSS after warm-up (MiB)", None),
        ("RSS end (MiB)", None), ("RSS growth % (goal < 5)", "rss_growth_pct"),
        ("state total after (goal 0)", None), ("state settle (s)", "state_settle_s")]


def _cell(report: dict, label: str, key: str | None) -> str:
    if key is None:
        if label.startswith("4xx"):
            return f"{report['status_4xx']} + {report['error_events']}"
        if label.startswith("RSS"):
            v = report["rss_after_warmup" if "warm" in label else "rss_end"]
            return "-" if v is None else f"{v / 2**20:.0f}"
        if label.startswith("state total"):
            return "-" if report["state_after"] is None else str(report["state_after"]["total"])
    v = report[key]
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def table(phases: dict[str, dict]) -> str:
    names = list(phases)
    width = max(len(label) for label, _ in ROWS)
    lines = [f"{'':{width}}  " + "  ".join(f"{'mask ' + n:>12}" for n in names)]
    for label, key in ROWS:
        lines.append(f"{label:{width}}  " + "  ".join(
            f"{_cell(phases[n], label, key):>12}" for n in names))
    return "\n".join(lines)


def goals_met(report: dict) -> bool:
    state_ok = report["state_after"] is None or report["state_after"]["total"] == 0
    rss_ok = report["rss_growth_pct"] is None or report["rss_growth_pct"] < 5
    return (report["status_5xx"] == 0 and report["mask_violations"] == 0
            and report["connection_errors"] == 0 and report["unexpected_4xx"] == 0
            and report["missing_choices"] == 0
            and state_ok and rss_ok)


# ---------------------------------------------------------------- main


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load per phase")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--phases", default="on,off",
                    help="which servers to start, in order: on, off or both")
    ap.add_argument("--server", help="use this running server (one phase) instead")
    ap.add_argument("--server-mask", choices=("on", "off"), default="on",
                    help="whether --server runs with --return-sampling-mask")
    ap.add_argument("--mask-limit", type=int, default=4096,
                    help="the server's --max-sampling-mask-size (top-k stays below it)")
    ap.add_argument("--abort-rate", type=float, default=0.15)
    ap.add_argument("--end", choices=("abort", "drain"), default="abort",
                    help="when the time is up: disconnect every client at once, or "
                    "let the requests in flight finish first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runner", choices=("v1", "mrv2"), default=None,
                    help="force the server's model runner (default: vLLM's choice)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()

    phases: dict[str, dict] = {}

    def run(name: str, base: str) -> None:
        print(f"phase mask {name}: {args.clients} clients for {args.duration:.0f} s "
              f"against {base}", flush=True)
        phases[name] = asyncio.run(run_phase(
            base, duration=args.duration, clients=args.clients,
            mask_server=name == "on", seed=args.seed, abort_rate=args.abort_rate,
            mask_limit=args.mask_limit, end=args.end,
            log=lambda s: print(s, flush=True)))
        r = phases[name]
        print(f"  done: {r['completed']} completed, {r['aborted']} aborted, state after "
              f"{r['state_after'] and r['state_after']['total']}", flush=True)

    if args.server:
        run(args.server_mask, args.server.rstrip("/"))
    else:
        from vllm_sampling_mask.tools.demo import serving
        for name in args.phases.split(","):
            port = free_port()
            log_path = os.path.join(tempfile.gettempdir(), f"soak-serve-{name}-{port}.log")
            print(f"starting the mask-{name} server on port {port} (log: {log_path})",
                  flush=True)
            with serving(port, log_path, runner=args.runner, mask=name == "on",
                         env={"VLLM_SAMPLING_MASK_DEBUG_STATE": "1"}) as base:
                run(name, base)

    print()
    print(table(phases))
    for name, r in phases.items():
        if r["examples"]:
            print(f"\nfirst notable events, mask {name}:")
            for e in r["examples"][:5]:
                print("  ", json.dumps(e)[:400])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "phases": phases}, f, indent=1)
        print(f"\nwrote {args.json}")
    ok = all(goals_met(r) for r in phases.values())
    print("\ngoals met" if ok else "\ngoals NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
