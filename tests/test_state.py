"""`SamplingMaskState`: the runner's one owner of the mask's per-step state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import ExtractionSettings
from vllm_sampling_mask.state import SamplingMaskState
from vllm_sampling_mask.transport import MaskCopy
from vllm_sampling_mask.validation import MASK_ARG


class Params:
    def __init__(self, wants):
        self.extra_args = {MASK_ARG: wants}


def test_wants_follow_adds_removes_moves_and_swaps_like_a_batch():
    state = SamplingMaskState(max_num_reqs=6, max_size=64)
    rows: list[str | None] = [None] * 6           # the batch's request per row
    wants = {"a": True, "b": True, "c": False, "d": True}
    # step 1: a, b, c added at rows 0..2
    state.apply_batch_update([(0, Params(True), [], []), (1, Params(True), [], []),
                              (2, Params(False), [], [])], [], [])
    rows[:3] = ["a", "b", "c"]
    # step 2: b removed (row 1), d added into row 3, condense moves row 3 -> 1,
    # then a reorder swaps rows 0 and 2
    state.apply_batch_update([(3, Params(True), [], [])], [1], [(3, 1, False), (0, 2, True)])
    rows = ["c", "d", "a", None, None, None]
    n = 3
    assert state.wants[:n].tolist() == [wants[r] for r in rows[:n]]
    # a removed row that nothing refills wants nothing
    state.apply_batch_update([], [2], [])
    assert state.wants[:n].tolist() == [False, True, False]


def test_a_request_without_the_decision_wants_no_mask():
    state = SamplingMaskState(4, 64)
    state.add_request(1, Params(None))
    state.add_request(2, None)
    assert not state.wants.any()
    state.add_request(3, Params(True))
    state.remove_request(3)
    assert not state.wants.any()


def test_take_names_the_hop_and_hand_offs_are_one_shot():
    state = SamplingMaskState(4, 64)
    with pytest.raises(MissingSamplingMaskError, match="at Sampler.__call__"):
        state.mask.take("Sampler.__call__")
    with pytest.raises(MissingSamplingMaskError, match="at V1 Sampler.sample"):
        state.take_top_k("V1 Sampler.sample", 2)
    state.stage_top_k(np.array([5, 0]))
    with pytest.raises(MissingSamplingMaskError, match="top-k for 3 rows"):
        state.take_top_k("V1 Sampler.sample", 3)
    with pytest.raises(MissingSamplingMaskError, match="at Sampler.sample.*discarded rows"):
        state.take_discarded("Sampler.sample", 2)
    state.stage_discarded(np.array([True, False]))
    with pytest.raises(MissingSamplingMaskError, match="discarded rows for 3 rows"):
        state.take_discarded("Sampler.sample", 3)
    state.stage_discarded(np.array([True, False]))
    assert state.take_discarded("Sampler.sample", 2).tolist() == [True, False]
    with pytest.raises(MissingSamplingMaskError, match="discarded rows"):
        state.take_discarded("Sampler.sample", 2)   # one-shot
    with pytest.raises(MissingSamplingMaskError, match="GPUModelRunner.sample_tokens"):
        state.copy.take("GPUModelRunner.sample_tokens")
    logits = torch.full((2, 50), float("-inf"))
    logits[0, :5] = 0.0
    logits[1, 7] = 0.0
    state.mask.put(state.extract(logits, np.array([5, 1]), np.array([True, True])))
    assert state.mask.pending
    mask = state.mask.take("hop")
    assert not state.mask.pending and mask.batch_rows == 2


def test_profiling_is_the_worst_case_only_inside_and_settings_are_the_states():
    state = SamplingMaskState(4, 64, settings=ExtractionSettings(tie_margin=-15,
                                                                 spare_wide_slots=1))
    assert not state.worst_case
    with pytest.raises(RuntimeError):
        with state.profiling():
            assert state.worst_case
            raise RuntimeError
    assert not state.worst_case
    logits = torch.zeros(3, 50)
    normal = state.extract(logits, np.array([20, 20, 20]), np.ones(3, bool))
    with state.profiling():
        worst = state.extract(logits, np.array([20, 20, 20]), np.ones(3, bool))
    assert worst.layout != normal.layout
    other = SamplingMaskState(4, 64).extract(logits, np.array([20, 20, 20]), np.ones(3, bool))
    assert other.layout != normal.layout          # the tie margin is the state's own


def _rows(vocab, finite):
    """Processed logits: row r keeps the ids `finite[r]` (random values), -inf elsewhere."""
    g = torch.Generator().manual_seed(0)
    logits = torch.full((len(finite), vocab), float("-inf"))
    for r, ids in enumerate(finite):
        logits[r, list(ids)] = torch.randn(len(ids), generator=g)
    return logits


def test_rows_whose_sample_is_discarded_are_not_extracted_and_decode_as_sampled_nothing():
    """A partial prefill chunk's row (its sample discarded) that wants a mask is left
    out of the block: it does not widen the step (row 1 has no top-k and 40 ids),
    it is not counted as extracted, and the host form still has one entry per batch
    row, the same as when it was extracted and zeroed by `num_sampled == 0`."""
    finite = [range(5), range(40), range(7), range(10, 15), range(20, 25)]
    logits = _rows(64, finite)
    top_k = np.array([5, 64, 5, 5, 5])                # 64 = vocab: no top-k
    wants = np.array([True, True, False, True, True])
    discarded = np.array([False, True, False, False, True])
    num_sampled = (~discarded).astype(np.int64)

    state = SamplingMaskState(8, 64)
    mask = state.extract(logits, top_k, wants, discarded=discarded)
    assert mask.rows.tolist() == [0, 3] and mask.idle.tolist() == [1, 4]
    assert mask.layout.rows == 2 and mask.layout.width == 5 + 16 and mask.layout.slots == 2
    assert (state.extractions, state.extracted_rows, state.idle_rows) == (1, 2, 2)
    host = MaskCopy(mask, pool=None).result(num_sampled)

    before = SamplingMaskState(8, 64)   # the runner reports nothing: every wanted row
    old = before.extract(logits, top_k, wants)
    assert old.layout.rows == 4 and old.layout.width == 64 and old.idle is None
    assert before.extracted_rows == 4 and before.idle_rows == 0
    old_host = MaskCopy(old, pool=None).result(num_sampled)

    assert len(host.row_of) == len(old_host.row_of) == 5
    for i in range(5):
        assert host.wants(i) == old_host.wants(i) == bool(wants[i])
        if wants[i]:
            assert host.row(i).tolist() == old_host.row(i).tolist()
            assert host.counts[host.row_of[i]] == old_host.counts[old_host.row_of[i]]
    for i in (0, 3):
        assert host.row(i).tolist() == list(finite[i])
        assert host.problem(i, finite[i][0]) is None
    for i in (1, 4):
        assert host.counts[host.row_of[i]] == 0 and len(host.row(i)) == 0
        # a kept token in a row the runner said it discards is a per-request error
        assert "partial prefill" in host.problem(i, 3)

    # a step in which every row that wants a mask is discarded extracts nothing
    none = state.extract(logits, top_k, wants, discarded=wants.copy())
    assert none.layout.rows == 0 and none.idle.tolist() == [0, 1, 3, 4]
    assert (state.extractions, state.extracted_rows, state.idle_rows) == (1, 2, 6)
    empty = MaskCopy(none, pool=None).result(np.zeros(5))
    assert [len(empty.row(i)) for i in (0, 1, 3, 4)] == [0] * 4 and not empty.wants(2)


def test_a_discarded_row_takes_no_wide_row_slot():
    """Ties make both rows wider than W = top_k; one spare slot. The discarded row
    (row 0, first in the batch) used to claim it, leaving the kept row without one:
    a per-request error for a row that really sampled."""
    settings = ExtractionSettings(tie_margin=0, spare_wide_slots=1)
    logits = torch.full((2, 64), float("-inf"))
    logits[:, :10] = 0.0                               # 10 tied ids, top_k 5
    top_k, wants = np.array([5, 5]), np.ones(2, bool)
    discarded, num_sampled = np.array([True, False]), np.array([0, 1])
    old = MaskCopy(SamplingMaskState(4, 64, settings).extract(logits, top_k, wants),
                   pool=None).result(num_sampled)
    assert "wide-row slot" in old.problem(1, 0)
    state = SamplingMaskState(4, 64, settings)
    host = MaskCopy(state.extract(logits, top_k, wants, discarded=discarded),
                    pool=None).result(num_sampled)
    assert host.problem(1, 0) is None and host.row(1).tolist() == list(range(10))
    assert len(host.row(0)) == 0


def test_discarded_rows_record_no_support_logprobs_and_profiling_extracts_every_row():
    logits = _rows(64, [range(6), range(8), range(30, 34)])
    top_k, wants = np.array([6, 8, 4]), np.ones(3, bool)
    asked, discarded = np.ones(3, bool), np.array([False, True, False])
    state = SamplingMaskState(4, 64)
    with state.capturing(asked & ~discarded):
        state.capture_scaled(logits)
    mask = state.extract(logits, top_k, wants, asked, discarded=discarded, normalise=True)
    assert mask.support_logprobs.rows.tolist() == [0, 1]     # block rows: batch rows 0, 2
    host = MaskCopy(mask, pool=None).result(np.array([1, 0, 1]))
    assert host.asked(0) and host.asked(2) and not host.asked(1)
    assert len(host.log_kept) == len(host.counts) == 3
    for i in (0, 2):
        assert np.isfinite(host.row_logprobs(i)).all() and host.problem(i, 30 * (i // 2)) is None
    with state.profiling():   # the worst case: every row, whatever the runner discards
        worst = state.extract(logits, top_k, wants, discarded=discarded)
    assert worst.layout.rows == 3 and worst.idle is None
    assert state.extracted_rows == 2 and state.idle_rows == 1
