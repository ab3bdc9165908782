"""`SamplingMaskState`: the model runner's one object for the sampling mask.

One instance per runner, built where upstream builds the sampler when the engine
flag is on, reached through one declared reference on the runner
(`sampling_mask`) and the same object on its sampler. It holds, each its own
small object or field:

- `max_size` (--max-sampling-mask-size) and `settings` (the layout's tunables:
  tests pass other `ExtractionSettings` instead of patching globals);
- `requests` (`MaskRequests`): per request slot or batch row, wants a mask,
  asked for support logprobs;
- `pool`: the pinned host buffers of this runner's mask copies;
- the open step (`step()`, `open`): one sampler call's `MaskStep`, from plan to
  copy, closed when the call that samples returns: no mask is kept between calls,
  and no step opens inside another;
- the last steady plan (`plan()`): the plan of a step over an unchanged batch,
  keyed by `requests.version`, which the next such step takes as it is (a plan
  says which rows to extract; it holds no mask);
- the memory-profiling switch (`profiling()`): inside it a step extracts every row
  at the widest, and on a CUDA device compiles every extraction kernel variant a
  step can launch (`extraction.warm_up`), so no batch shape compiles one while
  serving;
- the work counters the state route reports (`extractions`: served steps that
  extracted rows; `extracted_rows`; `idle_rows`: rows that wanted a mask but
  whose sample the runner discards; `steps_without_masks`: steps in which no
  row wanted a mask, which carried `transport.NO_MASKS`; the profiling run
  aside. Under tensor parallelism only the output rank has a state and
  extracts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from vllm_sampling_mask.worker import extraction
from vllm_sampling_mask.worker.extraction import (
    DEFAULT_SETTINGS,
    DeviceMask,
    ExtractionSettings,
    extract_on_host,
    extract_support,
    host_readable,
    no_rows,
    plan_layout,
)
from vllm_sampling_mask.worker import support_logprobs
from vllm_sampling_mask.worker.support_logprobs import gather_support_logprobs
from vllm_sampling_mask.worker.transport import PinnedPool
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.capture import ScaledCapture
from vllm_sampling_mask.worker.plan import StepPlan
from vllm_sampling_mask.worker.requests import MaskRequests
from vllm_sampling_mask.worker import step as steps
from vllm_sampling_mask.worker.step import MaskStep


class SamplingMaskState:
    def __init__(self, max_num_reqs: int, max_size: int,
                 settings: ExtractionSettings = DEFAULT_SETTINGS) -> None:
        self.max_size = max_size
        self.settings = settings
        self.requests = MaskRequests(max_num_reqs)
        self.pool = PinnedPool()
        self.open: MaskStep | None = None
        self._steady: tuple[tuple, StepPlan] | None = None    # (key, plan), see `plan`
        self._worst_case = False
        self.extractions = 0
        self.extracted_rows = 0
        self.idle_rows = 0
        self.steps_without_masks = 0

    # -- the step ---------------------------------------------------------

    def plan(self, slots, top_k: np.ndarray, discarded: np.ndarray | None = None, *,
             normalise: bool = False) -> StepPlan:
        """A served step's plan: the requests at `slots` (a slice of batch rows
        or an array of request slots, in batch order), their `top_k`, and the
        batch rows whose sample the runner `discarded` (None: none).

        A step over the same slice of an unchanged persistent batch (the V1
        runner's decode steps, most of its steps) with no row discarded takes
        the plan of the last such step as it is: the rows, their top-k and
        switches change only with the batch updates `requests.version` counts.
        Each array operation costs several microseconds inside a step (`python
        benchmarks/bench_step_cost.py --timers`), and a plan is a dozen."""
        steady = isinstance(slots, slice) and (discarded is None
                                                or not np.count_nonzero(discarded))
        if steady:
            key = (self.requests.version, slots.start, slots.stop, normalise)
            if self._steady is not None and self._steady[0] == key:
                return self._steady[1]
        plan = plans.plan(self.requests.wants[slots], self.requests.asked[slots], top_k,
                          None if steady else discarded, normalise=normalise)
        if steady:
            self._steady = key, plan
        return plan

    @contextmanager
    def step(self, plan: StepPlan | None = None) -> Iterator[MaskStep]:
        """Open one sampler call's step (planned now, or later by the runner
        adapter, before it samples), for the call that samples; closed on the way
        out. Steps do not nest: a verify step's parts are handed to the one open
        step (`MaskStep.in_parts`). Inside, it is also this context's open step
        (`step.open_step()`), for a wrapper with no runner or sampler at hand."""
        if self.open is not None:
            raise RuntimeError("a mask step is already open: steps do not nest")
        step = MaskStep(self.extract, worst_case=self._worst_case, plan=plan)
        self.open = step
        token = steps.open_in_context(step)
        try:
            yield step
        finally:
            self.open = None
            steps.close_in_context(token)

    # -- the memory-profiling run -----------------------------------------

    @property
    def worst_case(self) -> bool:
        return self._worst_case

    @contextmanager
    def profiling(self) -> Iterator[MaskStep]:
        """Inside: an open step that extracts with the largest layout a step can
        use, so the KV cache is sized with the mask's largest per-step device
        memory."""
        self._worst_case = True
        try:
            with self.step() as step:
                yield step
        finally:
            self._worst_case = False

    # -- extraction -------------------------------------------------------

    def extract(self, plan: StepPlan, processed_logits, capture: ScaledCapture | None = None,
                *, hop: str = "SamplingMaskState.extract", sampled=None) -> DeviceMask:
        """The plan's rows of `processed_logits` (what the sampler drew from) as one
        step's `DeviceMask`, with the support logprobs of the rows that asked
        (from the scaled top logprob `capture` recorded; `plan.normalise`: the
        logits are not logprobs yet). The idle rows ride on it (`DeviceMask.idle`).
        `sampled`, the sampler's token per batch row where the caller has it (the
        V1 sampler): on a CPU host the extraction then also says which rows'
        supports describe their draw, so the scheduler checks a kept token by one
        comparison (`StepMasks.drawn`)."""
        n_rows, idle = plan.n_rows, len(plan.idle)
        if n_rows == 0:
            mask = no_rows(processed_logits.shape[0], processed_logits.device)
        elif self.settings.implementation is None and host_readable(processed_logits):
            mask = extract_on_host(processed_logits, plan.rows, self.max_size, sampled,
                                   values=capture is not None)
            if capture is not None:
                support_logprobs.on_host(mask, plan.asked, capture.result(hop),
                                         processed_logits, normalise=plan.normalise)
        else:
            layout = plan_layout(plan.top_k, processed_logits.shape[1],
                                 max_size=self.max_size, worst_case=plan.worst_case,
                                 settings=self.settings)
            mask = extract_support(processed_logits, layout, plan.rows,
                                   implementation=self.settings.implementation,
                                   settings=self.settings)
            if capture is not None:
                mask.support_logprobs = gather_support_logprobs(
                    processed_logits, None, mask, plan.asked, scaled_top=capture.result(hop),
                    normalise=plan.normalise)
        if idle:
            mask.idle = plan.idle
        mask.request_rows = plan.request_rows
        if plan.worst_case:
            if processed_logits.is_cuda:
                self._warm_up(processed_logits)
        else:
            self.idle_rows += idle
            if n_rows:
                self.extractions += 1
                self.extracted_rows += n_rows
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
