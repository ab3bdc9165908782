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
- the memory-profiling run's worst case (`profiling()`), which also compiles,
  on a CUDA device, every extraction kernel variant a step can launch
  (`extraction.warm_up`, for the logits' dtype and row stride), so no batch
  shape compiles one while serving;
- `extractions`: the steps it extracted (a diagnostic the state route reports:
  under tensor parallelism only the output rank has a state and extracts);
- `pool`: the pinned host buffers of this runner's mask copies;
- the step's hand-offs: `mask`, the device mask from the sampler's `sample`
  to the call that returns it (`mask.put` / `mask.take`); `copy`, the started
  copy from Model Runner V2's `sample` to its `sample_tokens`; and the batch's
  host top-k from the V1 runner to its sampler (`stage_top_k` /
  `take_top_k`). A `take` that finds nothing raises `MissingSamplingMaskError`
  naming the hop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import numpy as np

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask import extraction
from vllm_sampling_mask.extraction import (
    DEFAULT_SETTINGS,
    DeviceMask,
    ExtractionSettings,
    extract_selected,
)
from vllm_sampling_mask.transport import MaskCopy, PinnedPool
from vllm_sampling_mask.validation import wants_mask


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
        self.pool = PinnedPool()
        self._worst_case = False
        self.mask: HandOff[DeviceMask] = HandOff("the sampler returned without extracting one")
        self.copy: HandOff[MaskCopy] = HandOff("no mask copy was started for this step")
        self._top_k: np.ndarray | None = None
        self.extractions = 0

    # -- per request slot -------------------------------------------------

    def add_request(self, slot: int, sampling_params) -> None:
        """Record the input processor's decision (`validation.wants_mask`)."""
        self.wants[slot] = sampling_params is not None and wants_mask(sampling_params)

    def remove_request(self, slot: int) -> None:
        self.wants[slot] = False

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
            if swap:
                self.wants[[a, b]] = self.wants[[b, a]]
            else:
                self.wants[b] = self.wants[a]

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

    def extract(self, processed_logits, top_k: np.ndarray, wanted: np.ndarray) -> DeviceMask:
        """The support of the rows that want a mask (`wanted`, host bool per row)."""
        self.extractions += 1
        mask = extract_selected(processed_logits, top_k, wanted, max_size=self.max_size,
                                worst_case=self._worst_case, settings=self.settings)
        if self._worst_case and processed_logits.is_cuda:
            extraction.warm_up(processed_logits.device, processed_logits.shape[1],
                               (processed_logits.dtype,), max_size=self.max_size,
                               logits_stride=processed_logits.stride(0),
                               settings=self.settings)
        return mask

    def stage_top_k(self, top_k: np.ndarray) -> None:
        self._top_k = top_k

    def take_top_k(self, hop: str, rows: int) -> np.ndarray:
        top_k, self._top_k = self._top_k, None
        if top_k is None or len(top_k) != rows:
            raise MissingSamplingMaskError(
                hop, f"the runner did not hand over the batch's top-k for {rows} rows")
        return top_k


@contextmanager
def profiling(state: SamplingMaskState | None) -> Iterator[None]:
    """`state.profiling()`, or nothing for a runner without a mask state."""
    if state is None:
        yield
    else:
        with state.profiling():
            yield
