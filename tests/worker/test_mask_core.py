"""The plain modules: SamplingMask, extraction, transport, accumulation, rules."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.frontend.accumulator import MaskAccumulator
from vllm_sampling_mask.worker.extraction import (DEFAULT_SETTINGS, ExtractionSettings,
                                           MaskLayout, extract_selected, extract_support,
                                           plan_layout, plan_step)
from vllm_sampling_mask.worker.transport import MaskCopy, StepMasks
from vllm_sampling_mask.frontend.validation import DEFAULT_MAX_SIZE, resolve_request, startup_errors


def test_sampling_mask_packed_and_list_forms_agree():
    lists = [[3, 7, 9], [1], [], [0, 2]]
    m = SamplingMask.from_lists(lists)
    assert m.token_ids == lists
    assert len(m) == 4
    assert m.ids.dtype == np.int32 and m.offsets.dtype == np.int64
    assert m.offsets.tolist() == [0, 3, 4, 4, 6]
    assert m[0].tolist() == [3, 7, 9] and m[-1].tolist() == [0, 2]
    assert m == SamplingMask(m.ids, m.offsets)
    assert m != SamplingMask.from_lists([[3, 7, 9], [1], [], [0, 3]])
    assert SamplingMask.concat([SamplingMask.from_lists(lists[:2]),
                                SamplingMask.from_lists(lists[2:])]) == m
    with pytest.raises(IndexError):
        m[4]


def test_concat_joins_any_parts_into_a_valid_mask():
    """Parts with empty tokens, no tokens at all, and support logprobs on every
    part or not: the joined mask is the one built from the joined lists (and
    passes `SamplingMask`'s own checks); one part comes back as it is."""
    rng = np.random.default_rng(2)
    rows = [[3, 7, 9], [], [1], [], [0, 2], [5], [], [4, 8, 11, 12]]
    lps = [(-rng.random(len(r))).astype(np.float32) for r in rows]
    kept = (-rng.random(len(rows))).astype(np.float32)
    cuts = [0, 0, 2, 3, 3, 6, 8]
    parts = [SamplingMask.from_lists(rows[a:b], lps[a:b], kept[a:b])
             for a, b in zip(cuts, cuts[1:])]
    joined = SamplingMask.concat(parts)
    assert joined == SamplingMask.from_lists(rows, lps, kept)
    checked = SamplingMask(joined.ids, joined.offsets, joined.logprobs, joined.log_kept)
    assert np.array_equal(checked.offsets, np.cumsum([0] + [len(r) for r in rows]))
    assert np.array_equal(joined.logprobs, np.concatenate(lps))
    assert np.array_equal(joined.log_kept, kept)
    without = SamplingMask.concat(parts[:2] + [SamplingMask.from_lists(rows[2:3])] + parts[3:])
    assert without == SamplingMask.from_lists(rows) and without.log_kept is None
    assert SamplingMask.concat([parts[2]]) is parts[2]
    alone = SamplingMask.concat([SamplingMask.from_lists(rows)])
    assert alone == SamplingMask.from_lists(rows) and alone.logprobs is None


def test_sampling_mask_rejects_bad_offsets():
    with pytest.raises(ValueError, match="start at 0"):
        SamplingMask(np.array([1, 2]), np.array([1, 2]))
    with pytest.raises(ValueError, match="non-decreasing"):
        SamplingMask(np.array([1, 2]), np.array([0, 2, 1, 2]))


def test_sampling_mask_pickles():
    import pickle
    m = SamplingMask.from_lists([[1, 2], [5]])
    assert pickle.loads(pickle.dumps(m)) == m


def _processed(rows=6, vocab=97, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _host(logits, top_k, num_sampled=None, **layout_kwargs):
    layout = plan_layout(top_k, logits.shape[1], **layout_kwargs)
    sampled = np.ones(len(logits)) if num_sampled is None else num_sampled
    return MaskCopy(extract_support(logits, layout), pool=None).result(sampled)


def test_extract_support_equals_isfinite_rows():
    logits = _processed()
    layout = plan_layout([5] * 6, logits.shape[1])
    mask = extract_support(logits, layout)
    _, padded, _ = layout.views(mask.block.numpy())
    host = MaskCopy(mask, pool=None).result(np.ones(6))
    for r in range(logits.shape[0]):
        want = torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist()
        assert host.row(r).tolist() == want
        assert (padded[r, host.counts[r]:] == -1).all()


def test_step_masks_cross_processes_flat_not_padded():
    """What rides in ModelRunnerOutput is the flat ids + offsets: its pickle
    grows with the supports, not with R x W (W = the size limit here)."""
    import pickle
    vocab = 5000
    logits = torch.full((64, vocab), float("-inf"))
    logits[:, :3] = 0.0                       # three ids per row...
    logits[7, 100:400:3] = 1.0                # ...and one row of 103
    host = _host(logits, [vocab] * 64)        # no top-k: W = DEFAULT_MAX_SIZE
    assert host.width == DEFAULT_MAX_SIZE
    assert host.ids.shape == (63 * 3 + 103,) and host.offsets[-1] == 63 * 3 + 103
    back = pickle.loads(pickle.dumps(host))
    assert len(pickle.dumps(host)) < 64 * 3 * 4 + 103 * 4 + 64 * 12 + 4096
    for r in range(64):
        assert back.row(r).tolist() == torch.nonzero(
            torch.isfinite(logits[r])).view(-1).tolist()
        assert back.problem(r, 0) is None


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_step_masks_pickle_as_their_wire_form_and_come_back_whole(data):
    """The worker -> engine core hop pickles a step's `StepMasks` as its wire
    form (no numpy object in the pickle), and every field comes back equal, of
    its dtype and shape, aligned and writable, from any arrays a step holds:
    empty, strided views, 0-d, NaN in the logprobs, absent; the wire reads the
    same before and after."""
    import dataclasses
    import pickle

    def array(dtype, n):
        kind = np.dtype(dtype).kind
        if kind == "f":
            values = st.floats(allow_nan=True, width=32)
        elif kind == "b":
            values = st.booleans()
        else:
            values = st.integers(-2**31, 2**31 - 1)
        a = np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=dtype)
        step = data.draw(st.sampled_from([1, 1, 2]))   # a strided view now and then
        return np.repeat(a, step)[::step] if step > 1 else a

    def maybe(dtype):
        if data.draw(st.booleans()):
            return None
        return array(dtype, data.draw(st.integers(0, 9)))

    n = data.draw(st.integers(0, 9))
    masks = StepMasks(
        row_of=array(np.int64, n), counts=array(np.int32, n),
        ids=array(np.int32, data.draw(st.integers(0, 40))), offsets=array(np.int64, n + 1),
        width=data.draw(st.integers(1, 64)), wide=frozenset(data.draw(st.sets(st.integers(0, 9)))),
        lost=frozenset(), max_size=data.draw(st.integers(1, 10**6)),
        asked_rows=maybe(np.bool_), logprobs=maybe(np.float32), log_kept=maybe(np.float32),
        idle=data.draw(st.integers(0, 3)), first_row=maybe(np.int64),
        drawn=data.draw(st.sampled_from([None, np.array(5, dtype=np.int64)]))
        if data.draw(st.booleans()) else maybe(np.int64))
    pickled = pickle.dumps(masks, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"numpy" not in pickled
    back = pickle.loads(pickled)
    assert type(back) is StepMasks
    assert vars(back.wire()) == vars(masks.wire())
    for name in (field.name for field in dataclasses.fields(StepMasks)):
        value = getattr(masks, name)
        assert _same(value, getattr(back, name)), name
        if isinstance(value, np.ndarray):
            assert getattr(back, name).flags.aligned and getattr(back, name).flags.writeable
    with pytest.raises(AttributeError):
        back.not_a_field


def test_step_masks_of_a_step_read_the_same_after_the_hop():
    """A real step's `StepMasks` (the host form, drawn tokens included) reads
    the same rows, problems and wire after a pickle round trip."""
    import pickle
    from vllm_sampling_mask.worker.extraction import extract_on_host

    logits = _processed(rows=8, vocab=300, k=7, seed=3)
    logits[5] = float("-inf")                 # a row with no support
    logits[6, :] = 0.0                        # a row over the size limit below
    sampled = logits.argmax(dim=1)
    host = MaskCopy(extract_on_host(logits, None, 100, sampled), pool=None).result(
        np.ones(8, dtype=np.int64))
    back = pickle.loads(pickle.dumps(host, protocol=pickle.HIGHEST_PROTOCOL))
    for r in range(8):
        assert back.row(r).tolist() == host.row(r).tolist()
        for token in (int(sampled[r]), 0, 299):
            assert back.problem(r, token) == host.problem(r, token)
    assert _same(back.drawn, host.drawn)


TIE_MARGIN = DEFAULT_SETTINGS.tie_margin
SPARE_WIDE_SLOTS = DEFAULT_SETTINGS.spare_wide_slots


def test_ties_beyond_width_are_recovered_on_the_host():
    vocab = 300
    logits = torch.full((2, vocab), float("-inf"))
    logits[0, :5] = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.2])
    logits[1, 10:10 + 5 + TIE_MARGIN + 40] = 1.0   # top-k=5 keeps 61 ties
    host = _host(logits, [5, 5])
    assert host.counts.tolist() == [5, 5 + TIE_MARGIN + 40]
    assert host.row(0).tolist() == [0, 1, 2, 3, 4]
    assert host.row(1).tolist() == list(range(10, 10 + 5 + TIE_MARGIN + 40))
    assert host.problem(1, 12) is None


def test_width_is_capped_by_the_size_limit_and_wider_supports_are_problems():
    vocab = 5000
    assert plan_layout([vocab], vocab).width == DEFAULT_MAX_SIZE
    assert plan_layout([vocab], vocab, max_size=2048).width == 2048
    logits = torch.randn(2, vocab)
    logits[1, ::2] = float("-inf")          # 2500 finite ids, within the limit
    host = _host(logits, [vocab, vocab])    # row 0: all 5000, beyond the limit
    assert host.row(1).tolist() == list(range(1, vocab, 2))
    assert host.problem(1, 1) is None
    assert "--max-sampling-mask-size 4096" in host.problem(0, 0)


def test_layout_sizes_width_and_slots_from_the_requests_top_k():
    vocab = 100_000
    small = plan_layout([50] * 64, vocab)
    assert (small.width, small.slots) == (50 + TIE_MARGIN, SPARE_WIDE_SLOTS)
    mixed = plan_layout([50] * 60 + [0] * 4, vocab)   # 0: no top-k
    assert (mixed.width, mixed.slots) == (DEFAULT_MAX_SIZE, 0)
    worst = plan_layout([50] * 64, vocab, worst_case=True)
    assert (worst.width, worst.slots) == (DEFAULT_MAX_SIZE, 0)
    # Device memory per step: R x N ids (plus O(R)), whatever the batch asks.
    assert worst.numel * 4 <= 64 * 4 * DEFAULT_MAX_SIZE + 64 * 12


def test_only_the_rows_that_want_a_mask_are_extracted():
    logits = _processed(rows=5)
    wanted = np.array([True, False, True, False, False])
    mask = extract_selected(logits, np.full(5, 5), wanted, max_size=64)
    assert mask.layout.rows == 2 and mask.row_of().tolist() == [0, -1, 1, -1, -1]
    host = MaskCopy(mask, pool=None).result(np.ones(5))
    assert [host.wants(i) for i in range(5)] == wanted.tolist()
    for r in (0, 2):
        assert host.row(r).tolist() == torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist()
    none = extract_selected(logits, np.full(5, 5), np.zeros(5, bool), max_size=64)
    assert none.layout.rows == 0 and none.block.numel() == 0
    assert not MaskCopy(none, pool=None).result(np.ones(5)).wants(3)


def test_a_wide_row_without_a_slot_is_a_problem_never_a_truncated_mask():
    vocab = 400
    logits = torch.full((3, vocab), float("-inf"))
    logits[:, :100] = 0.0                    # three rows of 100 ties, top-k 5
    layout = plan_layout([5, 5, 5], vocab)
    layout = type(layout)(layout.rows, layout.width, 2, vocab)  # two slots only
    host = MaskCopy(extract_support(logits, layout), pool=None).result(np.ones(3))
    assert len(host.lost) == 1 and len(host.wide) == 2
    (r,) = host.lost
    assert "wide-row slot" in host.problem(r, 3)
    for w in host.wide:
        assert host.row(w).tolist() == list(range(100))


def test_nan_logits_cannot_push_support_ids_out():
    logits = torch.full((1, 50), float("-inf"))
    logits[0, [3, 7]] = 1.0
    logits[0, 10:40] = float("nan")         # excluded, and must not outrank 3 and 7
    host = _host(logits, [2])
    assert host.row(0).tolist() == [3, 7]
    assert "not in its support" in host.problem(0, 12)


def test_rows_with_no_finite_logit_are_a_problem():
    logits = torch.full((2, 50), float("nan"))
    logits[1, :] = float("-inf")
    host = _host(logits, [5, 5])
    for r in range(2):
        assert host.counts[r] == 0 and "no finite logit" in host.problem(r, 0)


def test_rows_that_sampled_nothing_are_empty():
    logits = _processed(rows=3)
    host = _host(logits, [5, 5, 5], num_sampled=np.array([1, 0, 1]))
    assert len(host.row(1)) == 0 and len(host.row(0)) == 5 and len(host.row(2)) == 5


def test_accumulator_spans_match_appended_supports():
    acc = MaskAccumulator()
    rows = [[1, 2, 3], [4], list(range(300)), [7, 8]]
    for r in rows:
        acc.append(np.array(r, dtype=np.int32), np.array([len(r)], dtype=np.int32))
    acc.append(np.array([9, 10, 11], dtype=np.int32), np.array([1, 2], dtype=np.int32))
    rows += [[9], [10, 11]]
    assert len(acc) == 6
    assert acc.mask().token_ids == rows
    assert acc.mask(4, 6).token_ids == rows[4:]
    early = acc.mask(0, 2)
    for _ in range(100):  # growth must not disturb masks already handed out
        acc.append(np.arange(50, dtype=np.int32), np.array([50], dtype=np.int32))
    assert early.token_ids == rows[:2]


def test_startup_rules_name_each_fix():
    ok = dict(logprobs_mode="processed_logprobs", use_v2_model_runner=True,
              speculative=None, logits_processors=None, runner_type="generate",
              is_diffusion=False)
    assert startup_errors(**ok) == []
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    cases = {
        "logprobs_mode": ("raw_logprobs", "--logprobs-mode processed_logprobs"),
        "logits_processors": (["x.Y"], "--logits-processors"),
        "runner_type": ("pooling", "pooling"),
        "is_diffusion": (True, "diffusion"),
    }
    for key, (value, fix) in cases.items():
        errors = startup_errors(**{**ok, key: value})
        assert len(errors) == 1 and fix in errors[0], (key, errors)
    v1 = {**ok, "use_v2_model_runner": False}
    # the V1 runner takes custom logits processors (inside its sampler); both
    # runners speculative decoding with the standard rejection sampler
    assert startup_errors(**{**v1, "logits_processors": ["x.Y"]}) == []
    assert startup_errors(**{**v1, "speculative": ngram}) == []
    assert startup_errors(**{**ok, "speculative": ngram}) == []
    refused = {
        "rejection_sample_method 'standard'": {**ngram, "rejection_sample_method": "synthetic"},
        "'block'": {**ngram, "rejection_sample_method": "block"},
        "enable_adaptive_verification": {**ngram, "enable_adaptive_verification": True},
    }
    for fix, speculative in refused.items():
        errors = startup_errors(**{**v1, "speculative": speculative})
        assert len(errors) == 1 and fix in errors[0], (fix, errors)
    # custom processors are not applied at draft positions
    errors = startup_errors(**{**v1, "speculative": ngram, "logits_processors": ["x.Y"]})
    assert len(errors) == 1 and "draft positions" in errors[0], errors


def test_request_rules():
    def resolve(requested=None, engine_on=True, temperature=1.0, top_k=0, top_p=1.0,
                min_p=0.0, max_size=4096):
        return resolve_request(engine_on=engine_on, requested=requested,
                               temperature=temperature, top_k=top_k, top_p=top_p,
                               min_p=min_p, max_size=max_size)
    # default (null): a mask exactly when the distribution is truncated
    assert resolve(top_k=50) == (True, None)
    assert resolve(top_p=0.9) == (True, None) and resolve(min_p=0.1) == (True, None)
    assert resolve() == (False, None)                           # untruncated
    assert resolve(temperature=0.0, top_k=50) == (False, None)  # greedy
    assert resolve(top_k=5000) == (False, None)  # above the limit: no mask, never refused
    # explicit
    assert resolve(False, top_k=50) == (False, None)
    assert resolve(True) == (True, None)
    assert resolve(True, temperature=0.0)[1][0] == "temperature"
    assert resolve(True, top_k=5000)[1][0] == "top_k"
    assert resolve("yes")[1][0] == "return_sampling_mask"
    # an engine without the flag
    assert resolve(None, engine_on=False, top_k=50) == (False, None)
    assert resolve(False, engine_on=False) == (False, None)
    problem = resolve(True, engine_on=False)[1]
    assert problem[0] == "return_sampling_mask" and "--return-sampling-mask" in problem[1]


def test_mask_copy_lets_the_block_go_once_read_and_owns_what_it_returns():
    """(The device-side half, that a copy keeps its block alive until `result`
    while the main stream reuses memory, is a CUDA test in test_gpu.py: on CPU
    the host view is the block itself.) Here: once read, a copy drops every
    reference to the block (it can be reused), and what it returned does not
    alias the block (a reused block cannot change a decoded mask)."""
    import gc
    import weakref
    logits = _processed(rows=4)
    want = [torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist() for r in range(4)]
    copies = []
    for _ in range(4):                        # several steps in flight, read in order
        mask = extract_support(logits, plan_layout([5] * 4, logits.shape[1]))
        copies.append((MaskCopy(mask, pool=None), mask.block, weakref.ref(mask.block)))
        del mask
    results = []
    for copy, block, _ in copies:
        results.append(copy.result(np.ones(4)))
        block.fill_(7)                        # the block is reused after the read
    for host in results:
        assert [host.row(r).tolist() for r in range(4)] == want
        assert host.counts.tolist() == [len(w) for w in want]
    del block
    copies = [ref for _, _, ref in copies]
    gc.collect()
    assert all(ref() is None for ref in copies)


def test_wide_rows_unpack_in_linear_time_from_their_crossing_word():
    from vllm_sampling_mask.worker.transport import unpack_wide_row
    keep = np.zeros(320, dtype=bool)
    keep[[3, 40, 41, 100, 101, 300]] = True
    words = np.packbits(keep, bitorder="little").view(np.int32)
    # head = the first 3 ids; bits valid from word 1 (ids >= 32) on, as the kernel writes
    got = unpack_wide_row(np.array([3, 40, 41], dtype=np.int32), words, start_word=1)
    assert got.tolist() == [3, 40, 41, 100, 101, 300]


def test_batches_of_several_chunks_are_extracted_whole():
    """The torch path runs chunks of rows: every chunk, selected rows or not."""
    vocab = 3000
    logits = _processed(rows=9, vocab=vocab, k=7, seed=4)
    two_rows = ExtractionSettings(chunk_elements=2 * vocab)     # two rows per chunk
    for wanted in (np.ones(9, bool), np.arange(9) % 2 == 0):
        layout, rows = plan_step(np.full(9, 7), wanted, vocab, max_size=4096)
        mask = extract_support(logits, layout, rows, implementation="torch",
                               settings=two_rows)
        host = MaskCopy(mask, pool=None).result(np.ones(9))
        for r in np.flatnonzero(wanted):
            assert host.row(r).tolist() == \
                torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist()


def _every_problem_kind(seed):
    """A step's host masks whose rows have every kind of problem `problem` reports:
    rows over the size limit, wide rows without a slot, empty rows, NaN support
    logprobs aside (tests/worker/test_support_logprobs_on_device.py), plus rows that are fine."""
    g = torch.Generator().manual_seed(seed)
    vocab, rows = 300, 12
    logits = torch.randn(rows, vocab, generator=g)
    kth = logits.topk(6, dim=-1).values[:, -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    logits[1] = float("-inf")                        # nothing kept
    logits[2, :200] = 0.0                            # over the limit of 100
    logits[3, 50:80] = 0.0                           # ties past W: takes the one slot
    logits[4, 100:140] = 0.0                         # ties past W: no slot left
    layout = MaskLayout(rows, 20, 1, vocab, max_size=100)
    sampled = np.ones(rows, dtype=np.int64)
    sampled[5] = 0                                   # sampled nothing: count 0
    return logits, MaskCopy(extract_support(logits, layout), pool=None).result(sampled)


@pytest.mark.parametrize("seed", range(4))
def test_suspects_flag_exactly_the_rows_problem_reports(seed):
    """The scheduler asks `problem` only for the rows `suspects` flags, so
    `suspects` must flag every row `problem` reports (and, being exact, no other)."""
    logits, host = _every_problem_kind(seed)
    rng = np.random.default_rng(seed)
    rows, tokens = [], []
    for r in range(len(logits)):
        support = torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist()
        outside = [t for t in range(logits.shape[1]) if t not in support]
        for token in ([rng.choice(support)] if support else []) + [rng.choice(outside)]:
            rows.append(r)
            tokens.append(int(token))
    suspects = host.suspects(np.array(rows), np.array(tokens))
    want = [host.problem(r, t) is not None for r, t in zip(rows, tokens)]
    assert suspects.tolist() == want
    assert any(want) and not all(want)
    assert host.suspects(np.array([0]), np.array([-1])).tolist() == [True]


def test_wire_rows_are_the_bytes_of_each_rows_support():
    logits, host = _every_problem_kind(0)
    wire = host.wire()
    for r in (0, 3, 6, 11):                          # fine rows and a wide row
        ids, counts, logprobs, log_kept = wire.of(r)
        assert np.frombuffer(ids, "<i4").tolist() == host.row(r).tolist()
        assert np.frombuffer(counts, "<i4").tolist() == [len(host.row(r))]
        assert logprobs is None and log_kept is None


def test_accumulator_takes_the_wire_bytes_and_joins_them_when_read():
    """What the output processor appends are the engine core's bytes; a mask read
    between appends (a stream) sees exactly the tokens so far."""
    acc = MaskAccumulator(with_logprobs=True)
    rows = [[1, 2, 3], [4], list(range(300)), [7, 8]]
    seen = []
    for i, r in enumerate(rows):
        ids = np.array(r, "<i4")
        acc.append(ids.tobytes(), np.array([len(r)], "<i4").tobytes(),
                   np.full(len(r), -i, "<f4").tobytes(), np.array([-0.5 * i], "<f4").tobytes())
        if i % 2:
            delta = acc.mask(len(acc) - 1, len(acc))
            seen.append(delta.token_ids[0])
            assert delta.logprobs.tolist() == [-i] * len(r)
    whole = acc.mask()
    assert whole.token_ids == rows and seen == [rows[1], rows[3]]
    assert whole.log_kept.tolist() == [0.0, -0.5, -1.0, -1.5]
    with pytest.raises(ValueError, match="support logprobs"):
        acc.append(b"\x01\x00\x00\x00", b"\x01\x00\x00\x00", b"", b"")
    bad = MaskAccumulator()
    bad.append(np.array([1, 2], "<i4").tobytes(), np.array([3], "<i4").tobytes())
    with pytest.raises(ValueError, match="add up to 3"):
        bad.mask()


def test_a_read_once_accumulator_hands_out_what_a_keeping_one_does():
    """A DELTA request's accumulator (`keep=False`) gives every span read in order
    the mask a keeping one gives (ids, offsets, support logprobs), whatever the
    appends (bytes or arrays, several tokens at once) and however the spans fall
    (tokens skipped, empty spans); it raises for a span before what it handed out,
    and after a stop answers None where the keeping one does."""
    rng = np.random.default_rng(11)
    for case in range(200):
        with_logprobs = bool(case % 2)
        keeping, once = (MaskAccumulator(with_logprobs, keep=k) for k in (True, False))
        read = 0
        for _ in range(rng.integers(1, 8)):
            sizes = rng.integers(0, 6, rng.integers(1, 4))
            ids = rng.integers(0, 1000, int(sizes.sum())).astype("<i4")
            parts = [ids, sizes.astype("<i4")]
            if with_logprobs:
                parts += [-rng.random(len(ids)).astype("<f4"),
                          -rng.random(len(sizes)).astype("<f4")]
            if rng.random() < 0.5:
                parts = [p.tobytes() for p in parts]
            for acc in (keeping, once):
                acc.append(*parts)
            if rng.random() < 0.7:
                first = read + int(rng.integers(0, 2)) if rng.random() < 0.2 else read
                first = min(first, len(once))
                last = int(rng.integers(first, len(once) + 1))
                assert once.first_readable == read
                assert once.mask(first, last) == keeping.mask(first, last)
                read = last
        if read:
            with pytest.raises(ValueError, match="once"):
                once.mask(read - 1, len(once))
        assert once.mask(read, len(once)) == keeping.mask(read, len(once))
    once = MaskAccumulator(keep=False)
    once.append(np.array([1, 2, 3], np.int32), np.array([2, 1], np.int32))
    assert once.mask(0, 1).token_ids == [[1, 2]]
    once.stop("dropped")
    once.skip(2)
    assert once.mask(1, 2).token_ids == [[3]] and once.mask(2, 4) is None
    assert once.mask(4, 4) is None
    bad = MaskAccumulator(keep=False)
    bad.append(np.array([1, 2], "<i4").tobytes(), np.array([3], "<i4").tobytes())
    with pytest.raises(ValueError, match="add up to 3"):
        bad.mask(0, 1)


def test_newest_reads_a_delta_outputs_tokens_as_mask_does():
    """`newest(n)`, the output processor's read of a DELTA output, gives the mask of
    the last `n` tokens that arrived, as a keeping accumulator's `mask` does, on its
    one-call path (a step of one token as the engine core's bytes) and off it
    (arrays, several tokens, steps joined, support logprobs, after a stop); a count
    that is not the ids' number raises, and a step's offsets are read-only."""
    rng = np.random.default_rng(5)
    for case in range(100):
        with_logprobs = bool(case % 2)
        keeping, once = (MaskAccumulator(with_logprobs, keep=k) for k in (True, False))
        for step in range(12):
            sizes = rng.integers(0, 40, 1 if rng.random() < 0.7 else rng.integers(1, 4))
            ids = np.sort(rng.choice(5000, int(sizes.sum()), replace=False)).astype("<i4")
            parts = [ids, sizes.astype("<i4")]
            if with_logprobs:
                parts += [-rng.random(len(ids)).astype("<f4"),
                          -rng.random(len(sizes)).astype("<f4")]
            as_bytes = rng.random() < 0.8
            if as_bytes:
                parts = [p.tobytes() for p in parts]
            for acc in (keeping, once):
                acc.append(*parts)
            new = len(once) - once.first_readable
            if rng.random() < 0.75:      # else the next step's output joins this one's
                got = once.newest(new)
                assert got == keeping.mask(len(keeping) - new)
                # the one-call path's offsets: shared by every step of that size
                assert got.offsets.flags.writeable == (new > 1 or not as_bytes)
                assert once.first_readable == len(once)
        if case == 0:
            once.stop("dropped")
            once.skip(1)
            assert once.newest(1) is None and keeping.mask(0, 1) is not None
    bad = MaskAccumulator(keep=False)
    bad.append(np.array([1, 2], "<i4").tobytes(), np.array([3], "<i4").tobytes())
    with pytest.raises(ValueError, match="add up to 3"):
        bad.newest(1)
    kept = MaskAccumulator()
    kept.append(np.array([4], "<i4").tobytes(), np.array([1], "<i4").tobytes())
    kept.append(np.array([5, 6], "<i4").tobytes(), np.array([2], "<i4").tobytes())
    assert kept.newest(1).token_ids == [[5, 6]] and kept.newest(2).token_ids == [[4], [5, 6]]
