"""Per-request accumulation of supports in the output processor.

Plain module (numpy). Supports arrive a few tokens at a time (one engine-core
output per step); appending is amortised O(new ids), and any span of tokens is
returned as a `SamplingMask` without copying the ids.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.sampling_mask import SamplingMask


class MaskAccumulator:
    def __init__(self) -> None:
        self._ids = np.empty(256, dtype=np.int32)
        self._offsets = np.zeros(64, dtype=np.int64)
        self._tokens = 0

    def __len__(self) -> int:
        return self._tokens

    def append(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Add the supports of `len(counts)` more tokens (ids concatenated)."""
        n, k = len(counts), len(ids)
        start = self._offsets[self._tokens]
        if start + k > len(self._ids):
            self._ids = np.resize(self._ids, max(2 * len(self._ids), start + k))
        if self._tokens + n + 1 > len(self._offsets):
            self._offsets = np.resize(self._offsets, max(2 * len(self._offsets),
                                                         self._tokens + n + 1))
        self._ids[start:start + k] = ids
        np.cumsum(counts, out=self._offsets[self._tokens + 1:self._tokens + n + 1])
        self._offsets[self._tokens + 1:self._tokens + n + 1] += start
        self._tokens += n

    def mask(self, first: int = 0, last: int | None = None) -> SamplingMask:
        """The supports of tokens [first, last) as a SamplingMask."""
        last = self._tokens if last is None else last
        offsets = self._offsets[first:last + 1]
        base = offsets[0]
        return SamplingMask(self._ids[base:offsets[-1]], offsets - base)
