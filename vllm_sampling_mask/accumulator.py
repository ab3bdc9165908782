"""Per-request accumulation of supports in the output processor.

Plain module (numpy). Supports arrive a few tokens at a time (one engine-core
output per step); appending is amortised O(new ids), and any span of tokens is
returned as a `SamplingMask` without copying the ids.

A request that never asked for its mask (switch null) may lose it at a step the
mask cannot describe (`stop`): from that token on there is no mask, only the
reason, and any span reaching past it has none either (`mask` returns None; never
a partial list). Later tokens are only counted (`skip`).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.sampling_mask import SamplingMask


class MaskAccumulator:
    """`with_logprobs`: the request asked for support logprobs; each `append`
    then carries them (float32 aligned with the ids, and log S per token)."""

    def __init__(self, with_logprobs: bool = False) -> None:
        self._ids = np.empty(256, dtype=np.int32)
        self._offsets = np.zeros(64, dtype=np.int64)
        self._tokens = 0
        self.with_logprobs = with_logprobs
        self._logprobs = np.empty(256 if with_logprobs else 0, dtype=np.float32)
        self._log_kept = np.empty(64 if with_logprobs else 0, dtype=np.float32)
        self.reason: str | None = None   # why the mask stopped (None: it did not)
        self._unmasked = 0               # tokens counted after the stop

    def __len__(self) -> int:
        """Tokens so far, those after a stop included."""
        return self._tokens + self._unmasked

    @property
    def stopped_at(self) -> int | None:
        """The first token without a mask, or None while every token has one."""
        return None if self.reason is None else self._tokens

    def stop(self, reason: str) -> None:
        """No mask from the next token on (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason

    def skip(self, n: int) -> None:
        """Count `n` tokens that carry no mask (after `stop`)."""
        if self.reason is None:
            raise ValueError("MaskAccumulator.skip: the mask has not stopped")
        self._unmasked += n

    def append(self, ids: np.ndarray, counts: np.ndarray, logprobs: np.ndarray | None = None,
               log_kept: np.ndarray | None = None) -> None:
        """Add the supports of `len(counts)` more tokens (ids concatenated), with
        their support logprobs when the request asked for them."""
        if self.reason is not None:
            raise ValueError("MaskAccumulator.append: the mask has stopped ("
                             f"{self.reason}); count later tokens with skip")
        n, k = len(counts), len(ids)
        start = self._offsets[self._tokens]
        if self.with_logprobs and (logprobs is None or log_kept is None
                                   or len(logprobs) != k or len(log_kept) != n):
            raise ValueError(f"MaskAccumulator: {k} ids and {n} tokens need as many "
                             "support logprobs and log S values")
        if start + k > len(self._ids):
            self._ids = np.resize(self._ids, max(2 * len(self._ids), start + k))
            if self.with_logprobs:
                self._logprobs = np.resize(self._logprobs, len(self._ids))
        if self._tokens + n + 1 > len(self._offsets):
            self._offsets = np.resize(self._offsets, max(2 * len(self._offsets),
                                                         self._tokens + n + 1))
            if self.with_logprobs:
                self._log_kept = np.resize(self._log_kept, len(self._offsets))
        self._ids[start:start + k] = ids
        if self.with_logprobs:
            self._logprobs[start:start + k] = logprobs
            self._log_kept[self._tokens:self._tokens + n] = log_kept
        np.cumsum(counts, out=self._offsets[self._tokens + 1:self._tokens + n + 1])
        self._offsets[self._tokens + 1:self._tokens + n + 1] += start
        self._tokens += n

    def mask(self, first: int = 0, last: int | None = None) -> SamplingMask | None:
        """The supports of tokens [first, last) as a SamplingMask; None when the
        span reaches a token past a stop (`reason` says why)."""
        last = len(self) if last is None else last
        if self.reason is not None and (last > self._tokens or first >= self._tokens):
            return None
        offsets = self._offsets[first:last + 1]
        base = offsets[0]
        if not self.with_logprobs:
            return SamplingMask(self._ids[base:offsets[-1]], offsets - base)
        return SamplingMask(self._ids[base:offsets[-1]], offsets - base,
                            logprobs=self._logprobs[base:offsets[-1]],
                            log_kept=self._log_kept[first:last])
