"""Mask extraction on the device: which ids survived every logits processor.

Plain module (torch, and Triton where it is installed; no vLLM). The runner's
mask state (`worker.state.SamplingMaskState.extract`)
calls `extract_support` on the processed logits the sampler drew from (a non-finite
logit marks an excluded id) right after sampling. The result stays on the
device in one int32 block that `transport` copies to the host as a whole.

The block of one step, `R` rows, compaction width `W`, `S` wide-row slots:

    meta  [R, 3]   count (true support size), slot, start_word
    ids   [R, W]   the first min(count, W) finite ids, ascending, then -1
    bits  [S, n_words]  packed finite mask (bit j of word w is id 32 w + j)
                   of the rows wider than W, from word `start_word` on

Only the rows of requests that want a mask are extracted (`rows`, the batch
rows, in order), less the rows whose sample the runner discards (partial
prefill chunks: `DeviceMask.idle`, decoded as sampled nothing); the others
cost nothing. `W` comes from the host-side top-k of
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
is at most `R x (N + 3)` int32 plus the spare slots' `V / 8` bytes each (and,
on the Triton path, a scratch of `R x V / 8` bytes of packed bits plus one
int32 per 4096 logits, freed when the step's launches are done with it).

On a CPU host the state skips the block: `extract_on_host` reads the logits
straight into the host form (`HostSupports`: each row's whole support back to
back, as `transport.StepMasks` holds it), with nothing to size, copy or decode,
in one pass over their memory (`_supports_native`, C, where the install built
it; numpy's two otherwise); `ExtractionSettings.implementation` picks a block
writer instead.

Three implementations write the same block: the Triton kernel (two launches,
`_chunk_pass` and `_place_pass`, each program one chunk of one row; each logit
read once; the only temporary a packed `[R, V / 8]`-byte bitmap);
`_extract_host` (CPU hosts: numpy over the logits' own memory, a dozen cheap
calls a step); and `_extract_torch` (devices without Triton, and logits numpy
cannot read such as bfloat16 ones; it runs chunks of rows so its temporaries
stay small). Slot numbers may differ between them (the kernel claims slots
with an atomic); the decoded supports may not.
"""

from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.frontend.validation import DEFAULT_MAX_SIZE

try:  # compiled where setup.py found a C compiler; numpy does the same without it
    from vllm_sampling_mask.worker import _supports_native
except ImportError:  # pragma: no cover - exercised only where it was not built
    _supports_native = None

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
    # Logits per program of the Triton kernel (a power of two, >= 128). Tests
    # take a small one so a short row spans several chunks.
    kernel_chunk: int = 4096
    # None: chosen for the logits (`extract_on_host` for CPU logits numpy reads,
    # the kernel on CUDA with Triton, torch otherwise); "triton", "host" or
    # "torch" write the block with that implementation (tests take "host" to
    # run the block's wide-row slots in a CPU engine).
    implementation: str | None = None


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
    k = np.asarray(top_k).reshape(-1)   # no per-row Python
    rows = k.size
    cap = max(1, min(max_size, vocab_size))
    if worst_case:
        return MaskLayout(rows, cap, 0, vocab_size, max_size)
    if rows == 0:
        widest = 1
    else:
        lowest, widest = int(k.min()), int(k.max())
        if lowest <= 0 or widest >= vocab_size:
            widest = vocab_size   # a row without top-k
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
    # `support_logprobs.DeviceSupportLogprobs` of the rows that asked for them
    # (`return_sampling_mask_logprobs`), gathered in the same step; None: none asked
    support_logprobs: object | None = None
    # The batch rows, ascending, whose request wants a mask but whose sample the
    # runner discards this step (a partial prefill chunk): not extracted, they
    # follow the block's rows in `row_of` and decode as sampled nothing (count 0).
    idle: np.ndarray | None = None
    # A verify step's rows per request (`StepPlan.request_rows`); None: a batch
    # row is a request.
    request_rows: np.ndarray | None = None
    # On a CPU host (`extract_on_host`): the supports already in their host
    # form; `block` is then empty and there is nothing to copy or decode.
    host: "HostSupports | None" = None

    @property
    def n_idle(self) -> int:
        return 0 if self.idle is None else len(self.idle)

    def row_of(self) -> np.ndarray:
        """For each batch row, its row in the host form: the block's rows first,
        then the idle rows (`layout.rows + i`); -1 for no mask wanted."""
        if self.rows is None and not self.n_idle:
            return np.arange(self.batch_rows, dtype=np.int64)
        row_of = np.full(self.batch_rows, -1, dtype=np.int64)
        if self.rows is None:
            row_of[:] = np.arange(self.batch_rows)
        else:
            row_of[self.rows] = np.arange(len(self.rows))
        if self.n_idle:
            row_of[self.idle] = self.layout.rows + np.arange(self.n_idle)
        return row_of


def host_index(values, device, dtype=np.int64) -> torch.Tensor:
    """Host ints as an index tensor on `device` without a host synchronisation: on
    an accelerator through pinned memory and an asynchronous copy (a copy from
    pageable memory would wait for the whole stream)."""
    index = torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))
    if torch.device(device).type != "cpu":
        index = index.pin_memory().to(device, non_blocking=True)
    return index


def extract_support(processed_logits: torch.Tensor, layout: MaskLayout,
                    rows: np.ndarray | None = None, *,
                    implementation: str | None = None,
                    settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """Compact the finite entries of the given rows of `processed_logits`.

    `rows` (host ints, ascending) are the batch rows to extract; None means all.
    `implementation` (None: chosen for the logits) is "triton" (the kernel: on
    CUDA, or under Triton's interpreter in the CPU tests), "host" (numpy over a
    CPU tensor's own memory, `_extract_host`) or "torch" (anywhere). The
    default: the kernel on CUDA with Triton, the host path for CPU logits numpy
    reads, torch otherwise. Issues no host synchronisation on the kernel path.
    """
    batch_rows, vocab = processed_logits.shape
    picked = batch_rows if rows is None else len(rows)
    if (picked, vocab) != (layout.rows, layout.vocab_size):
        raise ValueError(f"extract_support: {picked} rows of {vocab} logits do not "
                         f"match the layout ({layout.rows}, {layout.vocab_size})")
    if implementation is None:
        implementation = ("triton" if triton is not None and processed_logits.is_cuda
                          else "host" if host_readable(processed_logits) else "torch")
    device = processed_logits.device
    block = torch.empty(HEADER + layout.numel, dtype=torch.int32, device=device)
    # The header's first entry is the kernel's slot counter; the block proper
    # starts after it, 16-byte aligned.
    if implementation == "triton":
        source = None if rows is None else host_index(rows, device, np.int32)
        _extract_triton(processed_logits, source, block, layout, settings.kernel_chunk)
    elif implementation == "host":
        if not host_readable(processed_logits):
            raise ValueError("extract_support: the host path reads float CPU tensors "
                             f"numpy can view, not {processed_logits.dtype} on "
                             f"{processed_logits.device}")
        _extract_host(processed_logits.detach().numpy(), rows,
                      block[HEADER:].numpy(), layout)
    elif implementation == "torch":
        source = None if rows is None else host_index(rows, device, np.int32)
        _extract_torch(processed_logits, source, block[HEADER:], layout,
                       settings.chunk_elements)
    else:
        raise ValueError(f"extract_support: no implementation {implementation!r} "
                         "(triton, host or torch)")
    return DeviceMask(block=block[HEADER:], layout=layout, batch_rows=batch_rows,
                      rows=None if rows is None else np.asarray(rows))


def no_rows(batch_rows: int, device) -> DeviceMask:
    """The mask of a step in which no request wants one."""
    return DeviceMask(block=torch.empty(0, dtype=torch.int32, device=device),
                      layout=MaskLayout(0, 1, 0, 1), batch_rows=batch_rows,
                      rows=np.zeros(0, dtype=np.int64))


def plan_step(top_k: np.ndarray, wanted: np.ndarray, vocab_size: int, *, max_size: int,
              worst_case: bool = False, settings: ExtractionSettings = DEFAULT_SETTINGS):
    """The host work of one step before any launch: (layout, rows), rows None
    for all; layout None when no row wants a mask. Vectorised: its cost does
    not grow with a Python loop over the batch."""
    wanted = np.asarray(wanted, dtype=bool)
    if not worst_case and not wanted.any():
        return None, None
    rows = None if worst_case or wanted.all() else np.flatnonzero(wanted)
    top_k = np.asarray(top_k)
    layout = plan_layout(top_k if rows is None else top_k[rows], vocab_size,
                         max_size=max_size, worst_case=worst_case, settings=settings)
    return layout, rows


def extract_selected(processed_logits: torch.Tensor, top_k: np.ndarray,
                     wanted: np.ndarray, *, max_size: int, worst_case: bool = False,
                     settings: ExtractionSettings = DEFAULT_SETTINGS) -> DeviceMask:
    """The sampler's entry: extract the batch rows that want a mask (`wanted`,
    a host bool per row), laid out from their host-side `top_k`. The
    memory-profiling run (`worst_case`) extracts every row at the widest."""
    layout, rows = plan_step(top_k, wanted, processed_logits.shape[1], max_size=max_size,
                             worst_case=worst_case, settings=settings)
    if layout is None:
        return no_rows(len(wanted), processed_logits.device)
    return extract_support(processed_logits, layout, rows, settings=settings)


# -- Triton ------------------------------------------------------------------
#
# Two launches, each program working on one chunk (`CHUNK` logits) of one row,
# grid (R, V / CHUNK):
#
#   `_chunk_pass`  reads each logit once and writes the chunk's count of finite
#                  ids and its packed finite bitmap (CHUNK / 32 int32 words) to a
#                  scratch of R x V / 8 bytes: the only temporary.
#   `_place_pass`  scans the row's chunk counts (a few dozen ints) for the
#                  chunk's first output position, then places ids only from the
#                  words of the chunk that hold kept ids (groups of GROUP words
#                  that are all zero are skipped; ranks within a word come from
#                  a 32-wide scan of that word's bits, positions across words
#                  from a scan over words, never over the chunk's bits). Chunks
#                  whose first position is past W do nothing. The program of
#                  chunk 0 writes the row's meta, pads its ids with -1 and, for a
#                  row wider than W, claims a slot and copies the row's bitmap
#                  words from the chunk where it crossed W onwards.
#
# The sizes that change with the batch (width, slots, offsets into the block)
# are `do_not_specialize`, and every pointer is 16-byte aligned by
# construction (fresh allocations; the slot counter sits in a 4-int header in
# front of the block, zeroed by the first pass: no memset launch), so the set of compiled variants depends only on the
# engine (logits dtype, vocabulary, row stride) and on whether a row subset is
# extracted: `warm_up` compiles all of them at start-up.

HEADER = 4          # int32 entries in front of the block: [0] is the slot counter
KERNEL_CHUNK = 4096  # logits per program
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
              layout: MaskLayout, chunk: int = KERNEL_CHUNK):
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


def _extract_triton(logits: torch.Tensor, rows: torch.Tensor | None, block: torch.Tensor,
                    layout: MaskLayout, chunk: int = KERNEL_CHUNK) -> None:
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


# -- the host ---------------------------------------------------------------
#
# On a CPU host the logits already are host memory: numpy reads them in place and
# writes the block in a dozen calls of a few microseconds each, where the same
# calls in torch cost tens (`benchmarks/bench_extraction.py --cpu-sections impl`),
# and the whole step's rows go at once (no chunks: the temporaries are one bool
# per logit and the kept ids).

_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


def host_readable(logits: torch.Tensor) -> bool:
    # `is_cpu`, not `device`: reading `device` builds a device object
    return logits.is_cpu and logits.dtype in _HOST_DTYPES


def _extract_host(x: np.ndarray, rows: np.ndarray | None, block: np.ndarray,
                  layout: MaskLayout) -> None:
    """`_extract_torch`'s block, written with numpy (`x`: the logits, `block`: the
    block proper, both host arrays)."""
    meta, ids, bits = layout.views(block)
    ids.fill(-1)
    meta[:, 1] = NOT_WIDE
    meta[:, 2] = 0
    if layout.rows == 0:
        return
    if rows is not None:
        x = x[np.asarray(rows, dtype=np.int64)]
    vocab, width = layout.vocab_size, layout.width
    keep = x > -np.inf                          # NaN compares False
    flat = np.flatnonzero(keep)
    row, col = np.divmod(flat, vocab)
    posinf = x[row, col] == np.inf              # +inf is not a finite logit
    if posinf.any():
        keep[row[posinf], col[posinf]] = False
        row, col = row[~posinf], col[~posinf]
    counts = np.bincount(row, minlength=layout.rows)
    meta[:, 0] = counts
    pos = np.arange(len(row)) - (np.cumsum(counts) - counts)[row]
    fits = pos < width
    ids[row[fits], pos[fits]] = col[fits]
    # rows wider than the size limit end with an error: they take no slot
    wide = np.flatnonzero((counts > width) & (counts <= layout.max_size))
    if len(wide):
        slots = min(len(wide), layout.slots)
        meta[wide[slots:], 1] = NO_SLOT
        meta[wide[:slots], 1] = np.arange(slots)
        padded = np.zeros((slots, layout.words * 32), dtype=bool)
        padded[:, :vocab] = keep[wide[:slots]]
        bits[:slots] = np.packbits(padded, axis=1, bitorder="little").view(np.int32)


@dataclass
class HostSupports:
    """One step's supports extracted on a CPU host, already in the host form
    (`transport.StepMasks` takes them as they are: no block, no copy, no decode):
    every extracted row's whole support, rows in order. A row wider than
    `max_size` stores no ids (its request ends with an error; `counts` says how
    wide it was). The support logprobs fields are filled by
    `support_logprobs.on_host` for the rows that asked."""

    counts: np.ndarray            # int32 [R], true support size
    ids: np.ndarray               # int32, each row's stored ids ascending
    offsets: np.ndarray           # int64 [R + 1]
    values: np.ndarray | None     # the logits at `ids` (x's dtype); None: not read
    # int64 [R]: the token each row drew where its support describes that draw
    # (the token's logit is finite and the row within the size limit), else -1;
    # None when the sampler's tokens were not handed over (see `StepMasks.drawn`)
    drawn: np.ndarray | None = None
    asked: np.ndarray | None = None      # bool [R]: rows with support logprobs
    logprobs: np.ndarray | None = None   # float32 aligned with `ids`, NaN unless asked
    log_kept: np.ndarray | None = None   # float32 [R], NaN unless asked


_NO_BLOCK = torch.empty(0, dtype=torch.int32)   # a host form's (never written)


def extract_on_host(processed_logits: torch.Tensor, rows: np.ndarray | None,
                    max_size: int, sampled: torch.Tensor | None = None, *,
                    values: bool = True) -> DeviceMask:
    """The finite entries of the given rows of CPU `processed_logits` (None: all
    rows) as a `DeviceMask` holding `HostSupports`: numpy over the logits' own
    memory, one vocabulary-wide test and one `flatnonzero` for the whole step,
    then work in the size of the supports only. With `sampled` (the sampler's
    token per batch row) it also says, per row, whether the support describes
    the draw (`HostSupports.drawn`); `values`: read the logits at the ids (what
    support logprobs are made of). Every operation counts: on a busy host each
    costs several microseconds (`python benchmarks/bench_host_step.py`, cold)."""
    x = _host_array(processed_logits)
    batch_rows, vocab = x.shape
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
    tokens = None if sampled is None else _host_array(sampled).reshape(-1)
    supports = (_native_supports(x, rows, max_size, values, tokens)
                if _supports_native is not None else None)
    if supports is None:
        supports = _numpy_supports(x if rows is None else x.take(rows, axis=0),
                                   max_size, values) + (None,)
    counts, ids, offsets, read, drawn = supports
    if tokens is not None and drawn is None:
        drawn = _numpy_drawn(x, rows, tokens, counts, max_size)
    return DeviceMask(_NO_BLOCK, _host_layout(len(counts), vocab, max_size), batch_rows,
                      rows, host=HostSupports(counts, ids, offsets, read, drawn))


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as an ndarray (`detach` only where it is needed:
    the sampler's tensors are made under inference mode)."""
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


@functools.lru_cache(maxsize=64)
def _host_layout(rows: int, vocab: int, max_size: int) -> MaskLayout:
    """The layout a host form reports (no block: its width is the size limit's)."""
    return MaskLayout(rows, max(1, min(max_size, vocab)), 0, vocab, max_size)


# `_native_supports`' room for the ids and logits of a step: R x min(V, N) of each,
# kept per thread and grown when a step needs more (a fresh one each step would cost
# more than the scan: the kernel maps and zeroes its pages), the step's own copied out
_room = threading.local()


def _room_for(items: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    ids, values = getattr(_room, "arrays", (None, None))
    if ids is None or len(ids) < items or values.dtype != dtype:
        ids = np.empty(max(items, 1 << 16), dtype=np.int32)
        values = np.empty(len(ids), dtype=dtype)
        _room.arrays = ids, values
    return ids, values


def _native_supports(x: np.ndarray, rows: np.ndarray | None, max_size: int,
                     values: bool, tokens: np.ndarray | None = None) -> tuple | None:
    """`_numpy_supports` of `x[rows]` by `_supports_native`, reading each row
    where it lies, and `_numpy_drawn` in the same pass where `tokens` are int64
    (else None in its place); None where it does not take `x` (not C-ordered, say)."""
    n = len(x) if rows is None else len(rows)
    ids, read = _room_for(n * min(x.shape[1], max_size), x.dtype)
    counts = np.empty(n, dtype=np.int32)
    offsets = np.empty(n + 1, dtype=np.int64)
    checks = tokens is not None and tokens.dtype == np.int64
    drawn = np.empty(n, dtype=np.int64) if checks else None
    stored = _supports_native.finite_support(x, rows, max_size, ids,
                                             read if values else None, counts, offsets,
                                             *((tokens, drawn) if checks else ()))
    if stored is None:
        return None
    return (counts, ids[:stored].copy(), offsets, read[:stored].copy() if values else None,
            drawn)


def _numpy_drawn(x: np.ndarray, rows: np.ndarray | None, tokens: np.ndarray,
                 counts: np.ndarray, max_size: int) -> np.ndarray:
    """Per extracted row, the token drawn from it (`tokens`, per batch row of `x`)
    where its logit is finite and the row within the size limit; -1 elsewhere."""
    source = np.arange(len(counts)) if rows is None else rows
    if rows is not None:
        tokens = tokens.take(rows)
    drawn = np.where(np.isfinite(x[source, tokens]), tokens, -1)
    drawn[counts > max_size] = -1
    return drawn


def _numpy_supports(x: np.ndarray, max_size: int, values: bool) -> tuple:
    """(counts, ids, offsets, values) of the finite entries of each row of `x`:
    each row's true count (int32), the ids it stores ascending (int32, back to
    back from `offsets[r]`, int64 [R + 1]: none for a row of more than
    `max_size`) and, with `values`, the logits at those ids (None without)."""
    n, vocab = x.shape
    flat = np.flatnonzero(np.isfinite(x))       # NaN and +inf are not finite logits
    offsets = np.searchsorted(flat, np.arange(0, (n + 1) * vocab, vocab))
    counts = np.diff(offsets).astype(np.int32)
    ids = (flat % vocab).astype(np.int32)
    read = x.reshape(-1).take(flat) if values else None
    if counts.max(initial=0) > max_size:        # stored: none (an error, not a mask)
        over = counts > max_size
        stored = ~np.repeat(over, counts)
        ids = ids[stored]
        read = None if read is None else read[stored]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.where(over, 0, counts), out=offsets[1:])
    return counts, ids, offsets, read


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
        # rows wider than the size limit end with an error: they take no slot
        for r in torch.nonzero((counts > width)
                               & (counts <= layout.max_size)).view(-1).tolist():
            if next_slot < layout.slots:
                meta[r0 + r, 1] = next_slot
                bits[next_slot] = pack_bits(keep[r * vocab: (r + 1) * vocab])
                next_slot += 1
            else:
                meta[r0 + r, 1] = NO_SLOT
