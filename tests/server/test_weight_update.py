"""Masks across weight updates while rollouts are in flight (vLLM's RL routes, served
with VLLM_SERVER_DEV_MODE=1), on both runners (Model Runner V2 through Triton's
interpreter, marked `mrv2`), on `/inference/v1/generate`.

The update path a CPU host runs: `POST /pause`, `POST /collective_rpc` with
`reload_weights` from a checkpoint (`weights_path`), `POST /update_weight_version`,
`POST /resume`. The new weights are a perturbed copy of the demo model
(`demo.perturbed_draft`), far enough from it that their supports differ on the
test's requests (asserted: every check below could fail). Each mask is checked
against an independent transformers reference of the weights and KV cache that
produced its token:

- `/pause?mode=keep&clear_cache=false`: the requests in flight keep the KV they
  cached under the old weights; their tokens before the update match the old model,
  those after it the new model run over the old model's KV of the prefix, and
  `weight_versions` splits at that index (derived from the spans, checked by the
  references on both sides), for each choice of an n = 2 request, streamed and not;
- a new request with the same prompt after that update hits the prefix cache's
  old-weight blocks (its masks follow the old KV there); after `/reset_prefix_cache`
  its masks are the new weights' alone, and its spans one span of the new version;
- `/pause?mode=keep` (upstream's default `clear_cache=true`): the pause resets the
  prefix cache with the running requests, which are preempted and recompute their
  whole prefix under the weights loaded when they resume;
- `/pause?mode=abort`: each aborted choice (n = 2, streamed and not) has spans
  covering exactly its tokens and masks.

On a CPU host the new-weight checks pass thanks to the `cpu_reload_tied_lm_head` fix
(without it the demo model's tied LM head kept multiplying by the old weights, on
either runner). The
keep test also runs docs/rl_recipes.md's `by_version` sketch on its response.
After each, no per-request mask state is left in any process (the state route).
Needs vLLM 0.32 (`CompletionOutput.weight_versions`); the weight-transfer backends
(NCCL, IPC) are GPU-only and not run here.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
import torch
from conftest import free_port, host_env, reference_support, skip_without_v1_runner
from test_examples import _sketch
from rl_http import no_state_left, paused, post

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import perturbed_draft, serving

if not hasattr(pytest.importorskip("vllm.outputs"), "WeightVersionSpan"):
    pytest.skip("this vLLM release (0.24.0-0.31.0) has no weight_versions spans "
                "(CompletionOutput.weight_versions is new in 0.32.0)",
                allow_module_level=True)

TOKENS = 40
BLOCK = 32      # the server's --block-size: the prompt fills one block, not two
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}
PROMPT = ("import os\nimport sys\n\n\nclass Parser:\n    def __init__(self, path):\n"
          "        self.path = path\n        self.lines = []\n\n    def read(self):\n"
          "        with open(self.path) as f:\n            for line in f:\n")


@pytest.fixture(scope="module")
def new_weights(tmp_path_factory):
    """A checkpoint of the demo model with noise of 0.3 times each matrix's spread."""
    return perturbed_draft(str(tmp_path_factory.mktemp("new-weights") / "model"), noise=0.3)


@pytest.fixture(scope="module", params=[
    "v1", pytest.param("mrv2", marks=pytest.mark.mrv2)])
def server(request, tmp_path_factory):
    """One dev-mode server per runner (Model Runner V2 on a CPU host through Triton's
    interpreter); each runs the tests below in order. The V1 runner's is skipped where
    the release has none (0.34)."""
    if request.param == "v1":
        skip_without_v1_runner()
    log = tmp_path_factory.mktemp(f"serve-weights-{request.param}") / "vllm-serve.log"
    with serving(free_port(), str(log), runner=request.param,
                 extra=["--block-size", str(BLOCK)],
                 env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_SAMPLING_MASK_DEBUG_STATE": "1",
                      **host_env()}) as base:
        yield base


@pytest.fixture(scope="module")
def models(hf_model, new_weights):
    """The transformers reference of each checkpoint, float32."""
    from transformers import AutoModelForCausalLM
    new = AutoModelForCausalLM.from_pretrained(new_weights, dtype=torch.float32).eval()
    return {"old": hf_model, "new": new}


@pytest.fixture(scope="module")
def prompt(tokenizer):
    ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert BLOCK < len(ids) < 2 * BLOCK
    return ids


def body(prompt_ids, seed, n=1, stream=False, max_tokens=TOKENS) -> dict:
    return {"model": DEMO_MODEL, "token_ids": prompt_ids, "stream": stream,
            "sampling_params": {**SAMPLING, "seed": seed, "n": n, "max_tokens": max_tokens,
                                "ignore_eos": True, "logprobs": 0}}


class Rollout:
    """One /inference/v1/generate request read on a thread: per choice, its token
    ids, masks, finish reason and `weight_versions` (a stream's come on its final
    chunk); `tokens()` counts a stream's tokens so far."""

    def __init__(self, base: str, request: dict) -> None:
        self.choices: dict[int, dict] = {}
        self.response: dict | None = None      # the JSON of a request not streamed
        self.error = None
        self._thread = threading.Thread(target=self._read, args=(base, request), daemon=True)
        self._thread.start()

    def _choice(self, index: int) -> dict:
        return self.choices.setdefault(index, {"token_ids": [], "masks": [], "finish": None,
                                               "weight_versions": None})

    def _take(self, choice: dict) -> None:
        c = self._choice(choice["index"])
        ids, masks = choice.get("token_ids") or [], choice.get("sampling_mask") or []
        assert len(masks) == len(ids), choice   # each chunk: one mask per token
        c["token_ids"] += ids
        c["masks"] += masks
        if choice.get("finish_reason"):
            c["finish"] = choice["finish_reason"]
        if choice.get("weight_versions") is not None:
            assert c["weight_versions"] is None, "two chunks carried weight_versions"
            c["weight_versions"] = choice["weight_versions"]

    def _read(self, base: str, request: dict) -> None:
        try:
            with requests.post(base + "/inference/v1/generate", json=request,
                               stream=request["stream"], timeout=600) as r:
                assert r.status_code == 200, r.text[:300]
                if not request["stream"]:
                    self.response = r.json()
                    for choice in self.response["choices"]:
                        self._take(choice)
                    return
                for line in r.iter_lines(decode_unicode=True):
                    if line.startswith("data: {"):
                        for choice in json.loads(line[len("data: "):])["choices"]:
                            self._take(choice)
        except Exception as exc:   # reported by the test, not lost on the thread
            self.error = exc

    def tokens(self) -> int:
        return sum(len(c["token_ids"]) for c in list(self.choices.values()))

    def wait_for_tokens(self, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.tokens() < n and self._thread.is_alive():
            assert time.monotonic() < deadline, "the stream stalled"
            time.sleep(0.01)

    def join(self) -> list[dict]:
        self._thread.join(600)
        assert self.error is None, self.error
        out = [self.choices[i] for i in sorted(self.choices)]
        for c in out:
            assert len(c["masks"]) == len(c["token_ids"])
            for token, support in zip(c["token_ids"], c["masks"]):
                assert token in support
            assert_spans_cover(c)
        return out


def assert_spans_cover(choice: dict) -> None:
    """`weight_versions` spans are contiguous, non-empty, and cover exactly the
    choice's tokens (and so its masks), version changing at each boundary."""
    spans = choice["weight_versions"]
    assert spans, choice
    assert spans[0]["start"] == 0 and spans[-1]["end"] == len(choice["token_ids"])
    assert all(s["start"] < s["end"] for s in spans)
    assert all(a["end"] == b["start"] and a["version"] != b["version"]
               for a, b in zip(spans, spans[1:]))


def update_weights(base: str, path: str, version: str, **pause) -> None:
    """The update a CPU host runs: pause, reload from a checkpoint, bump the version,
    resume."""
    post(base, "/pause", **pause)
    assert paused(base)
    r = requests.post(base + "/collective_rpc", timeout=600,
                      json={"method": "reload_weights", "kwargs": {"weights_path": path}})
    assert r.status_code == 200, r.text[:300]
    r = requests.post(base + "/update_weight_version", json={"new_version": version},
                      timeout=60)
    assert r.status_code == 200, r.text[:300]
    post(base, "/resume")
    r = requests.get(base + "/weight_info", timeout=60)
    assert r.json() == {"weight_version": version}


@torch.no_grad()
def logits(model, prompt_ids, token_ids, cache_from=None, cached: int = 0) -> torch.Tensor:
    """Float32 logits [T, V] at the positions that produced `token_ids`, from `model`;
    with `cache_from`, the first `cached` positions of prompt + tokens are run through
    that model instead and reach `model` as its KV cache (`past_key_values`)."""
    seq = list(prompt_ids) + list(token_ids)
    p, rows = len(prompt_ids), []
    past = None
    if cache_from is not None and cached > 0:
        out = cache_from(input_ids=torch.tensor([seq[:cached]]), use_cache=True)
        past, rows = out.past_key_values, [out.logits[0]]
    out = model(input_ids=torch.tensor([seq[cached:]]), past_key_values=past,
                use_cache=past is not None)
    every = torch.cat(rows + [out.logits[0]]).float()    # row i: after seq[:i + 1]
    return every[p - 1: p - 1 + len(token_ids)]


def agrees(masks, rows: torch.Tensor) -> list[bool]:
    """Per token: its support holds every id the reference surely keeps and none it
    surely drops (`reference_support`)."""
    out = []
    for support, row in zip(masks, rows):
        surely_in, surely_out = reference_support(row, **SAMPLING)
        got = set(support)
        out.append(surely_in <= got and not (got & surely_out))
    return out


def the_split(choice: dict, old: str, new: str) -> int:
    """The output index where `choice`'s spans go from `old` to `new` (two spans)."""
    spans = choice["weight_versions"]
    assert [s["version"] for s in spans] == [old, new], spans
    k = spans[1]["start"]
    assert 0 < k < len(choice["token_ids"])
    return k


def test_keep_with_its_kv_masks_follow_the_weights_and_kv_of_each_token(
        server, models, prompt, new_weights):
    update_weights(server, DEMO_MODEL, "v0", mode="abort")   # the start, labelled
    group = Rollout(server, body(prompt, seed=5, n=2))
    stream = Rollout(server, body(prompt, seed=7, n=2, stream=True))
    stream.wait_for_tokens(16)
    update_weights(server, new_weights, "v1", mode="keep", clear_cache="false")
    old, new = models["old"], models["new"]
    choices = stream.join() + group.join()
    assert len(choices) == 4
    for c in choices:
        assert c["finish"] == "length" and len(c["token_ids"]) == TOKENS
        ids, masks = c["token_ids"], c["masks"]
        k = the_split(c, "v0", "v1")
        # before k: the old weights; from k: the new weights over the old weights' KV
        # of the prefix (the token at k - 1 is the first the new weights ran)
        on_old = logits(old, prompt, ids)
        before = agrees(masks[:k], on_old[:k])
        after = agrees(masks[k:], logits(new, prompt, ids, cache_from=old,
                                         cached=len(prompt) + k - 1)[k:])
        assert all(before) and all(after), (k, before, after)
        # neither the old weights nor the new ones from scratch explain the tokens after k
        assert not all(agrees(masks[k:], on_old[k:]))
        assert not all(agrees(masks[k:], logits(new, prompt, ids)[k:]))
    no_state_left(server)

    # docs/rl_recipes.md's `by_version` on the response: each segment with its masks
    scope: dict = {}
    exec(compile(_sketch("def by_version"), "rl_recipes:by_version", "exec"), scope)
    for choice in group.response["choices"]:
        segments = scope["by_version"](choice)
        k = choice["weight_versions"][1]["start"]
        assert [(v, len(ids), len(masks), len(lps)) for v, ids, masks, lps in segments] == [
            ("v0", k, k, k), ("v1", TOKENS - k, TOKENS - k, TOKENS - k)]
        assert [t for _, ids, _, _ in segments for t in ids] == choice["token_ids"]
        assert [m for _, _, masks, _ in segments for m in masks] == choice["sampling_mask"]


def test_a_new_request_needs_the_prefix_cache_reset_after_an_update(server, models, prompt):
    """After the keep update above, the prefix cache still holds the prompt's first
    block as the old weights computed it."""
    old, new = models["old"], models["new"]
    stale, = Rollout(server, body(prompt, seed=9)).join()
    assert stale["weight_versions"] == [{"version": "v1", "start": 0, "end": TOKENS}]
    ids = stale["token_ids"]
    assert all(agrees(stale["masks"], logits(new, prompt, ids, cache_from=old, cached=BLOCK)))
    assert not all(agrees(stale["masks"], logits(new, prompt, ids)))

    assert post(server, "/reset_prefix_cache") == {"success": True}
    fresh, = Rollout(server, body(prompt, seed=9)).join()
    assert fresh["weight_versions"] == [{"version": "v1", "start": 0, "end": TOKENS}]
    ids = fresh["token_ids"]
    assert all(agrees(fresh["masks"], logits(new, prompt, ids)))
    assert not all(agrees(fresh["masks"], logits(new, prompt, ids, cache_from=old,
                                                 cached=BLOCK)))
    no_state_left(server)


def test_keep_with_the_cache_cleared_recomputes_the_prefix_under_the_new_weights(
        server, models, prompt):
    """`/pause?mode=keep` with upstream's default `clear_cache=true`: the running
    request is preempted when the pause resets the cache and resumes by recomputing
    prompt + tokens under the weights loaded by then (here the demo model again)."""
    old, new = models["old"], models["new"]
    stream = Rollout(server, body(prompt, seed=11, stream=True))
    stream.wait_for_tokens(8)
    update_weights(server, DEMO_MODEL, "v2", mode="keep")
    c, = stream.join()
    assert c["finish"] == "length" and len(c["token_ids"]) == TOKENS
    ids, masks = c["token_ids"], c["masks"]
    k = the_split(c, "v1", "v2")
    assert all(agrees(masks[:k], logits(new, prompt, ids)[:k]))
    assert all(agrees(masks[k:], logits(old, prompt, ids)[k:]))
    assert not all(agrees(masks[k:], logits(old, prompt, ids, cache_from=new,
                                            cached=len(prompt) + k - 1)[k:]))
    no_state_left(server)


def test_aborted_choices_carry_spans_over_exactly_their_tokens(server, prompt):
    group = Rollout(server, body(prompt, seed=13, n=2, max_tokens=4 * TOKENS))
    stream = Rollout(server, body(prompt, seed=15, n=2, stream=True, max_tokens=4 * TOKENS))
    stream.wait_for_tokens(16)
    post(server, "/pause", mode="abort")
    choices = stream.join() + group.join()
    post(server, "/resume")
    assert len(choices) == 4
    for c in choices:
        assert c["finish"] == "abort" and 0 < len(c["token_ids"]) < 4 * TOKENS
        assert c["weight_versions"] == [{"version": "v2", "start": 0,
                                         "end": len(c["token_ids"])}]
    no_state_left(server)
