"""Support logprobs from the sampler's device tensors to the user's `SamplingMask`,
without an engine: the scaled-top capture against the scaled-logits path, host
alignment in `transport.decode` / `MaskCopy` (narrow, wide, rows that did not ask),
the accumulator's spans, `SamplingMask` (lists, packed, concat, pickle), the
request rules, and the state's per-row `asked` through batch moves."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_support_logprobs_on_device import make_batch

from vllm_sampling_mask.frontend.accumulator import MaskAccumulator
from vllm_sampling_mask.worker.extraction import ExtractionSettings, extract_support, plan_layout
from vllm_sampling_mask.formats.packed_wire import decode_floats, encode_floats
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
from vllm_sampling_mask.worker.support_logprobs import gather_support_logprobs, scaled_top_logprob
from vllm_sampling_mask.worker.transport import MaskCopy
from vllm_sampling_mask.frontend.validation import resolve_logprobs_request
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.requests import MaskRequests


def _step(subset: bool):
    rows, vocab = 11, 3000
    _, scaled, keep, processed, top_k = make_batch(rows, vocab, 1, torch.float32, ties=True)
    settings = ExtractionSettings(tie_margin=4)
    mask_rows = np.array([0, 2, 3, 5, 7, 8, 10]) if subset else None
    picked = np.arange(rows) if mask_rows is None else mask_rows
    layout = plan_layout(top_k[picked], vocab, max_size=4096, settings=settings)
    mask = extract_support(processed.float(), layout, mask_rows, settings=settings)
    asked = np.ones(layout.rows, bool)
    asked[1] = False
    return scaled, keep, processed, mask, asked, picked


@pytest.mark.parametrize("subset", [False, True])
def test_the_scaled_top_capture_gives_the_same_log_s(subset):
    scaled, keep, processed, mask, asked, picked = _step(subset)
    full = gather_support_logprobs(processed.float(), scaled.float(), mask, asked)
    batch_asked = np.zeros(scaled.shape[0], bool)
    batch_asked[picked[asked]] = True
    top = scaled_top_logprob(scaled.float(), np.flatnonzero(batch_asked))
    quick = gather_support_logprobs(processed.float(), None, mask, asked, scaled_top=top)
    assert torch.allclose(quick.log_kept, full.log_kept, atol=2e-6)
    assert torch.equal(quick.values.nan_to_num(9.0), full.values.nan_to_num(9.0))
    # Model Runner V2 hands processed *logits*: normalised here, same values
    logits = torch.where(keep, scaled, torch.tensor(-np.inf, dtype=torch.float64)).float()
    v2 = gather_support_logprobs(logits, None, mask, asked, scaled_top=top, normalise=True)
    assert torch.allclose(v2.values.nan_to_num(9.0), full.values.nan_to_num(9.0), atol=2e-6)
    assert torch.allclose(v2.log_kept, full.log_kept, atol=2e-6)


@pytest.mark.parametrize("subset", [False, True])
def test_the_copy_aligns_values_with_the_flat_ids(subset):
    scaled, keep, processed, mask, asked, picked = _step(subset)
    mask.support_logprobs = gather_support_logprobs(processed.float(), scaled.float(),
                                                    mask, asked)
    step = MaskCopy(mask, None).result()
    assert step.logprobs.dtype == np.float32 and len(step.logprobs) == len(step.ids)
    assert step.wide, "a wide row must be exercised"
    for block_row, batch_row in enumerate(picked):
        if not asked[block_row]:
            assert not step.asked(int(batch_row))
            assert np.all(np.isnan(step.row_logprobs(int(batch_row))))
            continue
        assert step.asked(int(batch_row))
        support = step.row(int(batch_row))
        want = processed[batch_row, support].numpy()
        np.testing.assert_allclose(step.row_logprobs(int(batch_row)), want, atol=5e-5)
        log_s = torch.logsumexp(torch.log_softmax(scaled[batch_row], -1)[keep[batch_row]], 0)
        assert abs(float(step.log_kept[step.row_of[batch_row]]) - float(log_s)) < 5e-5
    # a step without support logprobs has none
    mask.support_logprobs = None
    bare = MaskCopy(mask, None).result()
    assert bare.logprobs is None and not bare.asked(int(picked[0]))


def test_the_accumulator_returns_spans_with_their_logprobs():
    acc = MaskAccumulator(with_logprobs=True)
    rng = np.random.default_rng(0)
    want_ids, want_lp, want_kept, counts = [], [], [], []
    for step in range(200):
        n = int(rng.integers(1, 40))
        ids = np.sort(rng.choice(1000, n, replace=False)).astype(np.int32)
        lp = rng.standard_normal(n).astype(np.float32)
        kept = np.array([-rng.random()], np.float32)
        acc.append(ids, np.array([n], np.int32), lp, kept)
        want_ids.append(ids), want_lp.append(lp), want_kept.append(kept), counts.append(n)
    whole = acc.mask()
    assert np.array_equal(whole.logprobs, np.concatenate(want_lp))
    assert np.array_equal(whole.log_kept, np.concatenate(want_kept))
    span = acc.mask(50, 60)
    assert np.array_equal(span.logprobs_of(3), want_lp[53])
    assert np.array_equal(span.log_kept, np.concatenate(want_kept[50:60]))
    with pytest.raises(ValueError, match="support logprobs"):
        acc.append(np.array([1], np.int32), np.array([1], np.int32))
    assert MaskAccumulator().mask().logprobs is None


def test_sampling_mask_lists_packed_concat_and_pickle():
    ids = [[1, 5, 9], [2], [3, 4]]
    lps = [[-0.5, -1.5, -2.0], [0.0], [-0.1, -2.3]]
    kept = [-0.25, 0.0, -1.0]
    m = SamplingMask.from_lists(ids, lps, kept)
    assert m.logprob_lists() == [list(np.float32(v) for v in r) for r in lps]
    packed = m.to_packed()
    assert set(packed) == {"format", "tokens", "data", "logprobs", "log_kept"}
    choice = {"index": 0, "sampling_mask": packed, "token_ids": [5, 2, 3]}
    assert SamplingMask.from_response(choice) == m
    lists = {"index": 0, "sampling_mask": ids, "sampling_mask_logprobs": lps,
             "sampling_mask_log_kept": kept}
    assert SamplingMask.from_response(lists) == m
    chunks = [{"choices": [{"index": 0, "sampling_mask": ids[:1],
                            "sampling_mask_logprobs": lps[:1],
                            "sampling_mask_log_kept": kept[:1]}]},
              {"choices": [{"index": 0, "sampling_mask": SamplingMask.from_lists(
                  ids[1:], lps[1:], kept[1:]).to_packed()}]}]
    assert SamplingMask.from_response(chunks) == m
    assert pickle.loads(pickle.dumps(m)) == m
    assert SamplingMask.from_lists(ids) != m      # the logprobs are part of the value
    assert SamplingMask.concat([m, SamplingMask.from_lists(ids)]).logprobs is None
    with pytest.raises(ValueError, match="come together"):
        SamplingMask(m.ids, m.offsets, m.logprobs, None)
    with pytest.raises(ValueError, match="logprobs"):
        SamplingMask(m.ids, m.offsets, m.logprobs[:-1], m.log_kept)
    with pytest.raises(ValueError, match="float32"):
        decode_floats(encode_floats([1.0, 2.0]), 3, "logprobs")
    with pytest.raises(ValueError, match="no support logprobs"):
        SamplingMask.from_lists(ids).logprobs_of(0)


def test_the_request_rules():
    ok = dict(engine_on=True, requested_mask=None)
    assert resolve_logprobs_request(requested=None, **ok) == (None, None)
    assert resolve_logprobs_request(requested=False, **ok) == (None, None)
    assert resolve_logprobs_request(requested=True, **ok) == (True, None)   # implies it
    for value in ("yes", 1):
        _, (param, message) = resolve_logprobs_request(requested=value, **ok)
        assert param == "return_sampling_mask_logprobs" and "true, false or null" in message
    _, (param, message) = resolve_logprobs_request(engine_on=False, requested=True,
                                                   requested_mask=None)
    assert "--return-sampling-mask" in message
    _, (param, message) = resolve_logprobs_request(engine_on=True, requested=True,
                                                   requested_mask=False)
    assert "return_sampling_mask=false" in message


def test_request_validation_decides_both():
    from vllm_sampling_mask.errors import SamplingMaskRequestError
    from vllm_sampling_mask.patches.frontend.feature.request_validation import decide

    def params(**extra):
        return SimpleNamespace(extra_args=extra, temperature=1.0, top_k=10, top_p=1.0,
                               min_p=0.0)

    assert decide(params(return_sampling_mask_logprobs=True)) == (True, True)
    assert decide(params()) == (True, False)
    assert decide(params(return_sampling_mask=True)) == (True, False)
    with pytest.raises(SamplingMaskRequestError, match="--return-sampling-mask"):
        decide(params(return_sampling_mask_logprobs=True), engine_on=False)
    assert decide(params(), engine_on=False) == (False, False)


def test_asked_follows_the_batch():
    state = MaskRequests(4)
    on = SimpleNamespace(extra_args={"return_sampling_mask": True,
                                     "return_sampling_mask_logprobs": True})
    mask_only = SimpleNamespace(extra_args={"return_sampling_mask": True,
                                            "return_sampling_mask_logprobs": False})
    state.apply_batch_update([(0, on), (1, mask_only), (2, on)], [], [])
    assert list(state.asked) == [True, False, True, False]
    state.apply_batch_update([], [0], [(2, 0, False), (0, 1, True)])
    assert list(state.wants[:2]) == [True, True] and list(state.asked[:2]) == [False, True]
    state.remove(1)
    assert not state.asked[1]
    # nobody asked: nothing to capture
    assert len(plans.plan(state.wants, np.zeros(4, bool), np.zeros(4)).capture_rows) == 0
