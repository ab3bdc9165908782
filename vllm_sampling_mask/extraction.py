"""Mask extraction on the device: which ids survived every logits processor.

Plain module (torch only). The sampler calls `extract_support` on the
processed logits it sampled from (-inf marks an excluded id), right after
sampling. The result stays on the device; `transport` copies it to the host.

Layout: `ids [R, W]` int32, each row's surviving ids ascending and then padded
with -1, plus `counts [R]` int32. W, the width, comes from the host-side top-k
values (no device sync): the largest top-k in the batch plus a margin for
logits tied with the k-th value, which the sampler keeps. A row whose support is
wider than W (more ties than the margin) is flagged by `counts > W`; the host
then re-reads that row from the retained logits (see `transport`). Nothing of
vocabulary size is ever copied to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Extra columns beyond the largest top-k, for ids tied with the k-th logit.
TIE_MARGIN = 16


@dataclass
class DeviceMask:
    """Compacted supports of one sampler step, still on the device."""

    ids: torch.Tensor      # [R, W] int32, ascending, -1 padded
    counts: torch.Tensor   # [R] int32, true support size (may exceed W)
    logits: torch.Tensor   # [R, V] processed logits, kept for overflow rows


def support_width(max_top_k: int, vocab_size: int) -> int:
    """Columns to compact into, from the largest top-k of the batch (host int)."""
    return max(1, min(vocab_size, int(max_top_k) + TIE_MARGIN))


def extract_support(processed_logits: torch.Tensor, width: int) -> DeviceMask:
    """Compact `isfinite(processed_logits)` into ascending ids per row.

    `torch.topk` by value puts every finite logit ahead of the -inf ones, so
    when a row has at most `width` finite entries its support is exactly the
    finite entries among the top `width`. Sorting those ids (with the excluded
    ones pushed to the end) gives the ascending, padded row.
    """
    rows, vocab = processed_logits.shape
    width = min(width, vocab)
    finite = torch.isfinite(processed_logits)
    counts = finite.sum(dim=-1, dtype=torch.int32)
    values, idx = torch.topk(processed_logits, width, dim=-1, sorted=False)
    keep = torch.isfinite(values)
    idx = torch.where(keep, idx, vocab).sort(dim=-1).values
    ids = torch.where(idx < vocab, idx, -1).to(torch.int32)
    return DeviceMask(ids=ids, counts=counts, logits=processed_logits)


def support_of_row(processed_logits_row: torch.Tensor) -> torch.Tensor:
    """Reference/fallback: the ascending finite ids of one row (syncs the host)."""
    return torch.nonzero(torch.isfinite(processed_logits_row)).view(-1).to(torch.int32)
