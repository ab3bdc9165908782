"""`MaskStep`'s stages and a verify step's parts: one owner per stage, the parts
assembled in logit-row order for one extraction, a missing part naming its hop."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from vllm_sampling_mask.errors import MaskStepOrderError, MissingSamplingMaskError
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.extraction import ExtractionSettings
from vllm_sampling_mask.worker.state import SamplingMaskState
from vllm_sampling_mask.worker.step import MaskStep, open_step
from vllm_sampling_mask.worker.transport import NO_MASKS, MaskCopy

FORMS = {"host form": ExtractionSettings(),
         "block": ExtractionSettings(implementation="host")}
VOCAB = 64
BONUS, DRAFTS, HOP = "bonus hop", "draft hop", "verify hop"


def _verify_case(seed: int = 0):
    """A verify step of three requests with 2, 0 and 3 drafts (rows 0-2, 3, 4-7; the
    bonus rows 2, 3 and 7), random processed logits with a different support per
    row, and its plan per position: request 1 wants no mask, request 2 asked for
    support logprobs."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, VOCAB, generator=g)
    logits[torch.rand(8, VOCAB, generator=g) < 0.7] = float("-inf")
    request = plans.plan(np.array([True, False, True]), np.array([False, False, True]),
                         np.array([40, 10, 50]))
    request_rows = np.array([3, 1, 4])
    plan = plans.per_token(request, request_rows, normalise=True)
    bonus = np.cumsum(request_rows) - 1
    drafts = np.setdiff1d(np.arange(8), bonus)
    return logits, request, request_rows, plan, bonus, drafts


def _host(mask, rows):
    return MaskCopy(mask, pool=None).result(np.ones(rows))


@pytest.mark.parametrize("form", FORMS)
def test_parts_are_assembled_in_logit_row_order_and_extracted_once(form):
    """Two hops hand their rows (the drafts in two pieces, as a chunked call does);
    the step's one mask equals the extraction over the whole processed logits, and
    the support logprobs equal those of one capture over every row."""
    logits, request, request_rows, plan, bonus, drafts = _verify_case()
    reference = SamplingMaskState(4, VOCAB, FORMS[form])
    with reference.step(request) as step:
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        step.capture.record(logits)
        whole = _host(step.extract(HOP, logits), 8)

    state = SamplingMaskState(4, VOCAB, FORMS[form])
    with state.step(request) as step:
        assert open_step() is step
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        step.in_parts(HOP, {BONUS: bonus, DRAFTS: drafts})
        assert step.takes(BONUS) and step.takes(DRAFTS) and not step.takes("other")
        for hop, rows, sizes in ((DRAFTS, drafts, (3, 2)), (BONUS, bonus, (3,))):
            first = 0
            for n in sizes:
                piece = step.piece(hop, n)
                assert piece.rows.tolist() == rows[first:first + n].tolist()
                if piece.capture is not None:          # the asked rows, numbered as the call's
                    assert (rows[first:first + n][piece.capture.rows] >= 4).all()
                    piece.capture.record(logits[piece.rows])
                step.hand(piece, logits[piece.rows])
                first += n
        mask = step.extract_parts(HOP)
        assert not step.takes(BONUS)    # a later call of a part's hop is upstream's
    assert open_step() is None and mask.request_rows.tolist() == [3, 1, 4]
    parts = _host(mask, 8)
    for row in range(8):
        assert parts.row(row).tolist() == whole.row(row).tolist()
        assert parts.asked(row) == whole.asked(row)
        if whole.asked(row):
            np.testing.assert_allclose(parts.row_logprobs(row), whole.row_logprobs(row),
                                       rtol=1e-6)
    assert [r for r in range(8) if parts.asked(r)] == [4, 5, 6, 7]
    assert state.extractions == 1


def test_one_part_in_one_piece_is_extracted_as_handed_and_chunks_are_concatenated():
    """No copy of the logits where the sampler handed one tensor for every row; the
    pieces of a chunked call are concatenated in order."""
    logits, request, request_rows, _, _, _ = _verify_case()
    seen = []

    def extract(plan, processed, capture, *, hop, sampled=None):
        seen.append(processed)
        return "mask"

    for sizes in ((8,), (4, 1, 3)):
        step = MaskStep(extract, plan=request)
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        step.in_parts(HOP, {"processing": np.arange(8)})
        first = 0
        for n in sizes:
            piece = step.piece("processing", n)
            chunk = logits if n == len(logits) else logits[first:first + n]
            if piece.capture is not None:
                piece.capture.record(chunk)
            step.hand(piece, chunk)
            first += n
        assert step.extract_parts(HOP) == "mask"
    assert seen[0] is logits                                    # as handed
    assert seen[1] is not logits and torch.equal(seen[1], logits)


def test_a_missing_part_or_a_piece_past_its_part_names_its_hop():
    logits, request, request_rows, plan, bonus, drafts = _verify_case()
    state = SamplingMaskState(4, VOCAB)
    with state.step(request) as step:
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        step.in_parts(HOP, {BONUS: bonus, DRAFTS: drafts})
        step.hand(step.piece(BONUS, 3), logits[bonus])
        with pytest.raises(MissingSamplingMaskError, match=f"at {DRAFTS}: it handed 0 of its 5"):
            step.extract_parts(HOP)
        with pytest.raises(MissingSamplingMaskError, match=f"at {BONUS}: it processes 4 rows"):
            step.piece(BONUS, 1)
        piece = step.piece(DRAFTS, 2)
        with pytest.raises(MissingSamplingMaskError, match=f"at {DRAFTS}: handed 3 rows"):
            step.hand(piece, logits[:3])
        step.hand(piece, logits[drafts[:2]])
        with pytest.raises(MissingSamplingMaskError, match=f"at {DRAFTS}: it handed 2 of its 5"):
            step.extract_parts(HOP)
        assert step.mask is None
    with state.step(request) as step:   # a step not taken in parts
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        with pytest.raises(MissingSamplingMaskError, match=f"at {HOP}: .*not declared in parts"):
            step.extract_parts(HOP)
        with pytest.raises(MissingSamplingMaskError, match=f"at {HOP}: parts of 7 rows"):
            step.in_parts(HOP, {BONUS: bonus, DRAFTS: drafts[1:]})
    with state.step() as step:
        with pytest.raises(MissingSamplingMaskError, match=f"at {HOP}: the step has no plan"):
            step.in_parts(HOP, {BONUS: bonus, DRAFTS: drafts})


def test_each_stage_is_set_once_except_in_the_profiling_run():
    logits, request, request_rows, plan, bonus, drafts = _verify_case()
    state = SamplingMaskState(4, VOCAB)
    unasked = plans.plan(np.ones(3, bool), np.zeros(3, bool), np.full(3, 8))
    with state.step(unasked) as step:   # no row asked: no capture, planned once all the same
        step.planned("sampler", 3)
        with pytest.raises(MaskStepOrderError, match="at sampler: .*capture was set twice"):
            step.planned("sampler", 3)
    with state.step(request) as step:
        with pytest.raises(MaskStepOrderError, match="at the runner: .*planned twice"):
            step.set_plan("the runner", request)
        step.planned(HOP, 8, normalise=True, request_rows=request_rows)
        with pytest.raises(MaskStepOrderError, match="at sampler: .*capture was set twice"):
            step.planned("sampler", 8, normalise=True, request_rows=request_rows)
        step.in_parts(HOP, {BONUS: bonus, DRAFTS: drafts})
        with pytest.raises(MaskStepOrderError, match="at again: .*parts was set twice"):
            step.in_parts("again", {BONUS: bonus, DRAFTS: drafts})
        step.capture.record(logits)
        step.extract(HOP, logits)
        with pytest.raises(MaskStepOrderError, match="at again: .*mask was set twice"):
            step.extract("again", logits)
        with pytest.raises(MaskStepOrderError, match="at again: .*mask was set twice"):
            step.no_mask_rows("again", step.mask)
        step.set_copy(HOP, NO_MASKS)
        with pytest.raises(MaskStepOrderError, match="at again: .*copy was set twice"):
            step.set_copy("again", NO_MASKS)
    # upstream's dummy run samples, then verifies twice, inside one profiling step:
    # each call plans every row and extracts afresh
    with state.profiling() as step:
        step.planned("sampler", 3)
        step.capture.record(logits[:3])
        step.extract("sampler", logits[:3])
        for _ in range(2):
            plan = step.planned(HOP, 6, normalise=True, request_rows=np.array([2, 2, 2]))
            assert plan.worst_case and plan.batch_rows == 6
            step.in_parts(HOP, {BONUS: np.array([1, 3, 5]), DRAFTS: np.array([0, 2, 4])})
            for hop, rows in ((BONUS, [1, 3, 5]), (DRAFTS, [0, 2, 4])):
                piece = step.piece(hop, 3)
                piece.capture.record(logits[rows])
                step.hand(piece, logits[rows])
            assert step.extract_parts(HOP).batch_rows == 6
    assert state.extractions == 1                      # the served step only


def test_steps_do_not_nest_and_the_open_step_is_this_threads():
    state = SamplingMaskState(4, VOCAB)
    other = []
    with state.step() as step:
        with pytest.raises(RuntimeError, match="steps do not nest"):
            with state.step():
                pass
        assert state.open is step and open_step() is step
        thread = threading.Thread(target=lambda: other.append(open_step()))
        thread.start()
        thread.join()
    assert other == [None] and open_step() is None and state.open is None
