"""The block (`layout`) written with torch: on devices without Triton, and for logits
numpy cannot read (bfloat16 ones). It runs chunks of rows so its temporaries stay small
(`ExtractionSettings.chunk_elements`).
"""

from __future__ import annotations

import torch

from vllm_sampling_mask.worker.extraction.layout import (NO_SLOT, NOT_WIDE, MaskLayout,
                                                         n_words)


def pack_bits(keep: torch.Tensor) -> torch.Tensor:
    """[V] bool -> [n_words(V)] int32, bit j of word w set when keep[32 w + j]."""
    vocab = keep.shape[-1]
    padded = torch.zeros(n_words(vocab) * 32, dtype=torch.int64, device=keep.device)
    padded[:vocab] = keep
    shifts = torch.arange(32, dtype=torch.int64, device=keep.device)
    return (padded.view(-1, 32) << shifts).sum(-1).to(torch.int32)


def _kept_indices(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Flat indices of the finite entries of contiguous `x`, ascending.

    `keep` is a bool scratch of len(x) rounded up to 8. One vocabulary-wide
    comparison, then `nonzero` over 8-byte words of the mask (8x fewer
    elements than the mask itself), then only the words that hold a kept id
    are looked at byte by byte. `x > -inf` already drops NaN; the few kept
    +inf are dropped from the (small) kept set.
    """
    n = x.numel()
    keep[n:] = False
    torch.gt(x.view(-1), float("-inf"), out=keep[:n])
    words = torch.nonzero(keep.view(torch.int64)).view(-1)
    word, byte = torch.nonzero(keep.view(-1, 8)[words], as_tuple=True)
    flat = words[word] * 8 + byte
    posinf = x.view(-1)[flat] == float("inf")
    if bool(posinf.any()):
        keep[flat[posinf]] = False
        flat = flat[~posinf]
    return flat


def write_block(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
                layout: MaskLayout, chunk_elements: int) -> None:
    meta, ids, bits = layout.views(block[: layout.numel])
    ids.fill_(-1)
    meta[:, 1] = NOT_WIDE
    meta[:, 2] = 0
    width, vocab = layout.width, layout.vocab_size
    # Wide rows (no top-k) make the kept indices as large as the chunk: take
    # smaller chunks then.
    elements = chunk_elements if width < 1024 else chunk_elements // 4
    chunk = max(1, elements // max(vocab, 1))
    scratch = torch.empty((min(chunk, layout.rows) * vocab + 7) // 8 * 8,
                          dtype=torch.bool, device=logits.device)
    next_slot = 0
    for r0 in range(0, layout.rows, chunk):
        x = (logits[r0: r0 + chunk] if rows is None
             else logits.index_select(0, rows[r0: r0 + chunk])).contiguous()
        n = len(x)
        keep = scratch[: (n * vocab + 7) // 8 * 8]
        flat = _kept_indices(x, keep)
        row = flat // vocab
        col = flat - row * vocab
        counts = torch.bincount(row, minlength=n)
        meta[r0: r0 + n, 0] = counts.to(torch.int32)
        pos = torch.arange(len(flat), device=flat.device) - (torch.cumsum(counts, 0)
                                                             - counts)[row]
        fits = pos < width
        ids[r0 + row[fits], pos[fits]] = col[fits].to(torch.int32)
        # rows wider than the size limit end with an error: they take no slot
        for r in torch.nonzero((counts > width)
                               & (counts <= layout.max_size)).view(-1).tolist():
            if next_slot < layout.slots:
                meta[r0 + r, 1] = next_slot
                bits[next_slot] = pack_bits(keep[r * vocab: (r + 1) * vocab])
                next_slot += 1
            else:
                meta[r0 + r, 1] = NO_SLOT
