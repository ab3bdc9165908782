"""The `SamplingMask` type: per generated token, the ids the sampler could draw.

Plain module: numpy only, no torch, no vLLM. The engine builds one per
completion; the trainer consumes it (see `vllm_sampling_mask.training`).

Packed form (what travels and what the trainer op reads):
    ids      1-D int32,  every support concatenated in generation order
    offsets  1-D int64,  length T + 1, offsets[0] == 0, offsets[-1] == len(ids)
Support t is ids[offsets[t]:offsets[t + 1]], ascending.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["SamplingMask"]


class SamplingMask:
    """The sampling support of each generated token of one completion."""

    __slots__ = ("ids", "offsets")

    def __init__(self, ids, offsets) -> None:
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if ids.ndim != 1 or offsets.ndim != 1:
            raise ValueError("SamplingMask: ids and offsets must be 1-D arrays")
        if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(
                "SamplingMask: offsets must start at 0 and end at len(ids) "
                f"(got len(offsets)={len(offsets)}, len(ids)={len(ids)})")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("SamplingMask: offsets must be non-decreasing")
        self.ids = ids
        self.offsets = offsets

    # -- constructors -------------------------------------------------------
    @classmethod
    def from_lists(cls, token_ids: Iterable[Sequence[int]]) -> SamplingMask:
        """Build from one list of ids per generated token."""
        rows = [np.asarray(r, dtype=np.int32).reshape(-1) for r in token_ids]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        if rows:
            np.cumsum([len(r) for r in rows], out=offsets[1:])
            ids = np.concatenate(rows)
        else:
            ids = np.zeros(0, dtype=np.int32)
        return cls(ids, offsets)

    @classmethod
    def from_counts(cls, ids, counts) -> SamplingMask:
        """Build from packed ids and the size of each support."""
        counts = np.asarray(counts, dtype=np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(ids, offsets)

    @classmethod
    def concat(cls, masks: Sequence[SamplingMask]) -> SamplingMask:
        """Join masks of consecutive token spans into one."""
        if not masks:
            return cls.from_lists([])
        ids = np.concatenate([m.ids for m in masks])
        counts = np.concatenate([np.diff(m.offsets) for m in masks])
        return cls.from_counts(ids, counts)

    # -- views ---------------------------------------------------------------
    @property
    def token_ids(self) -> list[list[int]]:
        """One list of ids per generated token (`token_ids[t]` is token t's support)."""
        flat = self.ids.tolist()
        bounds = self.offsets.tolist()
        return [flat[bounds[t]:bounds[t + 1]] for t in range(len(bounds) - 1)]

    @property
    def sizes(self) -> np.ndarray:
        """Support size of each generated token, int64 [T]."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, t: int) -> np.ndarray:
        n = len(self)
        if t < 0:
            t += n
        if not 0 <= t < n:
            raise IndexError(f"SamplingMask index {t} out of range for {n} tokens")
        return self.ids[self.offsets[t]:self.offsets[t + 1]]

    def __iter__(self):
        return (self[t] for t in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplingMask):
            return NotImplemented
        return (np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.ids, other.ids))

    __hash__ = None  # mutable arrays inside

    def __reduce__(self):
        return (SamplingMask, (self.ids, self.offsets))

    def __repr__(self) -> str:
        sizes = self.sizes
        if len(sizes):
            return (f"SamplingMask(tokens={len(self)}, ids={len(self.ids)}, "
                    f"size min/max={int(sizes.min())}/{int(sizes.max())})")
        return "SamplingMask(tokens=0)"
