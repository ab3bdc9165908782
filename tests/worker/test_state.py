"""The runner side (`vllm_sampling_mask.worker`): the per-request flags, the step plan,
the step that carries one sampler call's mask, and the state that holds them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sampling_mask.errors import MaskStepOrderError, MissingSamplingMaskError
from vllm_sampling_mask.worker.extraction import ExtractionSettings
from vllm_sampling_mask.worker.transport import MaskCopy
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.capture import ScaledCapture, shadowing
from vllm_sampling_mask.worker.requests import MaskRequests
from vllm_sampling_mask.worker.state import SamplingMaskState
from vllm_sampling_mask.frontend.validation import LOGPROBS_ARG, MASK_ARG


# The two forms a CPU host's state extracts into: the host form (the default for
# CPU logits, `extraction.extract_on_host`) and the block the device paths write
# (`implementation="host"`: numpy writing the block, as a CUDA step's is decoded).
FORMS = {"host form": ExtractionSettings(),
         "block": ExtractionSettings(implementation="host")}
BLOCK = FORMS["block"]


def asked_rows(mask) -> list[int]:
    """The extracted rows (numbered as the mask's) that carry support logprobs."""
    if mask.host is not None:
        return np.flatnonzero(mask.host.asked).tolist()
    return mask.support_logprobs.rows.tolist()


class Params:
    def __init__(self, wants):
        self.extra_args = wants if isinstance(wants, dict) else {MASK_ARG: wants}


def test_wants_follow_adds_removes_moves_and_swaps_like_a_batch():
    state = MaskRequests(max_num_reqs=6)
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


PLAN_FIELDS = ("batch_rows", "rows", "top_k", "asked", "idle", "normalise")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "move", "swap", "step",
                                           "discarding step"]),
                          st.integers(0, 3), st.integers(0, 3), st.integers(0, 2),
                          st.integers(1, 4)),
                max_size=30))
def test_a_steady_step_takes_the_last_plan_only_while_the_batch_is_unchanged(ops):
    """The V1 adapter's plan over an unchanged persistent batch with no row
    discarded is the last such step's object (no array work); after any batch
    update, and for a step that discards rows, it is planned afresh. Each step's
    plan holds what planning from the batch would give."""
    state = SamplingMaskState(max_num_reqs=6, max_size=100)
    top_k = np.zeros(6, dtype=np.int64)     # the batch's own array, moved as it moves
    last = None
    for op, a, b, k, n in ops:
        changed = op in ("add", "remove", "move", "swap")
        if op == "add":
            extra = {MASK_ARG: k > 0, LOGPROBS_ARG: k > 1}
            state.requests.apply_batch_update([(a, Params(extra), [], [])], [], [])
            top_k[a] = 10 * (k + 1)
        elif op == "remove":
            state.requests.apply_batch_update([], [a], [])
        elif op in ("move", "swap"):
            state.requests.apply_batch_update([], [], [(a, b, op == "swap")])
            if op == "swap":
                top_k[[a, b]] = top_k[[b, a]]
            else:
                top_k[b] = top_k[a]
        else:
            discarded = np.zeros(n, dtype=bool)
            if op == "discarding step":
                discarded[a % n] = True
            plan = state.plan(slice(0, n), top_k[:n], discarded)
            fresh = plans.plan(state.requests.wants[:n], state.requests.asked[:n],
                               top_k[:n], discarded)
            for field in PLAN_FIELDS:
                got, want = getattr(plan, field), getattr(fresh, field)
                assert (got is None) == (want is None), field
                if want is not None:
                    assert np.array_equal(got, want), field
            assert plan.capture_rows.tolist() == fresh.capture_rows.tolist()
            steady = op == "step"
            if steady and last is not None and last[0] == n:
                assert plan is last[1]
            last = (n, plan) if steady else last
        if changed:
            last = None


def test_a_swap_between_two_steady_steps_is_planned_afresh():
    state = SamplingMaskState(max_num_reqs=4, max_size=100)
    state.requests.apply_batch_update([(0, Params(True), [], []), (1, Params(False), [], [])],
                                      [], [])
    top_k = np.array([5, 7, 0, 0])
    first = state.plan(slice(0, 2), top_k[:2], np.zeros(2, dtype=bool))
    assert first.rows.tolist() == [0] and first.top_k.tolist() == [5]
    assert state.plan(slice(0, 2), top_k[:2], np.zeros(2, dtype=bool)) is first
    state.requests.apply_batch_update([], [], [(0, 1, True)])
    top_k[[0, 1]] = top_k[[1, 0]]
    second = state.plan(slice(0, 2), top_k[:2], np.zeros(2, dtype=bool))
    assert second.rows.tolist() == [1] and second.top_k.tolist() == [5]


def test_a_plan_masks_nothing_only_with_no_row_extracted_none_idle_outside_profiling():
    none = np.zeros(3, dtype=bool)
    top_k = np.full(3, 20)
    assert plans.plan(none, none, top_k).masks_nothing
    assert plans.plan(none, none, top_k, np.array([True, False, False])).masks_nothing
    assert not plans.plan(np.array([False, True, False]), none, top_k).masks_nothing
    # a row that wants a mask but whose sample is discarded is idle: still a mask
    idle = plans.plan(np.array([True, False, False]), none, top_k,
                      np.array([True, False, False]))
    assert idle.n_rows == 0 and not idle.masks_nothing
    assert not plans.worst_case(3).masks_nothing


def test_a_step_without_masks_is_one_object_that_pickles_by_name():
    import pickle

    from vllm_sampling_mask.worker.transport import NO_MASKS

    wire = pickle.dumps(NO_MASKS)
    assert pickle.loads(wire) is NO_MASKS and len(wire) < 64
    assert NO_MASKS.result(np.ones(4)) is NO_MASKS      # in a copy's place: nothing to copy


def test_a_request_without_the_decision_wants_no_mask():
    state = MaskRequests(4)
    state.add(1, Params(None))
    state.add(2, None)
    assert not state.wants.any()
    state.add(3, Params(True))
    state.remove(3)
    assert not state.wants.any()


def test_a_step_is_open_only_around_its_call_and_each_stage_names_its_hop():
    state = SamplingMaskState(4, 64)
    assert state.open is None
    with state.step() as step:
        assert state.open is step
        with pytest.raises(MissingSamplingMaskError, match="at V1 Sampler.sample.*without a plan"):
            step.planned("V1 Sampler.sample", 2)
        with pytest.raises(MissingSamplingMaskError,
                           match="at GPUModelRunner.sample.*without extracting"):
            step.result("GPUModelRunner.sample")
    assert state.open is None
    with pytest.raises(RuntimeError):
        with state.step():
            raise RuntimeError
    assert state.open is None                       # closed on the way out, whatever happens
    logits = torch.full((2, 50), float("-inf"))
    logits[0, :5] = 0.0
    logits[1, 7] = 0.0
    plan = plans.plan(np.array([True, True]), np.zeros(2, bool), np.array([5, 1]))
    with state.step(plan) as step:
        with pytest.raises(MissingSamplingMaskError, match="plan is for 2 rows.*has 3"):
            step.planned("Sampler.sample", 3)
        with pytest.raises(MaskStepOrderError, match="at GPUModelRunner.sample.*twice"):
            step.set_plan("GPUModelRunner.sample", plan)
        assert step.planned("Sampler.sample", 2) is plan and step.capture is None
        mask = step.extract("Sampler.sample", logits)
        assert step.result("GPUModelRunner.sample") is mask and mask.batch_rows == 2
    host = MaskCopy(mask, pool=None).result(np.ones(2))
    assert host.row(0).tolist() == [0, 1, 2, 3, 4] and host.row(1).tolist() == [7]


@pytest.mark.parametrize("form", FORMS)
def test_support_logprobs_need_the_capture_and_shadowing_hands_it_over(form):
    """A plan whose rows asked makes a capture for exactly those batch rows; the
    sampler adapter shadows the call that holds the scaled logits for the length of
    its own call; extracting without a recorded capture names the hop."""
    state = SamplingMaskState(4, 64, FORMS[form])
    logits = _rows(64, [range(6), range(8), range(30, 34)])
    plan = plans.plan(np.array([True, False, True]), np.array([False, False, True]),
                      np.array([6, 8, 4]))
    assert plan.capture_rows.tolist() == [2]

    class Sampler:
        @staticmethod
        def apply_temperature(x):
            return x

    sampler = Sampler()
    with state.step(plan) as step:
        step.planned("V1 Sampler.sample", 3)
        with pytest.raises(MissingSamplingMaskError, match="at V1 Sampler.sample.*scaled"):
            step.extract("V1 Sampler.sample", logits)
        capture = step.capture
        with shadowing(sampler, "apply_temperature",
                       lambda x: capture.record(Sampler.apply_temperature(x))):
            sampler.apply_temperature(logits)
        assert "apply_temperature" not in vars(sampler)     # restored
        mask = step.extract("V1 Sampler.sample", logits)
    assert asked_rows(mask) == [1]       # extracted rows: batch rows 0, 2
    capture = ScaledCapture(np.array([0]))
    capture.record(logits)
    first = capture.scaled_top
    capture.record(torch.zeros_like(logits))                 # the first record is kept
    assert capture.scaled_top is first


def test_profiling_is_the_worst_case_only_inside_and_settings_are_the_states():
    state = SamplingMaskState(4, 64, settings=ExtractionSettings(
        tie_margin=-15, spare_wide_slots=1, implementation="host"))
    assert not state.worst_case
    with pytest.raises(RuntimeError):
        with state.profiling():
            assert state.worst_case
            raise RuntimeError
    assert not state.worst_case and state.open is None
    logits = torch.zeros(3, 50)
    served = plans.plan(np.ones(3, bool), np.zeros(3, bool), np.array([20, 20, 20]))
    normal = state.extract(served, logits)
    with state.profiling() as step:              # the sampler plans every row, widest
        plan = step.planned("V1 Sampler.sample", 3)
        assert plan.worst_case and plan.rows is None and step.capture is not None
        step.capture.record(logits)
        worst = step.extract("V1 Sampler.sample", logits)
    assert worst.layout != normal.layout and state.open is None
    assert state.extractions == 1                # the profiling run is not served work
    other = SamplingMaskState(4, 64, BLOCK).extract(served, logits)
    assert other.layout != normal.layout          # the tie margin is the state's own


def _rows(vocab, finite):
    """Processed logits: row r keeps the ids `finite[r]` (random values), -inf elsewhere."""
    g = torch.Generator().manual_seed(0)
    logits = torch.full((len(finite), vocab), float("-inf"))
    for r, ids in enumerate(finite):
        logits[r, list(ids)] = torch.randn(len(ids), generator=g)
    return logits


@pytest.mark.parametrize("form", FORMS)
def test_rows_whose_sample_is_discarded_are_not_extracted_and_decode_as_sampled_nothing(form):
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

    state = SamplingMaskState(8, 64, FORMS[form])
    no_asks = np.zeros(5, bool)
    mask = state.extract(plans.plan(wants, no_asks, top_k, discarded), logits)
    assert mask.rows.tolist() == [0, 3] and mask.idle.tolist() == [1, 4]
    assert mask.layout.rows == 2
    if mask.host is None:   # the block is as wide as the extracted rows' top-k
        assert mask.layout.width == 5 + 16 and mask.layout.slots == 2
    assert (state.extractions, state.extracted_rows, state.idle_rows) == (1, 2, 2)
    host = MaskCopy(mask, pool=None).result(num_sampled)

    before = SamplingMaskState(8, 64, FORMS[form])   # the runner reports nothing
    old = before.extract(plans.plan(wants, no_asks, top_k), logits)
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
    none = state.extract(plans.plan(wants, no_asks, top_k, wants.copy()), logits)
    assert none.layout.rows == 0 and none.idle.tolist() == [0, 1, 3, 4]
    assert (state.extractions, state.extracted_rows, state.idle_rows) == (1, 2, 6)
    empty = MaskCopy(none, pool=None).result(np.zeros(5))
    assert [len(empty.row(i)) for i in (0, 1, 3, 4)] == [0] * 4 and not empty.wants(2)


def test_a_discarded_row_takes_no_wide_row_slot():
    """Ties make both rows wider than W = top_k; one spare slot. The discarded row
    (row 0, first in the batch) used to claim it, leaving the kept row without one:
    a per-request error for a row that really sampled."""
    settings = ExtractionSettings(tie_margin=0, spare_wide_slots=1, implementation="host")
    logits = torch.full((2, 64), float("-inf"))
    logits[:, :10] = 0.0                               # 10 tied ids, top_k 5
    top_k, wants = np.array([5, 5]), np.ones(2, bool)
    discarded, num_sampled = np.array([True, False]), np.array([0, 1])
    none_asked = np.zeros(2, bool)
    old = MaskCopy(SamplingMaskState(4, 64, settings).extract(
        plans.plan(wants, none_asked, top_k), logits), pool=None).result(num_sampled)
    assert "wide-row slot" in old.problem(1, 0)
    state = SamplingMaskState(4, 64, settings)
    host = MaskCopy(state.extract(plans.plan(wants, none_asked, top_k, discarded), logits),
                    pool=None).result(num_sampled)
    assert host.problem(1, 0) is None and host.row(1).tolist() == list(range(10))
    assert len(host.row(0)) == 0


@pytest.mark.parametrize("form", FORMS)
def test_discarded_rows_record_no_support_logprobs_and_profiling_extracts_every_row(form):
    logits = _rows(64, [range(6), range(8), range(30, 34)])
    top_k, wants = np.array([6, 8, 4]), np.ones(3, bool)
    asked, discarded = np.ones(3, bool), np.array([False, True, False])
    state = SamplingMaskState(4, 64, FORMS[form])
    plan = plans.plan(wants, asked, top_k, discarded, normalise=True)
    assert plan.capture_rows.tolist() == [0, 2]               # the discarded row records nothing
    capture = ScaledCapture(plan.capture_rows)
    capture.record(logits)
    mask = state.extract(plan, logits, capture)
    assert asked_rows(mask) == [0, 1]     # extracted rows: batch rows 0, 2
    host = MaskCopy(mask, pool=None).result(np.array([1, 0, 1]))
    assert host.asked(0) and host.asked(2) and not host.asked(1)
    assert len(host.log_kept) == len(host.counts) == 3
    for i in (0, 2):
        assert np.isfinite(host.row_logprobs(i)).all() and host.problem(i, 30 * (i // 2)) is None
    with state.profiling() as step:   # the worst case: every row, whatever the runner discards
        step.planned("Sampler.sample", 3)
        step.capture.record(logits)
        worst = step.extract("Sampler.sample", logits)
    assert worst.layout.rows == 3 and worst.idle is None
    assert state.extracted_rows == 2 and state.idle_rows == 1


# -- a verify step (speculative decoding): one row per position --------------

def test_a_request_level_plan_becomes_one_row_per_position():
    wants = np.array([True, False, True, True])
    asked = np.array([False, False, True, False])
    request = plans.plan(wants, asked, np.array([5, 6, 7, 8]),
                         discarded=np.array([False, False, False, True]))
    step = plans.per_token(request, [3, 1, 2, 1], normalise=True)
    assert step.batch_rows == 7 and step.normalise
    assert step.rows.tolist() == [0, 1, 2, 4, 5]          # request 1 wants none
    assert step.top_k.tolist() == [5, 5, 5, 7, 7]
    assert step.asked.tolist() == [False, False, False, True, True]
    assert step.idle.tolist() == [6]                       # the discarded request's row
    assert step.request_rows.tolist() == [3, 1, 2, 1]
    # its bonus positions (the last row of each request) as a batch of their own
    bonus = plans.part(step, np.array([2, 3, 5, 6]))
    assert bonus.batch_rows == 4 and bonus.rows.tolist() == [0, 2]
    assert bonus.top_k.tolist() == [5, 7] and bonus.asked.tolist() == [False, True]
    assert bonus.idle.tolist() == [3]
    with pytest.raises(ValueError):
        plans.per_token(request, [1, 1])


def test_a_verify_step_decodes_one_support_per_emitted_token():
    """Rows after a request's last emitted token (rejected drafts) decode as
    count 0 and carry no ids; a request's emitted tokens are consecutive rows."""
    from vllm_sampling_mask.worker.extraction import extract_support, plan_layout
    torch.manual_seed(0)
    logits = torch.randn(6, 64)
    logits[logits < 0.8] = float("-inf")
    mask = extract_support(logits, plan_layout(np.zeros(6, np.int64), 64))
    mask.request_rows = np.array([3, 1, 2])               # rows 0-2, 3, 4-5
    host = MaskCopy(mask, None).result([2, 1, 0])         # emitted 2, 1 and none
    finite = [torch.nonzero(torch.isfinite(r)).view(-1).tolist() for r in logits]
    assert host.first_row.tolist() == [0, 3, 4]
    assert host.rows(0, 2).tolist() == [0, 1] and host.rows(1, 1).tolist() == [3]
    assert [host.counts[host.row_of[r]] for r in range(6)] == [
        len(finite[0]), len(finite[1]), 0, len(finite[3]), 0, 0]
    ids, counts, _, _ = host.wire().of(0, 2)
    assert np.frombuffer(counts, "<i4").tolist() == [len(finite[0]), len(finite[1])]
    assert np.frombuffer(ids, "<i4").tolist() == finite[0] + finite[1]


def test_a_part_of_a_step_captures_its_own_asked_rows():
    from vllm_sampling_mask.worker.capture import merged, part_capture
    whole = ScaledCapture(np.array([1, 4, 5]))
    bonus, drafts = np.array([2, 5]), np.array([0, 1, 3, 4])
    assert part_capture(whole, bonus).rows.tolist() == [1]        # row 5: bonus row 1
    assert part_capture(whole, drafts).rows.tolist() == [1, 3]    # rows 1 and 4
    assert part_capture(whole, np.array([0, 2])) is None and part_capture(None, bonus) is None
    assert part_capture(whole, np.zeros(0, np.int64)) is None     # a step with no drafts
    parts = []
    for rows in (bonus, drafts):
        capture = part_capture(whole, rows)
        capture.record(torch.zeros(len(rows), 3))                 # uniform: -log 3
        parts.append((rows, capture))
    top = merged(6, parts, "test", "cpu")
    assert torch.allclose(top[[1, 4, 5]], torch.full((3,), -float(np.log(3))))
    assert top[[0, 2, 3]].tolist() == [0.0, 0.0, 0.0]


def _step_case(seed: int):
    """Random processed logprobs of a step with everything a host form must carry:
    rows that want no mask, discarded rows, rows that emitted nothing, a row with
    NaN logits, one with +inf, one with no finite logit, one wider than the size
    limit, rows that asked for support logprobs and rows that did not."""
    rng = np.random.default_rng(seed)
    rows, vocab, max_size = 9, 96, 40
    x = np.full((rows, vocab), -np.inf, dtype=np.float32)
    for r in range(rows):
        kept = rng.choice(vocab, size=int(rng.integers(1, 30)), replace=False)
        x[r, kept] = rng.normal(size=len(kept))
    x[1, :60] = rng.normal(size=60)                     # wider than the size limit
    x[2, 5] = np.nan                                    # NaN reached the sampler
    x[3, 7] = np.inf
    x[4] = -np.inf                                      # nothing finite
    logits = torch.log_softmax(torch.from_numpy(x), dim=1)
    logits[2, 5], logits[3, 7] = float("nan"), float("inf")
    wants = rng.random(rows) < 0.85
    wants[[1, 2, 3, 4]] = True
    asked = wants & (rng.random(rows) < 0.6)
    asked[2] = True
    discarded = rng.random(rows) < 0.15
    discarded[[1, 2, 3, 4]] = False
    num_sampled = (~discarded & (rng.random(rows) < 0.9)).astype(np.int64)
    num_sampled[[1, 2, 3, 4]] = 1
    top_k = np.where(rng.random(rows) < 0.5, 30, vocab)
    return logits, wants, asked, top_k, discarded, num_sampled, max_size


@pytest.mark.parametrize("normalise", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_host_form_carries_what_the_decoded_block_carries(seed, normalise):
    """A CPU host's step extracted straight into the host form gives the same
    `StepMasks` as the block decoded (ids, counts, the problems, support logprobs
    and log S, idle rows, rows that emitted nothing), field by field."""
    logits, wants, asked, top_k, discarded, num_sampled, max_size = _step_case(seed)
    source = logits if not normalise else logits * 1.5    # processed logits
    got = {}
    for form, settings in FORMS.items():
        state = SamplingMaskState(16, max_size, settings)
        plan = plans.plan(wants, asked, top_k, discarded, normalise=normalise)
        capture = ScaledCapture(plan.capture_rows) if len(plan.capture_rows) else None
        if capture is not None:
            capture.record(source * 0.5)                   # the scaled logits before the cut
        mask = state.extract(plan, source, capture)
        assert (mask.host is not None) == (form == "host form")
        got[form] = MaskCopy(mask, pool=None).result(num_sampled)
    host, block = got["host form"], got["block"]
    assert host.row_of.tolist() == block.row_of.tolist()
    assert host.counts.tolist() == block.counts.tolist()
    assert host.idle == block.idle
    checked = 0
    for i in range(len(wants)):
        assert host.wants(i) == block.wants(i)
        if not host.wants(i):
            continue
        token = int(np.flatnonzero(np.isfinite(logits[i].numpy()))[:1].sum())
        assert host.problem(i, token) == block.problem(i, token)
        if host.problem(i, token) is None:
            checked += 1
            assert host.row(i).tolist() == block.row(i).tolist()
        assert host.asked(i) == block.asked(i)
        if host.asked(i) and host.problem(i, token) is None:
            np.testing.assert_allclose(host.row_logprobs(i), block.row_logprobs(i),
                                       rtol=0, atol=1e-6)
            r, b = host.row_of[i], block.row_of[i]
            np.testing.assert_allclose(host.log_kept[r], block.log_kept[b], rtol=0, atol=1e-6)
    assert checked >= 2
    tokens = [int(np.flatnonzero(np.isfinite(logits[i].numpy()))[:1].sum())
              for i in np.flatnonzero(wants)]
    np.testing.assert_array_equal(host.suspects(np.flatnonzero(wants), tokens),
                                  block.suspects(np.flatnonzero(wants), tokens))


def _drawn_case(seed):
    """A `_step_case` step with the sampler's tokens handed over: each row's token
    in its support or, now and then, outside it; extracted on the host form."""
    logits, wants, asked, top_k, discarded, num_sampled, max_size = _step_case(seed)
    wants[5], discarded[5], num_sampled[5] = True, False, 1    # one row surely fine
    # and one whose support is fine but whose support logprobs are NaN
    wants[6], asked[6], discarded[6], num_sampled[6] = True, True, False, 1
    rng = np.random.default_rng(seed + 100)
    sampled = np.zeros(len(wants), dtype=np.int64)
    for i in range(len(wants)):
        finite = np.flatnonzero(np.isfinite(logits[i].numpy()))
        inside = len(finite) and (i in (5, 6) or rng.random() < 0.8)
        sampled[i] = rng.choice(finite) if inside else rng.integers(logits.shape[1])
    state = SamplingMaskState(16, max_size)
    plan = plans.plan(wants, asked, top_k, discarded)
    capture = ScaledCapture(plan.capture_rows)
    scaled = logits * 0.5
    scaled[6, int(sampled[6])] = float("nan")       # NaN in the scaled logits only
    capture.record(scaled)
    mask = state.extract(plan, logits, capture, sampled=torch.from_numpy(sampled))
    return MaskCopy(mask, pool=None).result(num_sampled), wants, sampled


@pytest.mark.parametrize("seed", range(8))
def test_drawn_holds_a_rows_token_exactly_where_problem_has_nothing_to_say(seed):
    """The scheduler takes a kept token equal to its row's `drawn` with no other
    check, so `drawn` holds the row's token exactly where `problem` says nothing
    about that token (rows over the size limit, NaN and +inf logits, no finite
    logit, discarded rows, rows that emitted nothing, NaN support logprobs: -1)."""
    masks, wants, sampled = _drawn_case(seed)
    assert masks.drawn is not None and len(masks.drawn) == len(masks.counts)
    seen = set()
    for i in np.flatnonzero(wants):
        fine = masks.problem(i, int(sampled[i])) is None
        assert (masks.drawn[masks.row_of[i]] == sampled[i]) == fine, i
        seen.add(fine)
    assert seen == {True, False}


def test_the_block_form_and_a_sampler_without_tokens_leave_drawn_to_the_full_check():
    logits, wants, asked, top_k, discarded, num_sampled, max_size = _step_case(0)
    plan = plans.plan(wants, np.zeros_like(asked), top_k, discarded)
    sampled = torch.zeros(len(wants), dtype=torch.int64)
    block = SamplingMaskState(16, max_size, BLOCK).extract(plan, logits, sampled=sampled)
    host = SamplingMaskState(16, max_size).extract(plan, logits)
    for mask in (block, host):
        assert MaskCopy(mask, pool=None).result(num_sampled).drawn is None


@pytest.mark.parametrize("seed", range(8))
def test_the_schedulers_quick_check_attaches_what_the_full_check_attaches(seed):
    """Per output, `_attach` with `drawn` (one comparison for a token its row was
    checked against, the full check for the others) gives the same bytes and
    the same problems as the full check alone, including outputs whose kept
    token is not the one their row drew."""
    from vllm.logger import init_logger

    from vllm_sampling_mask.patches.engine.feature.scheduler import _attach
    from vllm_sampling_mask.engine.outputs import MaskedEngineCoreOutput

    masks, wants, sampled = _drawn_case(seed)
    rng = np.random.default_rng(seed)
    kept = [[int(t)] if rng.random() < 0.8 else [int(rng.integers(96))] for t in sampled]
    kept[int(np.flatnonzero(wants)[0])] = [int(sampled[np.flatnonzero(wants)[0]]), 3]
    kept[5] = [int(sampled[5])]                         # its row is fine (`_drawn_case`)
    index = {f"r{i}": i for i in range(len(wants))}
    results = []
    for drawn in (masks.drawn, None):
        masks.drawn = drawn
        outs = [MaskedEngineCoreOutput(request_id=f"r{i}", new_token_ids=list(kept[i]))
                for i in range(len(wants))]
        problems = _attach(outs, masks, index, init_logger("test"))
        results.append(([(o.request_id, o.sampling_mask_ids, o.sampling_mask_counts,
                          o.sampling_mask_logprobs, o.sampling_mask_log_kept) for o in outs],
                         sorted((o.request_id, p) for o, p in problems)))
    assert results[0] == results[1]
    attached = [o for o in results[0][0] if o[1] is not None]
    assert attached and results[0][1]
