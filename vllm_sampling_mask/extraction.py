"""Mask extraction on the device: which ids survived every logits processor.

Plain module (torch, and Triton where it is installed; no vLLM). The sampler
calls `extract_support` on the processed logits it sampled from (a non-finite
logit marks an excluded id) right after sampling. The result stays on the
device in one int32 block that `transport` copies to the host as a whole.

The block of one step, `R` rows, compaction width `W`, `S` wide-row slots:

    meta  [R, 3]   count (true support size), slot, start_word
    ids   [R, W]   the first min(count, W) finite ids, ascending, then -1
    bits  [S, n_words]  packed finite mask (bit j of word w is id 32 w + j)
                   of the rows wider than W, from word `start_word` on

Only the rows of requests that want a mask are extracted (`rows`, the batch
rows, in order); the others cost nothing. `W` comes from the host-side top-k of
those rows (the largest plus a margin for ties), capped at the engine's
`max_size` (--max-sampling-mask-size, N): a support wider than N ends its
request with an error, so nothing wider ever needs room. A row wider than `W`
but within N (ties beyond the margin) claims a slot and also writes its finite
mask as bits, from the block of the vocabulary where it crossed `W` onwards:
the host reads its first `W` ids from `ids` and the rest from `bits`, in time
linear in `V / 8`. `slot` is -1 for a row that fits, -2 for a wide row that
found every slot taken (the host turns that into a per-request error, never a
truncated mask). There are a few spare slots when `W < N`, none when `W = N`.
Nothing is read back from the device to size anything: device memory per step
is at most `R x (N + 3)` int32 plus the spare slots' `V / 8` bytes each.

Two implementations write the same block: `_support_kernel` (Triton; one
program per row, each logit read once, no `[R, V]` temporaries) and
`_extract_torch` (devices without Triton, and CPU hosts, where it runs chunks
of rows so its temporaries stay small). Slot numbers may differ between them
(the kernel claims slots with an atomic); the decoded supports may not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE

try:  # Triton is optional: CPU hosts without it use the torch implementation.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None

META = 3  # count, slot, start_word
NOT_WIDE, NO_SLOT = -1, -2


def n_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


@dataclass(frozen=True)
class ExtractionSettings:
    """The layout's tunables; one instance per engine (the runner's mask state
    holds it), so tests pass other values instead of patching module globals."""

    # Extra columns beyond the largest top-k, for ids tied with the k-th logit.
    tie_margin: int = 16
    # Wide-row slots when W < max_size: room for rows that turn wider than W
    # only through ties at the k-th logit.
    spare_wide_slots: int = 4
    # Logits per chunk of rows on the torch path: bounds its temporaries (a bool
    # mask and the kept indices of one chunk) whatever the batch, while keeping
    # the number of vocabulary-wide operations per step small.
    chunk_elements: int = 1 << 22


DEFAULT_SETTINGS = ExtractionSettings()


@dataclass(frozen=True)
class MaskLayout:
    """Shape of one step's block; everything here is a host int."""

    rows: int          # rows extracted (requests that want a mask)
    width: int
    slots: int
    vocab_size: int
    max_size: int = DEFAULT_MAX_SIZE

    @property
    def words(self) -> int:
        return n_words(self.vocab_size)

    @property
    def ids_offset(self) -> int:
        return self.rows * META

    @property
    def bits_offset(self) -> int:
        return self.rows * (META + self.width)

    @property
    def numel(self) -> int:
        return self.bits_offset + self.slots * self.words

    def views(self, block):
        """(meta, ids, bits) views of a flat block (a tensor or an ndarray)."""
        meta = block[: self.ids_offset].reshape(self.rows, META)
        ids = block[self.ids_offset: self.bits_offset].reshape(self.rows, self.width)
        bits = block[self.bits_offset: self.numel].reshape(self.slots, self.words)
        return meta, ids, bits


def plan_layout(top_k, vocab_size: int, *, max_size: int = DEFAULT_MAX_SIZE,
                worst_case: bool = False,
                settings: ExtractionSettings = DEFAULT_SETTINGS) -> MaskLayout:
    """The layout for the rows to extract, whose top-k are `top_k` (host ints).

    A top-k of 0 or >= vocab_size means "no top-k" (vLLM stores vocab_size).
    `worst_case` (the memory-profiling run) takes the largest layout a step of
    that many rows can use.
    """
    rows = len(top_k)
    cap = max(1, min(max_size, vocab_size))
    if worst_case:
        return MaskLayout(rows, cap, 0, vocab_size, max_size)
    bounded = [int(k) for k in top_k if 0 < int(k) < vocab_size]
    widest = vocab_size if len(bounded) < rows else max(bounded, default=1)
    width = max(1, min(cap, widest + settings.tie_margin))
    slots = min(rows, settings.spare_wide_slots) if width < cap else 0
    return MaskLayout(rows, width, slots, vocab_size, max_size)


@dataclass
class DeviceMask:
    """Compacted supports of one sampler step, still on the device."""

    block: torch.Tensor        # flat int32, `layout.numel` entries
    layout: MaskLayout
    batch_rows: int            # rows of the sampler's batch
    rows: np.ndarray | None    # the batch rows extracted, ascending (None: all)

    def row_of(self) -> np.ndarray:
        """For each batch row, its row in the block, or -1 (no mask wanted)."""
        row_of = np.full(self.batch_rows, -1, dtype=np.int64)
        if self.rows is None:
            row_of[:] = np.arange(self.batch_rows)
        else:
            row_of[self.rows] = np.arange(len(self.rows))
        return row_of


def extract_support(processed_logits: torch.Tensor, layout: MaskLayout,
                    rows: np.ndarray | None = None, *,
                    use_triton: bool | None = None,
                    settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """Compact the finite entries of the given rows of `processed_logits`.

    `rows` (host ints, ascending) are the batch rows to extract; None means all.
    Runs the Triton kernel on CUDA (and wherever `use_triton=True`, e.g. under
    Triton's interpreter in the CPU tests), the torch implementation elsewhere.
    Issues no host synchronisation on the kernel path.
    """
    batch_rows, vocab = processed_logits.shape
    picked = batch_rows if rows is None else len(rows)
    if (picked, vocab) != (layout.rows, layout.vocab_size):
        raise ValueError(f"extract_support: {picked} rows of {vocab} logits do not "
                         f"match the layout ({layout.rows}, {layout.vocab_size})")
    if use_triton is None:
        use_triton = triton is not None and processed_logits.is_cuda
    device = processed_logits.device
    source = None
    if rows is not None:
        source = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int32))
        if device.type != "cpu":
            source = source.pin_memory().to(device, non_blocking=True)
    block = torch.empty(layout.numel + 1, dtype=torch.int32, device=device)
    # The last entry is the kernel's slot counter; the block proper excludes it.
    if use_triton:
        _extract_triton(processed_logits, source, block, layout)
    else:
        _extract_torch(processed_logits, source, block, layout, settings.chunk_elements)
    return DeviceMask(block=block[: layout.numel], layout=layout, batch_rows=batch_rows,
                      rows=None if rows is None else np.asarray(rows))


def no_rows(batch_rows: int, device) -> DeviceMask:
    """The mask of a step in which no request wants one."""
    return DeviceMask(block=torch.empty(0, dtype=torch.int32, device=device),
                      layout=MaskLayout(0, 1, 0, 1), batch_rows=batch_rows,
                      rows=np.zeros(0, dtype=np.int64))


def extract_selected(processed_logits: torch.Tensor, top_k: np.ndarray,
                     wanted: np.ndarray, *, max_size: int, worst_case: bool = False,
                     settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """The sampler's entry: extract the batch rows that want a mask (`wanted`,
    a host bool per row), laid out from their host-side `top_k`. The
    memory-profiling run (`worst_case`) extracts every row at the widest."""
    vocab = processed_logits.shape[1]
    if not worst_case and not wanted.any():
        return no_rows(len(wanted), processed_logits.device)
    rows = None if worst_case or wanted.all() else np.flatnonzero(wanted)
    layout = plan_layout(top_k if rows is None else top_k[rows], vocab, max_size=max_size,
                         worst_case=worst_case, settings=settings)
    return extract_support(processed_logits, layout, rows, settings=settings)


# -- Triton ------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _support_kernel(logits_ptr, logits_stride, rows_ptr, out_ptr, counter_ptr,
                        vocab_size, width, n_slots, words, ids_offset, bits_offset,
                        HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr,
                        PAD_BLOCK: tl.constexpr):
        row = tl.program_id(0)
        if HAS_ROWS:
            source = tl.load(rows_ptr + row)
        else:
            source = row
        row_logits = logits_ptr + source.to(tl.int64) * logits_stride
        row_ids = out_ptr + ids_offset + row * width
        count = tl.zeros((), dtype=tl.int32)
        slot = tl.full((), -1, dtype=tl.int32)  # NOT_WIDE
        start_word = tl.zeros((), dtype=tl.int32)
        lanes = tl.arange(0, BLOCK)
        shifts = tl.arange(0, 32)
        for start in range(0, vocab_size, BLOCK):
            offs = start + lanes
            x = tl.load(row_logits + offs, mask=offs < vocab_size,
                        other=float("-inf")).to(tl.float32)
            keep = (x > float("-inf")) & (x < float("inf"))  # NaN fails both
            k = keep.to(tl.int32)
            pos = count + tl.cumsum(k, 0) - 1
            tl.store(row_ids + pos, offs, mask=keep & (pos < width))
            new_count = count + tl.sum(k, 0)
            if (count <= width) & (new_count > width):  # this block holds id W + 1
                claimed = tl.atomic_add(counter_ptr, 1)
                slot = tl.where(claimed < n_slots, claimed, -2)  # NO_SLOT
                start_word = start // 32
            if slot >= 0:
                packed = tl.sum(tl.reshape(k, (BLOCK // 32, 32)) << shifts[None, :], 1)
                word = start // 32 + tl.arange(0, BLOCK // 32)
                tl.store(out_ptr + bits_offset + slot * words + word, packed,
                         mask=word < words)
            count = new_count
        for pad in range(0, width, PAD_BLOCK):
            offs = pad + tl.arange(0, PAD_BLOCK)
            tl.store(row_ids + offs, tl.full((PAD_BLOCK,), -1, tl.int32),
                     mask=(offs >= count) & (offs < width))
        tl.store(out_ptr + row * 3, count)
        tl.store(out_ptr + row * 3 + 1, slot)
        tl.store(out_ptr + row * 3 + 2, start_word)


def _extract_triton(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
                    layout: MaskLayout, block_size: int = 2048) -> None:
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    counter = block[layout.numel:]
    counter.zero_()
    if layout.rows == 0:
        return
    _support_kernel[(layout.rows,)](
        logits, logits.stride(0), block if rows is None else rows, block, counter,
        layout.vocab_size, layout.width, layout.slots, layout.words, layout.ids_offset,
        layout.bits_offset, HAS_ROWS=rows is not None, BLOCK=block_size, PAD_BLOCK=256,
        num_warps=8)


# -- torch -------------------------------------------------------------------

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


def _extract_torch(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
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
        for r in torch.nonzero(counts > width).view(-1).tolist():
            if next_slot < layout.slots:
                meta[r0 + r, 1] = next_slot
                bits[next_slot] = pack_bits(keep[r * vocab: (r + 1) * vocab])
                next_slot += 1
            else:
                meta[r0 + r, 1] = NO_SLOT
