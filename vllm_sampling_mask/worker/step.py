"""`MaskStep`: one sampler call's mask in one line, plan -> extraction -> copy.

The runner adapter opens a step around the call that samples
(`SamplingMaskState.step`) and reads it once that call returned; the sampling
path's adapters fill it in order while the call runs, each stage once:

    plan        the runner adapter (V1: from the input batch, or the last steady
                step's plan while the batch is unchanged) or the sampler's
                (Model Runner V2: `Sampler.__call__`, from the input batch it gets);
                the profiling run plans every row when the sampler asks for it
    capture     made from the plan, handed by the sampler adapter to the call
                holding the scaled logits (rows that asked for support logprobs)
    mask        the extraction over the processed logits (`SamplingMaskState.extract`)
    copy        the device-to-host copy the runner adapter starts (`NO_MASKS`
                where the plan masks nothing: nothing to copy)

No capture, mask or copy outlives the step: a stage that finds the one before it missing raises
`MissingSamplingMaskError` naming its hop.
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.worker.extraction import DeviceMask
from vllm_sampling_mask.worker.transport import MaskCopy, StepWithoutMasks
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.capture import ScaledCapture
from vllm_sampling_mask.worker.plan import StepPlan

# (plan, processed logits, capture, hop=, sampled=) -> the step's mask: the state's
# `extract` (or, for one part of a verify step, a keeper of the logits that returns None)
Extractor = Callable[..., DeviceMask | None]


class MaskStep:
    """`extract`: the runner's extraction (its size limit, settings and counters);
    `worst_case`: the memory-profiling run's step (planned for every row)."""

    def __init__(self, extract: Extractor, *, worst_case: bool = False,
                 plan: StepPlan | None = None) -> None:
        self._extract = extract
        self._worst_case = worst_case
        self.plan = plan
        self.capture: ScaledCapture | None = None
        self.mask: DeviceMask | None = None
        self.copy: MaskCopy | StepWithoutMasks | None = None

    def set_plan(self, hop: str, plan: StepPlan) -> None:
        if self.plan is not None:
            raise MissingSamplingMaskError(hop, "this step was planned twice")
        self.plan = plan

    def planned(self, hop: str, batch_rows: int, *, normalise: bool = False,
                request_rows=None) -> StepPlan:
        """The plan for a sampler batch of `batch_rows` rows, with its capture
        (None when no row asked). In the profiling run, every row. A verify
        step's adapter passes `request_rows` (rows per request: its draft
        positions and the bonus position) and gets the runner's request-level
        plan as one row per position (`plan.per_token`)."""
        if self.plan is None and self._worst_case:
            self.plan = plans.worst_case(batch_rows, normalise=normalise,
                                         request_rows=request_rows)
        if self.plan is None:
            raise MissingSamplingMaskError(hop, "the runner opened this step without a plan")
        if request_rows is not None and self.plan.request_rows is None:
            self.plan = plans.per_token(self.plan, request_rows, normalise=normalise)
        if self.plan.batch_rows != batch_rows:
            raise MissingSamplingMaskError(
                hop, f"the step's plan is for {self.plan.batch_rows} rows, the sampler's "
                f"batch has {batch_rows}")
        rows = self.plan.capture_rows
        self.capture = ScaledCapture(rows) if len(rows) else None
        return self.plan

    def extract(self, hop: str, processed_logits, sampled=None) -> DeviceMask:
        """The step's mask from the logits the sampler drew from (and, where the
        sampler has them, the tokens it drew: `SamplingMaskState.extract`)."""
        if self.plan is None:
            raise MissingSamplingMaskError(hop, "the step has no plan")
        self.mask = self._extract(self.plan, processed_logits, self.capture, hop=hop,
                                  sampled=sampled)
        return self.mask

    def result(self, hop: str) -> DeviceMask:
        if self.mask is None:
            raise MissingSamplingMaskError(hop, "the sampler returned without extracting one")
        return self.mask
