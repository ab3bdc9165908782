"""The plain modules: SamplingMask, extraction, transport, accumulation, rules."""

import numpy as np
import pytest
import torch

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.accumulator import MaskAccumulator
from vllm_sampling_mask.extraction import (MAX_WIDTH, TIE_MARGIN, extract_support,
                                           support_width)
from vllm_sampling_mask.transport import MaskCopy
from vllm_sampling_mask.validation import request_error, startup_errors


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


def test_extract_support_equals_isfinite_rows():
    logits = _processed()
    mask = extract_support(logits, support_width(5, logits.shape[1]))
    for r in range(logits.shape[0]):
        want = torch.nonzero(torch.isfinite(logits[r])).view(-1).tolist()
        got = mask.ids[r, : mask.counts[r]].tolist()
        assert got == want
        assert (mask.ids[r, mask.counts[r]:] == -1).all()


def test_ties_beyond_width_are_recovered_on_the_host():
    vocab = 300
    logits = torch.full((2, vocab), float("-inf"))
    logits[0, :5] = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.2])
    logits[1, 10:10 + 5 + TIE_MARGIN + 40] = 1.0   # top-k=5 keeps 61 ties
    mask = extract_support(logits, support_width(5, vocab))
    assert mask.counts.tolist() == [5, 5 + TIE_MARGIN + 40]
    host = MaskCopy(mask, pool=None).result(np.array([1, 1]))
    assert host.row(0).tolist() == [0, 1, 2, 3, 4]
    assert host.row(1).tolist() == list(range(10, 10 + 5 + TIE_MARGIN + 40))


def test_width_is_capped_and_wider_supports_stay_exact():
    vocab = 5000
    assert support_width(vocab, vocab) == MAX_WIDTH
    logits = torch.randn(2, vocab)
    logits[1, ::2] = float("-inf")          # 2500 finite ids > MAX_WIDTH
    host = MaskCopy(extract_support(logits, support_width(vocab, vocab)),
                    pool=None).result(np.array([1, 1]))
    assert host.row(0).tolist() == list(range(vocab))
    assert host.row(1).tolist() == list(range(1, vocab, 2))


def test_nan_logits_cannot_push_support_ids_out():
    logits = torch.full((1, 50), float("-inf"))
    logits[0, [3, 7]] = 1.0
    logits[0, 10:40] = float("nan")         # excluded, and must not outrank 3 and 7
    host = MaskCopy(extract_support(logits, 4), pool=None).result(np.array([1]))
    assert host.row(0).tolist() == [3, 7]


def test_rows_that_sampled_nothing_are_empty():
    logits = _processed(rows=3)
    host = MaskCopy(extract_support(logits, 21), pool=None).result(np.array([1, 0, 1]))
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
              speculative=False, logits_processors=None, runner_type="generate",
              is_diffusion=False)
    assert startup_errors(**ok) == []
    cases = {
        "logprobs_mode": ("raw_logprobs", "--logprobs-mode processed_logprobs"),
        "use_v2_model_runner": (False, "VLLM_USE_V2_MODEL_RUNNER=1"),
        "speculative": (True, "--speculative-config"),
        "logits_processors": (["x.Y"], "--logits-processors"),
        "runner_type": ("pooling", "pooling"),
        "is_diffusion": (True, "diffusion"),
    }
    for key, (value, fix) in cases.items():
        errors = startup_errors(**{**ok, key: value})
        assert len(errors) == 1 and fix in errors[0], (key, errors)


def test_request_rules():
    assert request_error(0.7, 50) is None
    assert request_error(0.0, 50)[0] == "temperature"
    assert request_error(1.0, -1)[0] == "top_k"
    assert request_error(1.0, 0)[0] == "top_k"
