"""Helpers for tests that drive a dev-mode `vllm serve` (vLLM's RL routes:
`/pause`, `/resume`, `/is_paused`) with the state route on
(VLLM_SAMPLING_MASK_DEBUG_STATE=1): one seeded streamed request read on a thread,
the routes, and the check that no per-request mask state is left."""

from __future__ import annotations

import json
import threading
import time

import requests

from vllm_sampling_mask import DEMO_MODEL, SamplingMask

TOKENS = 96


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
