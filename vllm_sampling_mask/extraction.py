"""Mask extraction on the device: which ids survived every logits processor.

Plain module (torch only). The sampler calls `extract_support` on the
processed logits it sampled from (-inf marks an excluded id), right after
sampling. The result stays on the device; `transport` copies it to the host.

Layout: `ids [R, W]` int32, each row's surviving ids ascending and then padded
with -1, plus `counts [R]` int32 (the true support size). W, the width, comes
from the host-side top-k values (no device sync): the largest top-k in the
batch plus a margin for logits tied with the k-th value, which the sampler
keeps, capped at MAX_WIDTH. A row whose support is wider than W (more ties
than the margin, or a top-k above the cap) has `counts > W`; the host then
reads that row exactly from the retained `finite` mask (see `transport`).
Nothing of vocabulary size is copied to the host for ordinary rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Extra columns beyond the largest top-k, for ids tied with the k-th logit.
TIE_MARGIN = 16
# Widest compaction; wider supports (top_k near the vocabulary) take the exact
# overflow path instead of making every row of every step vocabulary-wide.
MAX_WIDTH = 2048


@dataclass
class DeviceMask:
    """Compacted supports of one sampler step, still on the device."""

    ids: torch.Tensor      # [R, W] int32, ascending, -1 padded
    counts: torch.Tensor   # [R] int32, true support size (may exceed W)
    finite: torch.Tensor   # [R, V] bool, kept only to re-read overflowing rows


def support_width(max_top_k: int, vocab_size: int) -> int:
    """Columns to compact into, from the largest top-k of the batch (host int)."""
    return max(1, min(vocab_size, int(max_top_k) + TIE_MARGIN, MAX_WIDTH))


def extract_support(processed_logits: torch.Tensor, width: int) -> DeviceMask:
    """Compact `isfinite(processed_logits)` into ascending ids per row.

    `torch.topk` by value puts every finite logit ahead of the excluded ones
    (non-finite values are first set to -inf, so a NaN cannot outrank them):
    when a row has at most `width` finite entries, its support is exactly the
    finite entries among the top `width`. Sorting those ids, with the excluded
    ones pushed to the end, gives the ascending, padded row.
    """
    rows, vocab = processed_logits.shape
    width = min(width, vocab)
    finite = torch.isfinite(processed_logits)
    counts = finite.sum(dim=-1, dtype=torch.int32)
    ranked = processed_logits.masked_fill(~finite, float("-inf"))
    values, idx = torch.topk(ranked, width, dim=-1, sorted=False)
    keep = torch.isfinite(values)
    idx = torch.where(keep, idx, vocab).sort(dim=-1).values
    ids = torch.where(idx < vocab, idx, -1).to(torch.int32)
    return DeviceMask(ids=ids, counts=counts, finite=finite)
