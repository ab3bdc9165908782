"""`SamplingMaskState`: everything one model runner keeps for the sampling mask.

In the style of Model Runner V2's per-concern `*State` classes (`PenaltiesState`,
`SamplingStates`): one instance per runner, built where upstream builds the
sampler when the engine flag is on, reached through one declared reference on
the runner (`sampling_mask`) and the same object on its sampler. The runner
patches are thin adapters between upstream's calls and this object; nothing of
vLLM is imported here.

It owns:
- `max_size` (--max-sampling-mask-size) and `settings` (the layout's tunables:
  tests pass other `ExtractionSettings` instead of patching globals);
- `wants`: per request slot (Model Runner V2) or persistent-batch row (the V1
  runner), does that request want a mask; set when the request is added,
  cleared when it is removed, moved with the V1 batch's condense and swaps, so
  a step reads it with one numpy index and no loop over rows;
- `asked`: beside `wants`, per slot or row, does that request want its support
  logprobs (`return_sampling_mask_logprobs`); kept the same way. For the rows
  that asked, `extract` also gathers them (`support_logprobs`) onto the
  `DeviceMask`; the samplers hand it the scaled distribution's largest logprob
  (`begin_capture` / `capture_scaled`, at the seam where the temperature-scaled
  logits exist); rows that did not ask cost nothing;
- the memory-profiling run's worst case (`profiling()`), which also compiles,
  on a CUDA device, every extraction kernel variant a step can launch
  (`extraction.warm_up`, for the logits' dtype and row stride, and for float32
  rows), so no batch shape compiles one while serving;
- the rows a step extracts: those whose request wants a mask, less the rows
  whose sample the runner discards this step (a partial prefill chunk: the
  runner's own host-side record of them, `discarded`, one bool per batch row,
  combined by `wanted & ~discarded`, no loop over rows). Those rows are not
  extracted, take no width and no wide-row slot, and decode as sampled
  nothing (count 0), as before;
- `extractions`: the served steps in which it extracted rows; `extracted_rows`:
  the rows it extracted in them; `idle_rows`: the rows that wanted a mask but
  were left out because their sample is discarded (the profiling run aside;
  diagnostics the state route reports: under tensor parallelism only the
  output rank has a state and extracts);
- `pool`: the pinned host buffers of this runner's mask copies;
- the step's hand-offs: `mask`, the device mask from the sampler's `sample`
  to the call that returns it (`mask.put` / `mask.take`); `copy`, the started
  copy from Model Runner V2's `sample` to its `sample_tokens`; the batch's
  host top-k from the V1 runner to its sampler (`stage_top_k` /
  `take_top_k`); and the batch's discarded rows from the runner (V1's
  `_sample`, Model Runner V2's `Sampler.__call__`) to the sampler's `sample`
  (`stage_discarded` / `take_discarded`). A `take` that finds nothing raises
  `MissingSamplingMaskError` naming the hop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Generic, TypeVar

import numpy as np
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask import extraction
from vllm_sampling_mask.extraction import (
    DEFAULT_SETTINGS,
    DeviceMask,
    ExtractionSettings,
    extract_selected,
)
from vllm_sampling_mask.support_logprobs import gather_support_logprobs, scaled_top_logprob
from vllm_sampling_mask.transport import MaskCopy, PinnedPool
from vllm_sampling_mask.validation import wants_mask, wants_support_logprobs


T = TypeVar("T")


class HandOff(Generic[T]):
    """One value passed from one call to a later one of the same step."""

    def __init__(self, missing: str) -> None:
        self._value: T | None = None
        self._missing = missing   # what it means when `take` finds nothing

    def put(self, value: T) -> None:
        self._value = value

    @property
    def pending(self) -> bool:
        return self._value is not None

    def take(self, hop: str) -> T:
        """The value, once; MissingSamplingMaskError naming `hop` if none was put."""
        value, self._value = self._value, None
        if value is None:
            raise MissingSamplingMaskError(hop, self._missing)
        return value


class SamplingMaskState:
    def __init__(self, max_num_reqs: int, max_size: int,
                 settings: ExtractionSettings = DEFAULT_SETTINGS) -> None:
        self.max_size = max_size
        self.settings = settings
        self.wants = np.zeros(max_num_reqs, dtype=bool)
        self.asked = np.zeros(max_num_reqs, dtype=bool)
        self._capture_rows: np.ndarray | None = None
        self._scaled_top = None
        self.pool = PinnedPool()
        self._worst_case = False
        self.mask: HandOff[DeviceMask] = HandOff("the sampler returned without extracting one")
        self.copy: HandOff[MaskCopy] = HandOff("no mask copy was started for this step")
        self._top_k: np.ndarray | None = None
        self._discarded: np.ndarray | None = None
        self.extractions = 0
        self.extracted_rows = 0
        self.idle_rows = 0

    # -- per request slot -------------------------------------------------

    def add_request(self, slot: int, sampling_params) -> None:
        """Record the input processor's decision (`validation.wants_mask`)."""
        self.wants[slot] = sampling_params is not None and wants_mask(sampling_params)
        self.asked[slot] = (sampling_params is not None
                            and wants_support_logprobs(sampling_params))

    def remove_request(self, slot: int) -> None:
        self.wants[slot] = False
        self.asked[slot] = False

    def apply_batch_update(self, added: Iterable, removed: Iterable[int],
                           moved: Iterable[tuple[int, int, bool]]) -> None:
        """Follow a persistent batch's changes, in the order its logits
        processors apply them: `added` (slot, sampling params, ...), `removed`
        slots, then `moved` (from, to, swap): a swap exchanges two rows, a move
        copies `from` into `to` (condense)."""
        for slot, params, *_ in added:
            self.add_request(slot, params)
        for slot in removed:
            self.remove_request(slot)
        for a, b, swap in moved:
            for flags in (self.wants, self.asked):
                if swap:
                    flags[[a, b]] = flags[[b, a]]
                else:
                    flags[b] = flags[a]

    # -- the memory-profiling run -----------------------------------------

    @property
    def worst_case(self) -> bool:
        return self._worst_case

    @contextmanager
    def profiling(self) -> Iterator[None]:
        """Inside: extract with the largest layout a step can use, so the KV
        cache is sized with the mask's largest per-step device memory."""
        self._worst_case = True
        try:
            yield
        finally:
            self._worst_case = False

    # -- one step ---------------------------------------------------------

    def begin_capture(self, asked: np.ndarray) -> bool:
        """Before the sampler runs: the batch rows (`asked`, host bool per row)
        whose scaled distribution `capture_scaled` must record. False (nothing
        to record) when no row asked."""
        self._scaled_top = None
        rows = np.flatnonzero(asked)
        self._capture_rows = rows if len(rows) else None
        return self._capture_rows is not None

    def capture_scaled(self, scaled_logits) -> None:
        """Where the sampler holds the temperature-scaled logits (before min-p,
        top-k, top-p): record, for the rows `begin_capture` named, the log of
        their largest probability (`support_logprobs.scaled_top_logprob`)."""
        if self._capture_rows is not None:
            self._scaled_top = scaled_top_logprob(scaled_logits, self._capture_rows)
            self._capture_rows = None

    @property
    def capture_pending(self) -> bool:
        """`begin_capture` named rows that `capture_scaled` has not recorded yet."""
        return self._capture_rows is not None

    def end_capture(self) -> None:
        self._capture_rows = None

    @contextmanager
    def capturing(self, asked: np.ndarray) -> Iterator[None]:
        """Around the sampler's `sample`: `begin_capture(asked)`, and, when a row
        asked, this state is the one `capturing_state()` returns to the adapters'
        seam where the scaled logits exist (a static method there has no reference
        to the sampler); `end_capture` on the way out."""
        token = _CAPTURING.set(self) if self.begin_capture(asked) else None
        try:
            yield
        finally:
            if token is not None:
                _CAPTURING.reset(token)
            self.end_capture()

    def extract(self, processed_logits, top_k: np.ndarray, wanted: np.ndarray,
                asked: np.ndarray | None = None, *, discarded: np.ndarray | None = None,
                normalise: bool = False) -> DeviceMask:
        """The support of the rows that want a mask (`wanted`, host bool per row)
        and whose sample the runner keeps (not `discarded`, host bool per row: a
        partial prefill chunk), with, for the rows in `asked`, their support
        logprobs (from the scaled distribution `capture_scaled` recorded;
        `normalise`: `processed_logits` are logits, not logprobs). The rows
        left out for `discarded` ride on the mask as `DeviceMask.idle` (they
        decode as sampled nothing). The profiling run extracts every row."""
        wanted = np.asarray(wanted, dtype=bool)
        idle = None
        if discarded is not None and not self._worst_case:
            discarded = np.asarray(discarded, dtype=bool)
            idle = np.flatnonzero(wanted & discarded)
            wanted = wanted & ~discarded
            if asked is not None:
                asked = np.asarray(asked, dtype=bool) & ~discarded
        mask = extract_selected(processed_logits, top_k, wanted, max_size=self.max_size,
                                worst_case=self._worst_case, settings=self.settings)
        if idle is not None and len(idle):
            mask.idle = idle
        if not self._worst_case:
            self.idle_rows += mask.n_idle
            if mask.layout.rows:
                self.extractions += 1
                self.extracted_rows += mask.layout.rows
        if asked is not None and mask.layout.rows and np.any(asked):
            scaled_top, self._scaled_top = self._scaled_top, None
            if scaled_top is None:
                raise MissingSamplingMaskError(
                    "SamplingMaskState.extract", "rows asked for support logprobs but "
                    "the sampler recorded no temperature-scaled logits")
            block_asked = np.asarray(asked, bool)
            if mask.rows is not None:
                block_asked = block_asked[mask.rows]
            mask.support_logprobs = gather_support_logprobs(
                processed_logits, None, mask, block_asked, scaled_top=scaled_top,
                normalise=normalise)
        if self._worst_case and processed_logits.is_cuda:
            self._warm_up(processed_logits)
        return mask

    def _warm_up(self, logits) -> None:
        """Compile every kernel variant a step can launch: for the profiling run's
        logits, and for the contiguous float32 rows a sampler extracts from once
        it processes logits (Model Runner V2's profiling batch needs no
        processing and hands over the model's own dtype)."""
        vocab = logits.shape[1]
        for dtype, stride in {(logits.dtype, logits.stride(0)), (torch.float32, vocab)}:
            extraction.warm_up(logits.device, vocab, (dtype,), max_size=self.max_size,
                               logits_stride=stride, settings=self.settings)

    def stage_top_k(self, top_k: np.ndarray) -> None:
        self._top_k = top_k

    def take_top_k(self, hop: str, rows: int) -> np.ndarray:
        top_k, self._top_k = self._top_k, None
        if top_k is None or len(top_k) != rows:
            raise MissingSamplingMaskError(
                hop, f"the runner did not hand over the batch's top-k for {rows} rows")
        return top_k

    def stage_discarded(self, discarded: np.ndarray) -> None:
        """The step's batch rows (host bool per row) whose sampled token the
        runner discards (partial prefill chunks), from the runner's own host
        arrays for the step."""
        self._discarded = discarded

    def take_discarded(self, hop: str, rows: int) -> np.ndarray:
        discarded, self._discarded = self._discarded, None
        if discarded is None or len(discarded) != rows:
            raise MissingSamplingMaskError(
                hop, f"the runner did not hand over the batch's discarded rows for "
                f"{rows} rows")
        return np.asarray(discarded, dtype=bool)


_CAPTURING: ContextVar[SamplingMaskState | None] = ContextVar("sampling_mask_capture",
                                                              default=None)


def capturing_state() -> SamplingMaskState | None:
    """The state whose sampler is inside `sample` with rows that asked for support
    logprobs (`SamplingMaskState.capturing`), or None."""
    return _CAPTURING.get()


@contextmanager
def profiling(state: SamplingMaskState | None) -> Iterator[None]:
    """`state.profiling()`, or nothing for a runner without a mask state."""
    if state is None:
        yield
    else:
        with state.profiling():
            yield
