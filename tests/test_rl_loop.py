"""Masks through the RL loop's pause and resume (`/pause`, `/resume`, `/is_paused`,
vLLM's RL routes, served with VLLM_SERVER_DEV_MODE=1), on the V1 runner.

A trainer pauses the engine between or during rollouts. Here one seeded streamed
request is paused mid-generation in each of upstream's three modes:

- `keep`: the request is frozen (no chunk while paused) and resumes where it was;
  its tokens and masks equal the same seeded request run without a pause, one
  mask per token, nothing lost or doubled;
- `abort`: the request ends (finish reason "abort") with the masks of the tokens
  it got, aligned;
- `wait`: the request runs to its end before the pause returns, with its masks.

After each, the server keeps serving and no per-request mask state is left behind.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from conftest import free_port

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.demo import serving

TOKENS = 96


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-rl") / "vllm-serve.log"
    with serving(free_port(), str(log), runner="v1",
                 env={"VLLM_SERVER_DEV_MODE": "1",
                      "VLLM_SAMPLING_MASK_DEBUG_STATE": "1"}) as base:
        yield base


def body(seed: int) -> dict:
    return {"model": DEMO_MODEL, "prompt": "def f(x):\n    ", "max_tokens": TOKENS,
            "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": seed,
            "ignore_eos": True, "return_token_ids": True, "stream": True}


class Stream:
    """One streamed /v1/completions request read on a thread: its chunks (token
    ids, masks, finish reason) and the time each arrived."""

    def __init__(self, base: str, seed: int) -> None:
        self.chunks: list[tuple[float, list[int], SamplingMask, str | None]] = []
        self.error = None
        self._thread = threading.Thread(target=self._read, args=(base, seed), daemon=True)
        self._thread.start()

    def _read(self, base: str, seed: int) -> None:
        try:
            with requests.post(base + "/v1/completions", json=body(seed), stream=True,
                               timeout=600) as r:
                assert r.status_code == 200, r.text[:300]
                for line in r.iter_lines(decode_unicode=True):
                    if not line.startswith("data: {"):
                        continue
                    part = json.loads(line[len("data: "):])
                    for choice in part["choices"]:
                        self.chunks.append((time.monotonic(), choice.get("token_ids") or [],
                                            SamplingMask.from_response(part),
                                            choice.get("finish_reason")))
        except Exception as exc:   # reported by the test, not lost on the thread
            self.error = exc

    def wait_for_tokens(self, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.tokens() < n and self._thread.is_alive():
            assert time.monotonic() < deadline, "the stream stalled"
            time.sleep(0.02)

    def tokens(self) -> int:
        return sum(len(ids) for _, ids, _, _ in self.chunks)

    def join(self) -> tuple[list[int], list[list[int]], str | None]:
        self._thread.join(600)
        assert self.error is None, self.error
        ids = [t for _, chunk, _, _ in self.chunks for t in chunk]
        masks = [s for _, _, mask, _ in self.chunks for s in mask.token_ids]
        finish = next((f for *_, f in reversed(self.chunks) if f), None)
        for token, support in zip(ids, masks):
            assert token in support
        assert len(masks) == len(ids)
        return ids, masks, finish


def post(base: str, path: str, **params) -> dict:
    r = requests.post(base + path, params=params, timeout=600)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def paused(base: str) -> bool:
    r = requests.get(base + "/is_paused", timeout=60)
    assert r.status_code == 200, r.text[:300]
    return r.json()["is_paused"]


def no_state_left(base: str) -> None:
    """Every layer's per-request count (the state route's `total`) is back to 0
    (an aborted request's state goes a moment after its last chunk)."""
    deadline = time.monotonic() + 30
    while True:
        r = requests.get(base + "/debug/sampling_mask/state", timeout=60)
        assert r.status_code == 200, r.text[:300]
        state = r.json()
        if state["total"] == 0:
            return
        assert time.monotonic() < deadline, state
        time.sleep(0.25)


def test_keep_freezes_and_resumes_with_the_same_tokens_and_masks(server):
    want_ids, want_masks, finish = Stream(server, seed=11).join()
    assert finish == "length" and len(want_ids) == TOKENS
    stream = Stream(server, seed=11)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="keep")
    assert paused(server)
    frozen_at, frozen = time.monotonic(), stream.tokens()
    time.sleep(1.5)
    assert stream.tokens() == frozen < TOKENS      # nothing generated while paused
    post(server, "/resume")
    assert not paused(server)
    ids, masks, finish = stream.join()
    assert finish == "length"
    assert ids == want_ids and masks == want_masks
    assert any(t > frozen_at + 1.5 for t, *_ in stream.chunks)   # it went on after
    no_state_left(server)


def test_abort_ends_a_request_with_the_masks_it_got(server):
    stream = Stream(server, seed=12)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="abort")
    ids, masks, finish = stream.join()
    post(server, "/resume")
    assert finish == "abort" and 8 <= len(ids) < TOKENS and len(masks) == len(ids)
    no_state_left(server)
    after, _, finish = Stream(server, seed=13).join()     # and the server serves on
    assert finish == "length" and len(after) == TOKENS


def test_wait_lets_a_request_finish_with_its_masks(server):
    stream = Stream(server, seed=14)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="wait")
    assert stream.tokens() == TOKENS        # the pause returned once it had finished
    post(server, "/resume")
    ids, masks, finish = stream.join()
    assert finish == "length" and len(ids) == len(masks) == TOKENS
    no_state_left(server)
