"""`MaskStep`: one sampler call's mask in one line, plan -> capture -> extraction -> copy.

The runner adapter opens a step around the call that samples
(`SamplingMaskState.step`) and reads it once that call returned; the sampling
path's adapters fill it in order while the call runs, each stage once, each by
the one adapter that owns it:

    plan        the runner adapter, from the input batch on the host (V1: or the
                last steady step's plan while the batch is unchanged; Model Runner
                V2: in `GPUModelRunner.sample`, before it samples); the profiling
                run plans every row when the sampler asks for it (`planned`)
    capture     made from the plan for the sampler's batch (`planned`), handed by
                the sampler adapter to the call holding the scaled logits (rows
                that asked for support logprobs)
    mask        the extraction over the processed logits (`SamplingMaskState.extract`)
    copy        the device-to-host copy the runner adapter starts (`NO_MASKS`
                where the plan masks nothing: nothing to copy)

A verify step (speculative decoding) takes its processed logits in parts: the
rejection sampler's adapter declares, once planned, which of the step's batch
rows each hop hands (`in_parts`: e.g. the bonus positions from the plain
sampler's adapter, the draft positions from a wrapper of the rejection
sampler's own processing, or every position from the sampler's processing in
chunks); each of those hops takes its next rows (`piece`, with their capture)
and hands their processed logits (`hand`); the step then puts the parts in
logit-row order and extracts once (`extract_parts`).

No capture, mask or copy outlives the step: a stage that finds the one before it
missing raises `MissingSamplingMaskError` naming its hop, and so does a part
that was never handed, naming the hop that owed it. Each stage is set through its
method (`set_plan`, `planned`, `in_parts`, `extract` or `no_mask_rows`, `set_copy`)
and read through its property; one set twice raises `MaskStepOrderError`, except in
the memory-profiling run, whose step lasts across the several sampler calls of
upstream's dummy run (each plans every row and extracts afresh).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from functools import cached_property

import numpy as np
import torch

from vllm_sampling_mask.errors import MaskStepOrderError, MissingSamplingMaskError
from vllm_sampling_mask.worker.extraction import DeviceMask, host_index
from vllm_sampling_mask.worker.transport import MaskCopy, StepWithoutMasks
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.capture import ScaledCapture, merged, part_capture
from vllm_sampling_mask.worker.plan import StepPlan

# (plan, processed logits, capture, hop=, sampled=) -> the step's mask (the state's `extract`)
Extractor = Callable[..., DeviceMask]

# The step open in this thread (or task): set and reset by `SamplingMaskState.step`.
_OPEN: ContextVar[MaskStep | None] = ContextVar("sampling_mask_step", default=None)


def step_of(state) -> MaskStep | None:
    """The step open in a runner's mask state (`SamplingMaskState.open`): None with
    the flag off (no state) and outside a step."""
    return None if state is None else state.open


def open_step() -> MaskStep | None:
    """The step open in this context, for a wrapper of an upstream module
    function (no runner or sampler to reach the runner's state through)."""
    return _OPEN.get()


class Piece:
    """The next rows of a verify step's batch that one call of `hop` processes:
    `rows` (ascending, the step's batch rows), their `capture` (numbered in the
    call's own batch; None when none of them asked), and, where the caller
    needs it, `plan` (the call's batch as a plan of its own, `plan.part`)."""

    def __init__(self, hop: str, rows: np.ndarray, whole: StepPlan,
                 capture: ScaledCapture | None) -> None:
        self.hop = hop
        self.rows = rows
        self.capture = capture
        self._whole = whole

    @cached_property
    def plan(self) -> StepPlan:
        return plans.part(self._whole, self.rows)


class _Part:
    """What one hop owes a verify step: its rows, how many it handed, the
    pieces it handed, and (optionally) its rows as a device index the caller
    already has."""

    def __init__(self, rows: np.ndarray, index) -> None:
        self.rows = rows
        self.index = index
        self.handed = 0
        self.pieces: list[tuple[Piece, torch.Tensor]] = []


class MaskStep:
    """`extract`: the runner's extraction (its size limit, settings and counters);
    `worst_case`: the memory-profiling run's step (planned for every row)."""

    def __init__(self, extract: Extractor, *, worst_case: bool = False,
                 plan: StepPlan | None = None) -> None:
        self._extract = extract
        self._worst_case = worst_case
        # the stages, each set once through its method (read through the properties)
        self._plan = plan
        self._capture: ScaledCapture | None = None
        self._mask: DeviceMask | None = None
        self._copy: MaskCopy | StepWithoutMasks | None = None
        self._parts: dict[str, _Part] | None = None
        self._taking = False    # parts are handed from `in_parts` until the extraction
        self._captured = False  # `planned` made the capture (None where no row asked)

    @property
    def plan(self) -> StepPlan | None:
        return self._plan

    @property
    def capture(self) -> ScaledCapture | None:
        """The support-logprob capture of the rows that asked (`planned`)."""
        return self._capture

    @property
    def mask(self) -> DeviceMask | None:
        return self._mask

    @property
    def copy(self) -> MaskCopy | StepWithoutMasks | None:
        return self._copy

    def _once(self, hop: str, stage: str, done: bool) -> None:
        if done and not self._worst_case:
            raise MaskStepOrderError(hop, f"this step's {stage} was set twice")

    # -- plan and capture ---------------------------------------------------

    def set_plan(self, hop: str, plan: StepPlan) -> None:
        if self._plan is not None:
            raise MaskStepOrderError(hop, "this step was planned twice")
        self._plan = plan

    def planned(self, hop: str, batch_rows: int, *, normalise: bool = False,
                request_rows=None) -> StepPlan:
        """The plan for a sampler batch of `batch_rows` rows, with its capture
        (None when no row asked). In the profiling run, every row. A verify
        step's adapter passes `request_rows` (rows per request: its draft
        positions and the bonus position) and gets the runner's request-level
        plan as one row per position (`plan.per_token`)."""
        if self._plan is None and self._worst_case:
            self._plan = plans.worst_case(batch_rows, normalise=normalise,
                                         request_rows=request_rows)
        if self._plan is None:
            raise MissingSamplingMaskError(hop, "the runner opened this step without a plan")
        if request_rows is not None and self._plan.request_rows is None:
            self._plan = plans.per_token(self._plan, request_rows, normalise=normalise)
        if self._plan.batch_rows != batch_rows:
            raise MissingSamplingMaskError(
                hop, f"the step's plan is for {self._plan.batch_rows} rows, the sampler's "
                f"batch has {batch_rows}")
        self._once(hop, "capture", self._captured)
        self._captured = True
        rows = self._plan.capture_rows
        self._capture = ScaledCapture(rows) if len(rows) else None
        return self._plan

    # -- a verify step's parts ----------------------------------------------

    def in_parts(self, hop: str, parts: Mapping[str, np.ndarray],
                 index: Mapping[str, torch.Tensor] | None = None) -> None:
        """This (planned) step takes its processed logits in parts: `parts[h]`
        the batch rows (host ints, ascending) hop `h` hands, in one or more
        pieces in row order; together they are every row once. `index[h]`:
        those rows as a device index the caller already has (else made from
        the host rows where needed)."""
        if self._plan is None:
            raise MissingSamplingMaskError(hop, "the step has no plan to take in parts")
        self._once(hop, "parts", self._parts is not None)
        total = sum(len(rows) for rows in parts.values())
        if total != self._plan.batch_rows:
            raise MissingSamplingMaskError(
                hop, f"parts of {total} rows for a step of {self._plan.batch_rows}")
        index = index or {}
        self._parts = {h: _Part(np.asarray(rows, dtype=np.int64), index.get(h))
                       for h, rows in parts.items()}
        self._taking = True

    def takes(self, hop: str) -> bool:
        """Whether this step takes a part of its processed logits from `hop` (until
        it extracted: a later call of that hop in the same step is upstream's)."""
        return self._taking and hop in self._parts

    def piece(self, hop: str, batch_rows: int) -> Piece:
        """The next `batch_rows` rows of `hop`'s part, with their capture."""
        part = self._parts[hop]
        first, last = part.handed, part.handed + batch_rows
        if last > len(part.rows):
            raise MissingSamplingMaskError(
                hop, f"it processes {last} rows of the verify step, its part has "
                f"{len(part.rows)}")
        rows = part.rows[first:last]
        part.handed = last
        return Piece(hop, rows, self._plan, part_capture(self._capture, rows))

    def hand(self, piece: Piece, processed_logits: torch.Tensor) -> None:
        """`piece`'s processed logits (one row per `piece.rows`), kept for the
        step's one extraction."""
        if processed_logits.shape[0] != len(piece.rows):
            raise MissingSamplingMaskError(
                piece.hop, f"handed {processed_logits.shape[0]} rows of processed "
                f"logits for {len(piece.rows)}")
        self._parts[piece.hop].pieces.append((piece, processed_logits))

    def extract_parts(self, hop: str) -> DeviceMask:
        """The step's mask from its parts, in logit-row order: one part's pieces
        as they are (one) or concatenated, several parts' written into one
        float32 buffer at their rows; their captures merged into the step's."""
        if self._parts is None:
            raise MissingSamplingMaskError(hop, "the step was not declared in parts")
        pieces = []
        for owner, part in self._parts.items():
            got = sum(len(piece.rows) for piece, _ in part.pieces)
            if got != len(part.rows):
                raise MissingSamplingMaskError(
                    owner, f"it handed {got} of its {len(part.rows)} rows of the verify "
                    f"step's processed logits ({hop} extracts them)")
            pieces += part.pieces
        if not pieces:
            raise MissingSamplingMaskError(hop, "a verify step without rows")
        first = pieces[0][1]
        if len(self._parts) == 1:
            processed = (first if len(pieces) == 1
                         else torch.cat([p.to(torch.float32) for _, p in pieces]))
        else:
            processed = torch.empty((self._plan.batch_rows, first.shape[1]),
                                    dtype=torch.float32, device=first.device)
            for part in self._parts.values():
                if part.index is not None and len(part.pieces) == 1:
                    processed[part.index] = part.pieces[0][1]
                    continue
                for piece, logits in part.pieces:
                    processed[host_index(piece.rows, first.device)] = logits
        if self._capture is not None:
            for piece, _ in pieces:
                if piece.capture is not None:
                    piece.capture.result(piece.hop)
            self._capture.scaled_top = merged(
                self._plan.batch_rows, [(piece.rows, piece.capture) for piece, _ in pieces],
                hop, first.device)
        return self.extract(hop, processed)

    # -- mask -----------------------------------------------------------------

    def extract(self, hop: str, processed_logits, sampled=None) -> DeviceMask:
        """The step's mask from the logits the sampler drew from (and, where the
        sampler has them, the tokens it drew: `SamplingMaskState.extract`)."""
        if self._plan is None:
            raise MissingSamplingMaskError(hop, "the step has no plan")
        self._once(hop, "mask", self._mask is not None)
        self._taking = False
        self._mask = self._extract(self._plan, processed_logits, self._capture, hop=hop,
                                  sampled=sampled)
        return self._mask

    def no_mask_rows(self, hop: str, mask: DeviceMask) -> None:
        """The step's mask where the plan extracts no row (a mask of idle rows only)."""
        self._once(hop, "mask", self._mask is not None)
        self._mask = mask

    # -- copy -----------------------------------------------------------------

    def set_copy(self, hop: str, copy: MaskCopy | StepWithoutMasks) -> None:
        """The device-to-host copy of the step's mask the runner adapter started
        (`NO_MASKS` where the plan masks nothing)."""
        self._once(hop, "copy", self._copy is not None)
        self._copy = copy

    def result(self, hop: str) -> DeviceMask:
        if self._mask is None:
            raise MissingSamplingMaskError(hop, "the sampler returned without extracting one")
        return self._mask


def open_in_context(step: MaskStep):
    return _OPEN.set(step)


def close_in_context(token) -> None:
    _OPEN.reset(token)
