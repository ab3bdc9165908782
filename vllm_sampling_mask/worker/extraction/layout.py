"""The layout of one step's extracted supports: its tunables, the block's shape, and
the two forms a step's masks take before the host decodes them.

The block of one step, `R` rows, compaction width `W`, `S` wide-row slots (one flat
int32 tensor on the device, behind a `HEADER`):

    meta  [R, 3]   count (true support size), slot, start_word
    ids   [R, W]   the first min(count, W) finite ids, ascending, then -1
    bits  [S, n_words]  packed finite mask (bit j of word w is id 32 w + j)
                   of the rows wider than W, from word `start_word` on

`W` comes from the host-side top-k of the extracted rows (the largest plus a margin for
ties), capped at the engine's `max_size` (--max-sampling-mask-size, N): a support wider
than N ends its request with an error, so nothing wider ever needs room. A row wider
than `W` but within N (ties beyond the margin) claims a slot and also writes its finite
mask as bits, from the block of the vocabulary where it crossed `W` onwards: the host
reads its first `W` ids from `ids` and the rest from `bits`, in time linear in `V / 8`.
`slot` is -1 for a row that fits, -2 for a wide row that found every slot taken (the
host turns that into a per-request error, never a truncated mask). There are a few
spare slots when `W < N`, none when `W = N`. Nothing is read back from the device to
size anything: device memory per step is at most `R x (N + 3)` int32 plus the spare
slots' `V / 8` bytes each.

On a CPU host a step's masks skip the block: `HostSupports` holds each row's whole
support back to back, as `transport.StepMasks` takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.frontend.validation import DEFAULT_MAX_SIZE

META = 3  # count, slot, start_word
# int32 entries in front of the block: [0] is the Triton kernel's slot counter; the
# block proper starts after them, 16-byte aligned
HEADER = 4
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
