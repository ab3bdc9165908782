"""Device-to-host transport of compacted masks, and their per-step host form.

Plain module (torch, numpy). `MaskCopy` is started inside Model Runner V2's
output copy stream, beside the sampled token ids, and read when the runner's
asynchronous output is resolved (after its copy event), so it adds no host
synchronisation to the sampler's hot path.

Pinned staging: on platforms with pinned memory, the copy lands in a
reusable page-locked buffer (a small ring, since asynchronous scheduling
keeps up to two steps in flight), so the copy is truly asynchronous and no
page-locked allocation happens per step. `StepMasks` copies the rows out of
the staging buffer when the output is resolved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.extraction import DeviceMask, support_of_row


class PinnedRing:
    """A few reusable page-locked int32 buffers, handed out round-robin."""

    def __init__(self, slots: int = 4) -> None:
        self._slots: list[torch.Tensor | None] = [None] * slots
        self._next = 0

    def take(self, numel: int) -> torch.Tensor:
        i = self._next
        self._next = (i + 1) % len(self._slots)
        buf = self._slots[i]
        if buf is None or buf.numel() < numel:
            buf = torch.empty(max(numel, 2 * (buf.numel() if buf is not None else 0)),
                              dtype=torch.int32, pin_memory=True)
            self._slots[i] = buf
        return buf[:numel]


@dataclass
class StepMasks:
    """One step's supports on the host, one row per request of the batch."""

    ids: np.ndarray      # [R, W] int32, ascending then -1
    counts: np.ndarray   # [R] int32

    def row(self, i: int) -> np.ndarray:
        return self.ids[i, : self.counts[i]]


class MaskCopy:
    """An in-flight device-to-host copy of one step's `DeviceMask`."""

    _packed = None

    def __init__(self, mask: DeviceMask, ring: PinnedRing | None) -> None:
        self._device = mask
        rows, width = mask.ids.shape
        # One [R, 1 + W] int32 block: counts in column 0, then the ids.
        packed = torch.cat([mask.counts.view(-1, 1), mask.ids], dim=1)
        if packed.device.type == "cpu":
            self._host = packed
            return
        if ring is not None:
            host = ring.take(packed.numel()).view(rows, width + 1)
            host.copy_(packed, non_blocking=True)
        else:
            host = packed.to("cpu", non_blocking=True)
        self._packed = packed  # keep the source alive until the copy is read
        self._host = host

    def result(self, num_sampled: np.ndarray | None = None) -> StepMasks:
        """Read the copy (after the runner's copy event has completed).

        Rows whose request produced no token this step (`num_sampled == 0`,
        e.g. a chunked prefill) get count 0. Rows wider than the compacted
        width are re-read from the retained logits: exact, and rare.
        """
        host = self._host.numpy()
        counts = host[:, 0].copy()
        ids = host[:, 1:].copy()
        width = ids.shape[1]
        over = np.nonzero(counts > width)[0]
        if len(over):
            wide = np.full((ids.shape[0], int(counts.max())), -1, dtype=np.int32)
            wide[:, :width] = ids
            for r in over.tolist():
                wide[r, : counts[r]] = support_of_row(self._device.logits[r]).cpu().numpy()
            ids = wide
        if num_sampled is not None:
            counts[np.asarray(num_sampled)[: len(counts)] == 0] = 0
        self._device = self._packed = None  # release the device tensors
        return StepMasks(ids=ids, counts=counts)
