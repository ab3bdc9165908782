"""Device-to-host transport of compacted masks, and their per-step host form.

Plain module (torch, numpy). `MaskCopy` is started inside Model Runner V2's
output copy stream, beside the sampled token ids, and read when the runner's
asynchronous output is resolved (after its copy event), so it adds no host
synchronisation to the sampler's hot path.

Pinned staging: on platforms with pinned memory the copy lands in a reusable
page-locked buffer from `PinnedPool`, so it is truly asynchronous and no
page-locked allocation happens per step. A buffer is handed out only while
free and returns to the pool when its copy has been read, so any number of
steps in flight (asynchronous scheduling, pipeline parallelism) is safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.extraction import DeviceMask


class PinnedPool:
    """Reusable page-locked int32 buffers; one per copy in flight.

    `take` runs on the runner's thread, `give_back` wherever the output is
    resolved (an output thread under asynchronous scheduling): hence the lock.
    """

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, numel: int) -> torch.Tensor:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= numel:
                    return self._free.pop(i)
            if self._free:  # all too small: drop the smallest, allocate bigger
                self._free.remove(min(self._free, key=torch.Tensor.numel))
        return torch.empty(max(numel, 4096), dtype=torch.int32, pin_memory=True)

    def give_back(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)


@dataclass
class StepMasks:
    """One step's supports on the host, one row per request of the batch."""

    ids: np.ndarray      # [R, W] int32, ascending then -1
    counts: np.ndarray   # [R] int32
    wide: dict[int, np.ndarray]  # rows wider than W, read exactly

    def row(self, i: int) -> np.ndarray:
        wide = self.wide.get(i)
        if wide is not None:
            return wide
        return self.ids[i, : self.counts[i]]


class MaskCopy:
    """An in-flight device-to-host copy of one step's `DeviceMask`."""

    def __init__(self, mask: DeviceMask, pool: PinnedPool | None) -> None:
        self._finite = mask.finite
        self._pool = pool
        self._buffer = None
        rows, width = mask.ids.shape
        # One [R, 1 + W] int32 block: counts in column 0, then the ids.
        packed = torch.cat([mask.counts.view(-1, 1), mask.ids], dim=1)
        self._packed = packed  # keep the source alive until the copy is read
        if packed.device.type == "cpu":
            self._host = packed
        elif pool is not None:
            self._buffer = pool.take(packed.numel())
            self._host = self._buffer[: packed.numel()].view(rows, width + 1)
            self._host.copy_(packed, non_blocking=True)
        else:
            self._host = packed.to("cpu", non_blocking=True)

    def result(self, num_sampled: np.ndarray | None = None) -> StepMasks:
        """Read the copy (after the runner's copy event has completed).

        Rows whose request produced no token this step (`num_sampled == 0`,
        e.g. a chunked prefill) get count 0. Rows wider than the compacted
        width are read exactly from the retained `finite` mask, in one call.
        """
        host = self._host.numpy()
        counts = host[:, 0].copy()
        ids = host[:, 1:].copy()
        if self._buffer is not None:
            self._pool.give_back(self._buffer)
        if num_sampled is not None:
            counts[np.asarray(num_sampled)[: len(counts)] == 0] = 0
        wide = {}
        over = np.nonzero(counts > ids.shape[1])[0]
        if len(over):
            rows = torch.as_tensor(over, device=self._finite.device)
            nz = torch.nonzero(self._finite[rows]).cpu().numpy()
            for j, r in enumerate(over.tolist()):
                wide[r] = nz[nz[:, 0] == j, 1].astype(np.int32)
        self._finite = self._packed = self._buffer = self._host = None
        return StepMasks(ids=ids, counts=counts, wide=wide)
