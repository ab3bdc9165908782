"""Segmented operations on packed supports.

A packed mask lists every support one after the other: entry ``k`` of the
``[N]`` ids belongs to token ``seg[k]`` (its *segment*).  These helpers map
entries to segments (:func:`segment_ids`), reduce per segment
(:func:`segment_logsumexp`, O(N + T) memory, no ``[T, V]`` tensor) and address
``(row, column)`` pairs of a 2-D tensor through one flat index
(:func:`flat_view`, :func:`flat_index`).
"""

from __future__ import annotations

import math

import torch

__all__ = ["flat_index", "flat_view", "segment_ids", "segment_logsumexp"]


def segment_ids(offsets: torch.Tensor, T: int, N: int) -> torch.Tensor:
    """``seg[k] = t`` for ``offsets[t] <= k < offsets[t + 1]`` (valid offsets)."""
    if N == 0:
        return torch.zeros(0, dtype=torch.int64, device=offsets.device)
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(
        torch.arange(T, device=offsets.device), counts, output_size=N)


def segment_logsumexp(x: torch.Tensor, seg: torch.Tensor, T: int):
    """Per-segment logsumexp of ``x`` [N] (overwritten), with ``e`` and ``s``.

    Returns ``(lse, e, s)``: ``e = exp(x - m[seg])`` (in ``x``'s storage) and
    ``s`` its segment sums, so the softmax weights are ``e / s[seg]``.
    Entries equal to -inf take no part (weight 0).  O(N + T) memory.
    """
    m = torch.full((T,), -math.inf, dtype=x.dtype, device=x.device)
    m.scatter_reduce_(0, seg, x, reduce="amax", include_self=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = x.sub_(m[seg]).exp_()
    s = torch.zeros(T, dtype=x.dtype, device=x.device).index_add_(0, seg, e)
    return m + torch.log(s), e, s


def flat_view(x: torch.Tensor) -> torch.Tensor:
    """A 1-D view spanning a 2-D tensor's storage window (any strides)."""
    if x.is_contiguous():
        return x.view(-1)
    span = (x.shape[0] - 1) * x.stride(0) + (x.shape[1] - 1) * x.stride(1) + 1
    return x.as_strided((span,), (1,))


def flat_index(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Index of ``x[rows, cols]`` in :func:`flat_view` of ``x`` (any strides)."""
    if x.is_contiguous():
        return rows * x.shape[1] + cols
    return rows * x.stride(0) + cols * x.stride(1)

