"""`SamplingMaskState`: the runner's one owner of the mask's per-step state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import ExtractionSettings
from vllm_sampling_mask.state import SamplingMaskState
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
