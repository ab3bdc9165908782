"""The Triton kernel that writes a step's block (`layout`): two launches over the rows'
logits, and what the engine compiles at start-up (`warm_up`).

Two launches, each program working on one chunk (`CHUNK` logits, the settings'
`kernel_chunk`) of one row, grid (R, V / CHUNK):

  `_chunk_pass`  reads each logit once and writes the chunk's count of finite
                 ids and its packed finite bitmap (CHUNK / 32 int32 words) to a
                 scratch of R x V / 8 bytes: the only temporary.
  `_place_pass`  scans the row's chunk counts (a few dozen ints) for the
                 chunk's first output position, then places ids only from the
                 words of the chunk that hold kept ids (groups of GROUP words
                 that are all zero are skipped; ranks within a word come from
                 a 32-wide scan of that word's bits, positions across words
                 from a scan over words, never over the chunk's bits). Chunks
                 whose first position is past W do nothing. The program of
                 chunk 0 writes the row's meta, pads its ids with -1 and, for a
                 row wider than W, claims a slot and copies the row's bitmap
                 words from the chunk where it crossed W onwards.

The sizes that change with the batch (width, slots, offsets into the block) are
`do_not_specialize`, and every pointer is 16-byte aligned by construction (fresh
allocations; the slot counter sits in the `HEADER` in front of the block, zeroed by the
first pass: no memset launch), so the set of compiled variants depends only on the
engine (logits dtype, vocabulary, row stride) and on whether a row subset is extracted:
`warm_up` compiles all of them at start-up. Each logit is read once; the only temporary
is the packed bitmap, `R x V / 8` bytes plus one int32 per chunk, freed when the step's
launches are done with it.
"""

from __future__ import annotations

import inspect

import torch

from vllm_sampling_mask.frontend.validation import DEFAULT_MAX_SIZE
from vllm_sampling_mask.worker.extraction.layout import (DEFAULT_SETTINGS, HEADER,
                                                         ExtractionSettings, MaskLayout)

try:  # Triton is optional: CPU hosts without it use the torch implementation.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None

_GROUP = 8           # bitmap words looked at together when placing ids

_CHUNK_PASS_DNS = ()
_PLACE_PASS_DNS = ("width", "n_slots", "ids_offset", "bits_offset", "max_size")

if triton is not None:

    @triton.jit
    def _chunk_pass(logits_ptr, logits_stride, rows_ptr, bitmap_ptr, counts_ptr, counter_ptr,
                    vocab_size, HAS_ROWS: tl.constexpr, CHUNK: tl.constexpr,
                    N_CHUNKS: tl.constexpr):
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        if (row == 0) & (chunk == 0):
            tl.store(counter_ptr, 0)   # the slot counter, for the place pass (no memset)
        if HAS_ROWS:
            source = tl.load(rows_ptr + row)
        else:
            source = row
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(logits_ptr + source.to(tl.int64) * logits_stride + offs,
                    mask=offs < vocab_size, other=float("-inf")).to(tl.float32)
        k = ((x > float("-inf")) & (x < float("inf"))).to(tl.int32)  # NaN fails both
        at = row.to(tl.int64) * N_CHUNKS + chunk
        tl.store(counts_ptr + at, tl.sum(k, 0))
        packed = tl.sum(tl.reshape(k, (CHUNK // 32, 32)) << tl.arange(0, 32)[None, :], 1)
        tl.store(bitmap_ptr + at * (CHUNK // 32) + tl.arange(0, CHUNK // 32), packed)

    @triton.jit
    def _popcount(words):
        """Set bits of each int32 word (SWAR, on the words as uint32)."""
        x = words.to(tl.uint32, bitcast=True)
        x = x - ((x >> 1) & 0x55555555)
        x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
        x = (x + (x >> 4)) & 0x0F0F0F0F
        x = x + (x >> 8)
        x = x + (x >> 16)
        return (x & 0x3F).to(tl.int32)

    @triton.jit(do_not_specialize=_PLACE_PASS_DNS)
    def _place_pass(bitmap_ptr, counts_ptr, out_ptr, counter_ptr, width, n_slots, words,
                    ids_offset, bits_offset, max_size, CHUNK: tl.constexpr, N_CHUNKS: tl.constexpr,
                    CHUNKS_P2: tl.constexpr, WPC: tl.constexpr, GROUP: tl.constexpr,
                    N_GROUPS: tl.constexpr, PAD_BLOCK: tl.constexpr,
                    COPY_BLOCK: tl.constexpr):
        # WPC = CHUNK // 32 words per chunk, in N_GROUPS groups of GROUP words
        row = tl.program_id(0)
        chunk = tl.program_id(1)
        ci = tl.arange(0, CHUNKS_P2)
        row_counts = tl.load(counts_ptr + row.to(tl.int64) * N_CHUNKS + ci,
                             mask=ci < N_CHUNKS, other=0)
        inclusive = tl.cumsum(row_counts, 0)
        mine = tl.sum(tl.where(ci == chunk, row_counts, 0), 0)
        base = tl.sum(tl.where(ci == chunk, inclusive, 0), 0) - mine
        row_bits = bitmap_ptr + row.to(tl.int64) * (N_CHUNKS * WPC)
        row_ids = out_ptr + ids_offset + row.to(tl.int64) * width
        shifts = tl.arange(0, 32)
        if (mine > 0) & (base < width):
            # One load of the chunk's words, bits counted per word (SWAR) and
            # summed per group of GROUP words: `pending` has bit g set for each
            # group g that holds kept ids. Only those groups are visited, in
            # order, while ids still land before W (their words re-read from
            # cache): zero words cost nothing, and the scans run over a group's
            # words and each word's 32 bits, never over the chunk's bits.
            gi = tl.arange(0, N_GROUPS)
            counts_w = _popcount(tl.load(row_bits + chunk * WPC + tl.arange(0, WPC)))
            per_group = tl.sum(tl.reshape(counts_w, (N_GROUPS, GROUP)), 1)
            pending = tl.sum(tl.where(per_group > 0, 1 << gi, 0), 0)
            running = base
            while (pending != 0) & (running < width):
                lowest = pending & (0 - pending)
                g = _popcount(lowest - 1)            # index of the lowest pending group
                pending = pending ^ lowest
                wi = g * GROUP + tl.arange(0, GROUP)
                w = tl.load(row_bits + chunk * WPC + wi)
                bit = (w[:, None] >> shifts[None, :]) & 1
                per_word = tl.sum(bit, 1)
                pos = (running + tl.cumsum(per_word, 0) - per_word)[:, None] \
                    + tl.cumsum(bit, 1) - bit
                ids = chunk * CHUNK + wi[:, None] * 32 + shifts[None, :]
                tl.store(row_ids + pos, ids, mask=(bit != 0) & (pos < width))
                running += tl.sum(per_word, 0)
        if chunk == 0:
            total = tl.sum(row_counts, 0)
            for pad in range(0, width, PAD_BLOCK):
                offs = pad + tl.arange(0, PAD_BLOCK)
                tl.store(row_ids + offs, tl.full((PAD_BLOCK,), -1, tl.int32),
                         mask=(offs >= total) & (offs < width))
            slot = tl.full((), -1, dtype=tl.int32)  # NOT_WIDE
            start_word = tl.zeros((), dtype=tl.int32)
            if (total > width) & (total <= max_size):   # wider: an error, no slot
                # the chunk holding id W + 1: the first whose inclusive count passes W
                crossing = tl.sum((inclusive <= width).to(tl.int32), 0)
                start_word = crossing * WPC
                claimed = tl.atomic_add(counter_ptr, 1)
                slot = tl.where(claimed < n_slots, claimed, -2)  # NO_SLOT
                if slot >= 0:
                    dest = out_ptr + bits_offset + slot.to(tl.int64) * words
                    for w0 in range(start_word, words, COPY_BLOCK):
                        wo = w0 + tl.arange(0, COPY_BLOCK)
                        tl.store(dest + wo, tl.load(row_bits + wo, mask=wo < words),
                                 mask=wo < words)
            tl.store(out_ptr + row * 3, total)
            tl.store(out_ptr + row * 3 + 1, slot)
            tl.store(out_ptr + row * 3 + 2, start_word)



def _launches(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
              layout: MaskLayout, chunk: int):
    """The two launches of one extraction: [(kernel, grid, args, constexprs)].

    `block` is the full allocation (HEADER + numel). Also what `warm_up` and the
    specialisation test look at: nothing else decides which variant runs."""
    n_chunks = triton.cdiv(layout.vocab_size, chunk)
    wpc = chunk // 32
    group = max(min(_GROUP, wpc), wpc // 16)   # at most 16 groups: one int32 of flags
    scratch = torch.empty(layout.rows * n_chunks * (wpc + 1), dtype=torch.int32,
                          device=block.device)
    bitmap = scratch[: layout.rows * n_chunks * wpc]
    counts = scratch[layout.rows * n_chunks * wpc:]   # 16-byte aligned: wpc % 4 == 0
    out, counter = block[HEADER:], block[:1]
    grid = (layout.rows, n_chunks)
    first = (_chunk_pass, grid,
             (logits, logits.stride(0), out if rows is None else rows, bitmap, counts,
              counter, layout.vocab_size),
             dict(HAS_ROWS=rows is not None, CHUNK=chunk, N_CHUNKS=n_chunks, num_warps=4))
    second = (_place_pass, grid,
              (bitmap, counts, out, counter, layout.width, layout.slots, layout.words,
               layout.ids_offset, layout.bits_offset, layout.max_size),
              dict(CHUNK=chunk, N_CHUNKS=n_chunks,
                   CHUNKS_P2=triton.next_power_of_2(n_chunks), WPC=wpc,
                   GROUP=group, N_GROUPS=wpc // group,
                   PAD_BLOCK=256, COPY_BLOCK=1024, num_warps=4))
    return [first, second]


def write_block(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
                layout: MaskLayout, chunk: int) -> None:
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if layout.rows == 0:
        return
    for kernel, grid, args, constexprs in _launches(logits, rows, block, layout, chunk):
        kernel[grid](*args, **constexprs)


_DNS = {"_chunk_pass": _CHUNK_PASS_DNS, "_place_pass": _PLACE_PASS_DNS}


def specialisation(kernel, args, constexprs) -> tuple:
    """The key under which Triton caches a compiled variant of `kernel` for
    these launch arguments: each argument's type plus, unless the argument is
    `do_not_specialize`, whether an int is 1 or a multiple of 16 and whether a
    pointer is 16-byte aligned; and the constexprs. (Triton's own rule; written
    out so it can be checked where the kernel runs interpreted.)"""
    name = getattr(kernel, "__name__", None) or kernel.fn.__name__
    names = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    skip = set(_DNS[name])
    key = [name]
    for pname, arg in zip(names, args):
        if isinstance(arg, torch.Tensor):
            key.append((pname, str(arg.dtype), arg.data_ptr() % 16 == 0))
        elif isinstance(arg, bool):
            key.append((pname, "i1", arg))
        elif isinstance(arg, int):
            kind = "i32" if -2**31 <= arg < 2**31 else "i64"
            key.append((pname, kind) if pname in skip
                       else (pname, kind, arg == 1, arg % 16 == 0))
        else:
            key.append((pname, type(arg).__name__))
    key.append(tuple(sorted(constexprs.items())))
    return tuple(key)


def warm_up(device, vocab_size: int, dtypes=(torch.float32,), *,
            max_size: int = DEFAULT_MAX_SIZE, logits_stride: int | None = None,
            settings: ExtractionSettings = DEFAULT_SETTINGS) -> set:
    """Compile, at start-up, every kernel variant the engine can launch: for each
    logits dtype, all rows and a subset of rows (two launches each). Sizes that
    change with the batch are not specialised on, so these are all of them.
    `logits_stride` is the row stride of the engine's logits (default: the
    vocabulary). Returns the specialisation keys launched (see
    `specialisation`); an empty set where Triton is missing."""
    if triton is None:
        return set()
    stride = logits_stride or vocab_size
    keys = set()
    for dtype in dtypes:
        logits = torch.zeros(2, stride, dtype=dtype, device=device)[:, :vocab_size]
        logits[1, 1:] = float("-inf")
        for rows in (None, torch.ones(1, dtype=torch.int32, device=device)):
            picked = 2 if rows is None else 1
            # width 1 < max_size and a slot: the wide-row path runs too
            layout = MaskLayout(picked, 1, 1, vocab_size, max_size)
            block = torch.zeros(HEADER + layout.numel, dtype=torch.int32, device=device)
            for kernel, grid, args, constexprs in _launches(logits, rows, block, layout,
                                                            settings.kernel_chunk):
                kernel[grid](*args, **constexprs)
                keys.add(specialisation(kernel, args, constexprs))
    return keys

