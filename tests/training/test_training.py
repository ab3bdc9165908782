"""Tests for `vllm_sampling_mask.training` (CPU, small sizes, a few seconds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vllm_sampling_mask.training as training
import vllm_sampling_mask.training.hidden as training_hidden
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
from vllm_sampling_mask.training import (
    full_logprobs,
    importance_ratio,
    mask_to_tensors,
    nucleus_logprobs,
    nucleus_logprobs_from_hidden,
    ratio_statistics,
)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    # Tiny tensors: one thread avoids OpenMP start-up costs (and stalls when
    # the machine is shared), keeping the file fast.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def random_case(T=23, V=97, max_size=12, seed=0, singletons=(), dtype=torch.float32):
    """Logits, sampled tokens and supports (ascending, containing the token)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(T, V, generator=gen, dtype=torch.float64) * 3).to(dtype)
    tok = torch.randint(0, V, (T,), generator=gen)
    rows = []
    for t in range(T):
        if t in singletons:
            rows.append([int(tok[t])])
            continue
        k = int(torch.randint(1, max_size + 1, (1,), generator=gen))
        s = set(torch.randperm(V, generator=gen)[:k].tolist())
        s.add(int(tok[t]))
        rows.append(sorted(s))
    return logits, tok, rows


def dense_reference(logits, tok, rows, temperature=1.0):
    """The straightforward version: a [T, V] keep-mask, masked_fill, log_softmax (float64)."""
    T, V = logits.shape
    temp = torch.as_tensor(temperature, dtype=torch.float64).expand(T)
    keep = torch.zeros(T, V, dtype=torch.bool)
    for t, r in enumerate(rows):
        keep[t, r] = True
    z = logits.double() / temp[:, None]
    z = z.masked_fill(~keep, -math.inf)
    return torch.log_softmax(z, dim=-1).gather(1, tok[:, None]).squeeze(1)


@pytest.fixture(params=["sparse", "gather"])
def kernel(request, monkeypatch):
    monkeypatch.setattr(training_hidden, "_SDDMM_KERNEL", request.param)
    return request.param


# ---------------------------------------------------------------------------
# nucleus_logprobs: values
# ---------------------------------------------------------------------------

def test_matches_dense_reference_float32():
    logits, tok, rows = random_case(seed=1)
    out = nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), 0.7)
    assert out.dtype == torch.float32 and out.shape == (len(rows),)
    ref = dense_reference(logits, tok, rows, 0.7)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-6)
    assert (out <= 1e-6).all()


def test_matches_dense_reference_bfloat16_computes_in_float32():
    logits, tok, rows = random_case(seed=2, dtype=torch.bfloat16)
    out = nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), 0.9)
    assert out.dtype == torch.float32
    # Same as the float64 reference on the (exactly representable) bf16 values.
    ref = dense_reference(logits, tok, rows, 0.9)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-6)


def test_bfloat16_gradient_matches_reference():
    logits, tok, rows = random_case(seed=3, dtype=torch.bfloat16)
    x = logits.clone().requires_grad_(True)
    w = torch.randn(len(rows))
    (nucleus_logprobs(x, tok, SamplingMask.from_lists(rows), 0.8) * w).sum().backward()
    assert x.grad.dtype == torch.bfloat16
    xr = logits.double().requires_grad_(True)
    (dense_reference(xr, tok, rows, 0.8) * w.double()).sum().backward()
    # One rounding to bf16 of the float32 gradient.
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-6, rtol=2 ** -8)


def test_singleton_support_gives_zero_logprob_and_zero_gradient():
    logits, tok, rows = random_case(seed=4, singletons={0, 5, 6})
    x = logits.clone().requires_grad_(True)
    out = nucleus_logprobs(x, tok, SamplingMask.from_lists(rows))
    assert out[0].item() == 0.0 and out[5].item() == 0.0 and out[6].item() == 0.0
    out.sum().backward()
    assert x.grad[[0, 5, 6]].abs().max().item() == 0.0


def test_per_token_temperature():
    logits, tok, rows = random_case(seed=5)
    temp = torch.linspace(0.3, 1.7, len(rows))
    out = nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), temp)
    ref = dense_reference(logits, tok, rows, temp.double())
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-6)
    # A one-element tensor broadcasts like a float.
    out1 = nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), torch.tensor(0.6))
    torch.testing.assert_close(out1, nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), 0.6))


def test_packed_sequences_equal_separate_calls():
    la, ta, ra = random_case(T=9, seed=6)
    lb, tb, rb = random_case(T=14, seed=7)
    ma, mb = SamplingMask.from_lists(ra), SamplingMask.from_lists(rb)
    packed = nucleus_logprobs(torch.cat([la, lb]), torch.cat([ta, tb]), SamplingMask.concat([ma, mb]))
    separate = torch.cat([nucleus_logprobs(la, ta, ma), nucleus_logprobs(lb, tb, mb)])
    torch.testing.assert_close(packed, separate, atol=0, rtol=0)


def test_tuple_mask_forms_equal_sampling_mask():
    logits, tok, rows = random_case(seed=8)
    m = SamplingMask.from_lists(rows)
    expected = nucleus_logprobs(logits, tok, m)
    forms = [
        (m.ids, m.offsets),                                          # numpy int32 / int64
        (torch.from_numpy(m.ids), torch.from_numpy(m.offsets)),      # torch int32 / int64
        (torch.from_numpy(m.ids).long(), torch.from_numpy(m.offsets)),
        mask_to_tensors(m),
    ]
    for form in forms:
        torch.testing.assert_close(nucleus_logprobs(logits, tok, form), expected, atol=0, rtol=0)
    ids, offsets = mask_to_tensors(m)
    assert ids.dtype == offsets.dtype == torch.int64


def test_non_contiguous_logits():
    logits, tok, rows = random_case(T=11, V=40, seed=9)
    big = torch.randn(40, 2 * 11)           # logits stored transposed, every other column
    big[:, ::2] = logits.t()
    view = big[:, ::2].t()
    assert not view.is_contiguous()
    x = big.clone().requires_grad_(True)
    out = nucleus_logprobs(x[:, ::2].t(), tok, SamplingMask.from_lists(rows), 1.3)
    torch.testing.assert_close(out.double(), dense_reference(logits, tok, rows, 1.3),
                               atol=2e-6, rtol=1e-6)
    out.sum().backward()
    ref_x = logits.double().requires_grad_(True)
    dense_reference(ref_x, tok, rows, 1.3).sum().backward()
    torch.testing.assert_close(x.grad[:, ::2].t().double(), ref_x.grad, atol=1e-6, rtol=1e-5)
    assert x.grad[:, 1::2].abs().max().item() == 0.0


def test_empty_batch():
    x = torch.randn(0, 10, requires_grad=True)
    out = nucleus_logprobs(x, torch.zeros(0, dtype=torch.long), SamplingMask.from_lists([]))
    assert out.shape == (0,)
    out.sum().backward()
    assert x.grad.shape == (0, 10)


# ---------------------------------------------------------------------------
# nucleus_logprobs: gradients
# ---------------------------------------------------------------------------

def test_gradcheck_float64():
    logits, tok, rows = random_case(T=6, V=13, max_size=5, seed=10, singletons={2},
                                    dtype=torch.float64)
    m = SamplingMask.from_lists(rows)
    temp = torch.tensor([0.5, 1.0, 1.5, 0.7, 2.0, 1.1], dtype=torch.float64)
    x = logits.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: nucleus_logprobs(x, tok, m, temp), (x,))


def test_gradient_is_zero_off_support_and_matches_formula():
    logits, tok, rows = random_case(seed=11)
    temp = torch.rand(len(rows)) + 0.5
    x = logits.clone().requires_grad_(True)
    g = torch.randn(len(rows))
    (nucleus_logprobs(x, tok, SamplingMask.from_lists(rows), temp) * g).sum().backward()
    for t, r in enumerate(rows):
        off = torch.ones(logits.shape[1], dtype=torch.bool)
        off[r] = False
        assert x.grad[t, off].abs().max().item() == 0.0
        z = logits[t, r].double() / temp[t]
        p = torch.softmax(z, 0)
        expected = -p * g[t] / temp[t]
        expected[r.index(int(tok[t]))] += g[t] / temp[t]
        torch.testing.assert_close(x.grad[t, r].double(), expected, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------------------
# nucleus_logprobs_from_hidden
# ---------------------------------------------------------------------------

def hidden_case(T=19, V=83, H=16, seed=12, dtype=torch.float32, singletons=()):
    _, tok, rows = random_case(T=T, V=V, seed=seed, singletons=singletons)
    gen = torch.Generator().manual_seed(seed + 100)
    hidden = torch.randn(T, H, generator=gen, dtype=torch.float64).to(dtype)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64).to(dtype)
    bias = torch.randn(V, generator=gen, dtype=torch.float64).to(dtype)
    return hidden, weight, bias, tok, rows


@pytest.mark.parametrize("chunk_size", [None, 1, 10, 83, 200])
def test_from_hidden_matches_logits_path(kernel, chunk_size):
    hidden, weight, bias, tok, rows = hidden_case()
    m = SamplingMask.from_lists(rows)
    temp = torch.rand(len(rows)) + 0.5
    args = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    out = nucleus_logprobs_from_hidden(args[0], args[1], tok, m, temp, bias=args[2],
                                       chunk_size=chunk_size)
    refs = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    ref = nucleus_logprobs(refs[0] @ refs[1].t() + refs[2], tok, m, temp)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    g = torch.randn(len(rows))
    (out * g).sum().backward()
    (ref * g).sum().backward()
    for a, r in zip(args, refs):
        torch.testing.assert_close(a.grad, r.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_from_hidden_gradcheck_float64(kernel, chunk_size):
    hidden, weight, bias, tok, rows = hidden_case(T=5, V=11, H=3, seed=13,
                                                  dtype=torch.float64, singletons={1})
    m = SamplingMask.from_lists(rows)
    temp = torch.tensor([0.5, 1.0, 1.5, 0.7, 2.0], dtype=torch.float64)
    inputs = tuple(t.clone().requires_grad_(True) for t in (hidden, weight, bias))
    assert torch.autograd.gradcheck(
        lambda h, w, b: nucleus_logprobs_from_hidden(h, w, tok, m, temp, bias=b,
                                                     chunk_size=chunk_size),
        inputs)


def test_from_hidden_without_bias_and_frozen_weight(kernel):
    hidden, weight, _bias, tok, rows = hidden_case(seed=14)
    m = SamplingMask.from_lists(rows)
    h = hidden.clone().requires_grad_(True)
    out = nucleus_logprobs_from_hidden(h, weight, tok, m)
    torch.testing.assert_close(out, nucleus_logprobs(hidden @ weight.t(), tok, m),
                               atol=1e-5, rtol=1e-5)
    out.sum().backward()
    hr = hidden.clone().requires_grad_(True)
    nucleus_logprobs(hr @ weight.t(), tok, m).sum().backward()
    torch.testing.assert_close(h.grad, hr.grad, atol=1e-5, rtol=1e-4)
    assert weight.grad is None


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_from_hidden_bfloat16(kernel, chunk_size):
    hidden, weight, bias, tok, rows = hidden_case(seed=15, dtype=torch.bfloat16, H=32)
    m = SamplingMask.from_lists(rows)
    args = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    out = nucleus_logprobs_from_hidden(*args[:2], tok, m, 0.8, bias=args[2],
                                       chunk_size=chunk_size)
    assert out.dtype == torch.float32
    refs = [t.double().requires_grad_(True) for t in (hidden, weight, bias)]
    ref = nucleus_logprobs(refs[0] @ refs[1].t() + refs[2], tok, m, 0.8)
    torch.testing.assert_close(out.double(), ref, atol=5e-5, rtol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for a, r in zip(args, refs):
        assert a.grad.dtype == torch.bfloat16
        torch.testing.assert_close(a.grad.double(), r.grad, atol=1e-4, rtol=2 ** -7)


def test_from_hidden_singletons_and_empty(kernel):
    hidden, weight, bias, tok, rows = hidden_case(seed=16, singletons={0, 3})
    out = nucleus_logprobs_from_hidden(hidden, weight, tok, SamplingMask.from_lists(rows), bias=bias)
    assert out[0].item() == 0.0 and out[3].item() == 0.0
    w = weight.clone().requires_grad_(True)
    empty = nucleus_logprobs_from_hidden(hidden[:0], w, tok[:0], SamplingMask.from_lists([]),
                                         chunk_size=20)
    assert empty.shape == (0,)
    empty.sum().backward()
    assert w.grad.abs().max().item() == 0.0


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# empty_support="full": a token without a mask takes the full softmax
# ---------------------------------------------------------------------------

def unmasked_reference(logits, tok, rows, temperature):
    """Each row over its support, an empty row over the whole vocabulary (float64)."""
    return dense_reference(logits, tok, [r if r else range(logits.shape[1]) for r in rows],
                           temperature)


EMPTY_ROWS = (0, 4, 5, 11, 22)   # the first, two in a row, one in the middle, the last


@pytest.mark.parametrize("temperature", [0.7, "per-token"])
def test_empty_support_full_takes_the_full_softmax_on_those_rows(temperature):
    logits, tok, rows = random_case(T=23, V=97, seed=21, dtype=torch.float64)
    rows = [[] if t in EMPTY_ROWS else r for t, r in enumerate(rows)]
    if temperature == "per-token":
        temperature = torch.linspace(0.5, 1.5, 23, dtype=torch.float64)
    mask = SamplingMask.from_lists(rows)
    x = logits.clone().requires_grad_()
    out = nucleus_logprobs(x, tok, mask, temperature, empty_support="full")
    ref_x = logits.clone().requires_grad_()
    ref = unmasked_reference(ref_x, tok, rows, temperature)
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.allclose(out[list(EMPTY_ROWS)],
                          full_logprobs(logits, tok, temperature)[list(EMPTY_ROWS)], atol=1e-12)
    weights = torch.randn(23, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (out * weights).sum().backward()
    (ref * weights).sum().backward()
    assert torch.allclose(x.grad, ref_x.grad, atol=1e-12)
    # an empty row's gradient reaches every id; a masked row's only its support
    assert (x.grad[4] != 0).all()
    assert (x.grad[1] != 0).sum() == len(rows[1]) or len(rows[1]) == 1


def test_empty_support_full_from_hidden_matches_logits_path(kernel):
    hidden, weight, bias, tok, rows = hidden_case(dtype=torch.float64)
    rows = [[] if t in (0, 3, 18) else r for t, r in enumerate(rows)]
    mask = SamplingMask.from_lists(rows)
    h, w, b = (t.clone().requires_grad_() for t in (hidden, weight, bias))
    out = nucleus_logprobs_from_hidden(h, w, tok, mask, 0.8, bias=b, empty_support="full")
    h2, w2, b2 = (t.clone().requires_grad_() for t in (hidden, weight, bias))
    ref = unmasked_reference(h2 @ w2.T + b2, tok, rows, 0.8)
    assert torch.allclose(out, ref, atol=1e-10)
    out.sum().backward()
    ref.sum().backward()
    for got, want in ((h, h2), (w, w2), (b, b2)):
        assert torch.allclose(got.grad, want.grad, atol=1e-10)
    assert torch.autograd.gradcheck(
        lambda h, w: nucleus_logprobs_from_hidden(h, w, tok, mask, 0.8, empty_support="full"),
        (hidden[:, :4].clone().requires_grad_(), weight[:, :4].clone().requires_grad_()))


def test_empty_support_full_with_every_row_empty_is_full_logprobs():
    logits, tok, _ = random_case(T=6, V=13, seed=5)
    mask = SamplingMask.from_lists([[]] * 6)
    out = nucleus_logprobs(logits, tok, mask, 1.3, empty_support="full", validate=False)
    assert torch.allclose(out, full_logprobs(logits, tok, 1.3), atol=1e-6)


def test_empty_support_full_without_empty_rows_is_the_default():
    logits, tok, rows = random_case(seed=8)
    mask = SamplingMask.from_lists(rows)
    assert torch.equal(nucleus_logprobs(logits, tok, mask, empty_support="full"),
                       nucleus_logprobs(logits, tok, mask))


def test_empty_support_default_refuses_naming_the_option():
    logits, tok, rows = random_case(T=5, seed=9)
    rows[3] = []
    with pytest.raises(ValueError, match=r"empty support at token t=3.*empty_support=\"full\""):
        nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows))
    with pytest.raises(ValueError, match=r"empty_support must be one of \('error', 'full'\)"):
        nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), empty_support="skip")


def test_empty_support_full_still_checks_the_other_rows():
    logits, tok, rows = random_case(T=5, seed=10)
    rows[1] = []
    rows[2] = [r for r in rows[2] if r != int(tok[2])] or [int(tok[2]) ^ 1]
    with pytest.raises(ValueError, match=r"sampled token .* at token t=2 is not inside"):
        nucleus_logprobs(logits, tok, SamplingMask.from_lists(rows), empty_support="full")


def valid_small():
    logits = torch.randn(4, 10)
    tok = torch.tensor([1, 2, 3, 4])
    ids = torch.tensor([0, 1, 2, 5, 3, 4, 9], dtype=torch.int32)
    offsets = torch.tensor([0, 2, 4, 5, 7])
    return logits, tok, ids, offsets


def test_valid_small_is_valid():
    logits, tok, ids, offsets = valid_small()
    assert nucleus_logprobs(logits, tok, (ids, offsets)).shape == (4,)


@pytest.mark.parametrize("case, match", [
    ("token_not_in_support", r"sampled token 8 at token t=2 is not inside its support"),
    ("id_negative", r"mask id -1 at token t=1 .*outside the vocabulary \[0, 10\)"),
    ("id_too_large", r"mask id 10 at token t=3 .*outside the vocabulary \[0, 10\)"),
    ("token_out_of_vocab", r"sampled token 12 at token t=0 is outside the vocabulary"),
    ("offsets_start", r"offsets must start at 0 \(got offsets\[0\]=1\)"),
    ("offsets_decreasing", r"non-decreasing.*t=1"),
    ("offsets_end", r"must end at len\(ids\)=7 \(got offsets\[-1\]=6\)"),
    ("empty_support", r"empty support at token t=2"),
    ("duplicate_sorted", r"id 4 is listed twice in the support of token t=3"),
    ("duplicate_unsorted", r"id 1 is listed twice in the support of token t=0"),
    ("mask_too_short", r"mask covers 3 tokens but there are 4 positions"),
    ("tokens_too_short", r"token_ids has 3 entries but there are 4 positions"),
    ("temperature_zero", r"temperature must be positive"),
    ("temperature_negative", r"temperature must be positive"),
    ("temperature_tensor_zero_at_2", r"temperature\[2\]=0.0 at token t=2"),
    ("temperature_tensor_nan_at_1", r"temperature\[1\]=nan at token t=1"),
    ("temperature_wrong_length", r"temperature must be a float or a \[T\] tensor with T=4"),
])
def test_bad_input_raises_naming_position(case, match):
    logits, tok, ids, offsets = valid_small()
    temp = 1.0
    if case == "token_not_in_support":
        tok = torch.tensor([1, 2, 8, 4])
    elif case == "id_negative":
        ids = ids.clone(); ids[2] = -1
    elif case == "id_too_large":
        ids = ids.clone(); ids[6] = 10
    elif case == "token_out_of_vocab":
        tok = torch.tensor([12, 2, 3, 4])
    elif case == "offsets_start":
        offsets = torch.tensor([1, 2, 4, 5, 7])
    elif case == "offsets_decreasing":
        offsets = torch.tensor([0, 4, 2, 5, 7])
    elif case == "offsets_end":
        offsets = torch.tensor([0, 2, 4, 5, 6])
    elif case == "empty_support":
        ids = torch.tensor([0, 1, 2, 5, 4, 9])
        offsets = torch.tensor([0, 2, 4, 4, 6])
    elif case == "duplicate_sorted":
        ids = torch.tensor([0, 1, 2, 5, 3, 4, 4])
    elif case == "duplicate_unsorted":
        ids = torch.tensor([1, 1, 5, 2, 3, 4, 9])
        tok = torch.tensor([1, 2, 3, 4])
    elif case == "mask_too_short":
        offsets = offsets[:-1].clone(); offsets[-1] = 7
    elif case == "tokens_too_short":
        tok = tok[:3]
    elif case == "temperature_zero":
        temp = 0.0
    elif case == "temperature_negative":
        temp = -0.5
    elif case == "temperature_tensor_zero_at_2":
        temp = torch.tensor([1.0, 0.5, 0.0, 1.0])
    elif case == "temperature_tensor_nan_at_1":
        temp = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    elif case == "temperature_wrong_length":
        temp = torch.ones(3)
    with pytest.raises(ValueError, match=match):
        nucleus_logprobs(logits, tok, (ids, offsets), temp)
    # The hidden-state entry point runs the same checks.
    if case not in ("temperature_wrong_length",):
        hidden, weight = torch.randn(4, 3), torch.randn(10, 3)
        with pytest.raises(ValueError, match=match):
            nucleus_logprobs_from_hidden(hidden, weight, tok, (ids, offsets), temp)


def test_bad_shapes():
    logits, tok, ids, offsets = valid_small()
    with pytest.raises(ValueError, match="logits must be a"):
        nucleus_logprobs(logits[0], tok, (ids, offsets))
    with pytest.raises(ValueError, match="floating"):
        nucleus_logprobs(logits.long(), tok, (ids, offsets))
    with pytest.raises(ValueError, match="mask ids must have an integer dtype"):
        nucleus_logprobs(logits, tok, (ids.float(), offsets))
    with pytest.raises(TypeError, match="SamplingMask or a pair"):
        nucleus_logprobs(logits, tok, ids)
    with pytest.raises(ValueError, match="hidden sizes differ"):
        nucleus_logprobs_from_hidden(torch.randn(4, 3), torch.randn(10, 5), tok, (ids, offsets))
    with pytest.raises(ValueError, match=r"bias must be \[V\]"):
        nucleus_logprobs_from_hidden(torch.randn(4, 3), torch.randn(10, 3), tok, (ids, offsets),
                                     bias=torch.randn(9))
    with pytest.raises(ValueError, match="chunk_size"):
        nucleus_logprobs_from_hidden(torch.randn(4, 3), torch.randn(10, 3), tok, (ids, offsets),
                                     chunk_size=0)


def test_validate_false_skips_checks_and_keeps_the_formula():
    logits, tok, ids, offsets = valid_small()
    same = nucleus_logprobs(logits, tok, (ids, offsets), validate=False)
    torch.testing.assert_close(same, nucleus_logprobs(logits, tok, (ids, offsets)), atol=0, rtol=0)
    # Token 2 (t=2) replaced by 8, outside its support {3}: no error, and the
    # value is logits[2, 8] - logsumexp(logits[2, [3]]), which can be positive.
    bad_tok = torch.tensor([1, 2, 8, 4])
    x = logits.clone().requires_grad_(True)
    out = nucleus_logprobs(x, bad_tok, (ids, offsets), validate=False)
    torch.testing.assert_close(out[2], logits[2, 8] - logits[2, 3])
    out[2].backward()
    assert x.grad[2, 8].item() == 1.0 and x.grad[2, 3].item() == -1.0
    assert x.grad.abs().sum().item() == 2.0
    hidden, weight = torch.randn(4, 3), torch.randn(10, 3)
    out_h = nucleus_logprobs_from_hidden(hidden, weight, bad_tok, (ids, offsets), validate=False)
    torch.testing.assert_close(out_h, nucleus_logprobs(hidden @ weight.t(), bad_tok, (ids, offsets),
                                                       validate=False), atol=1e-6, rtol=1e-6)


# Every way an op can read a tensor's values on the host (a device sync on CUDA).
HOST_READS = ("tolist", "item", "cpu", "numpy", "equal", "__bool__", "__int__",
              "__float__", "__index__", "__array__")


def test_validation_syncs_are_constant(monkeypatch):
    """Validation reads values on the host a fixed number of times, not per token."""
    calls = {"n": 0}

    def counting(real):
        def read(self, *args, **kwargs):
            calls["n"] += 1
            return real(self, *args, **kwargs)
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    for T in (4, 200):
        logits, tok, rows = random_case(T=T, seed=T)
        ids, offsets = mask_to_tensors(SamplingMask.from_lists(rows))
        calls["n"] = 0
        nucleus_logprobs(logits, tok, (ids, offsets))
        assert calls["n"] == 2
        calls["n"] = 0
        nucleus_logprobs(logits, tok, (ids, offsets), validate=False)
        assert calls["n"] == 0


# ---------------------------------------------------------------------------
# full_logprobs, importance_ratio
# ---------------------------------------------------------------------------

def test_full_logprobs():
    logits, tok, _ = random_case(seed=17, dtype=torch.bfloat16)
    temp = torch.rand(logits.shape[0]) + 0.5
    out = full_logprobs(logits, tok, temp)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(logits.double() / temp.double()[:, None], -1).gather(1, tok[:, None])[:, 0]
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-6)
    # A full-vocabulary support gives the same value through nucleus_logprobs.
    V = logits.shape[1]
    full_mask = SamplingMask.from_lists([list(range(V))] * logits.shape[0])
    torch.testing.assert_close(nucleus_logprobs(logits, tok, full_mask, temp), out,
                               atol=2e-6, rtol=1e-6)
    x = logits[:4, :20].double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: full_logprobs(x, tok[:4] % 20, 0.7), (x,))
    with pytest.raises(ValueError, match="t=1 is outside the vocabulary"):
        full_logprobs(logits[:3], torch.tensor([0, V, 1]))
    with pytest.raises(ValueError, match="temperature"):
        full_logprobs(logits, tok, 0.0)


def test_importance_ratio():
    new = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old = np.array([-1.5, -1.0, -0.5])
    r = importance_ratio(new, old)
    torch.testing.assert_close(r, torch.exp(new.detach() - torch.tensor(old, dtype=torch.float32)))
    r.sum().backward()
    torch.testing.assert_close(new.grad, r.detach())
    old_t = torch.tensor(old, dtype=torch.float32, requires_grad=True)
    importance_ratio(new, old_t).sum().backward()
    assert old_t.grad is None                      # old logprobs are constants
    clipped = importance_ratio(new, old, clip=0.2)
    torch.testing.assert_close(clipped, torch.tensor([1.2, math.exp(-1.0), 1.0]).clamp(0.8, 1.2))
    torch.testing.assert_close(importance_ratio(new, old, clip=(None, 1.5)),
                               torch.tensor([1.5, math.exp(-1.0), 1.0]))
    torch.testing.assert_close(importance_ratio(new, old, clip=(None, None)), r)
    with pytest.raises(ValueError, match="shape"):
        importance_ratio(new, old[:2])
    with pytest.raises(ValueError, match="clip"):
        importance_ratio(new, old, clip=-0.1)
    with pytest.raises(ValueError, match="clip low"):
        importance_ratio(new, old, clip=(2.0, 1.0))


def test_ratio_statistics_against_hand_computation():
    # ratios 1, 2, 1/2, 1.05 (old logprobs not all zero: only the difference counts)
    old = np.array([-0.3, -1.0, -2.0, -0.7])
    log_r = np.array([0.0, math.log(2.0), math.log(0.5), math.log(1.05)])
    new = torch.tensor(old + log_r, requires_grad=True)          # a trainer tensor
    st = ratio_statistics(new, old.tolist(), support_sizes=[1, 3, 1, 10])
    assert st["tokens"] == 4 and isinstance(st["tokens"], int)
    assert all(type(v) is float for k, v in st.items() if k != "tokens")
    # k3 = r - 1 - log r: 0, 1 - ln 2, ln 2 - 1/2, 0.05 - ln 1.05
    assert st["mismatch_kl"] == pytest.approx((0.5 + 0.05 - math.log(1.05)) / 4, rel=1e-12)
    assert st["ratio_mean"] == pytest.approx((1 + 2 + 0.5 + 1.05) / 4, rel=1e-12)
    # sorted ratios 0.5, 1, 1.05, 2: p1 at rank 0.03, p99 at rank 2.97
    assert st["ratio_p1"] == pytest.approx(0.5 + 0.03 * 0.5, rel=1e-12)
    assert st["ratio_p99"] == pytest.approx(1.05 + 0.97 * 0.95, rel=1e-12)
    assert st["out_of_band"] == 0.5                               # 2 and 0.5
    assert st["support_mean"] == 3.75
    assert st["support_median"] == 2.0                           # 1, 1, 3, 10
    assert st["support_p99"] == pytest.approx(3 + 0.97 * 7, rel=1e-12)
    assert st["singleton_share"] == 0.5
    # the band is closed, and only exact ratios of 1 lie in [1, 1]
    assert ratio_statistics(new, old, band=(1.0, 1.0))["out_of_band"] == 0.75
    assert ratio_statistics(new, old, band=(0.4, 2.1))["out_of_band"] == 0.0
    # without sizes, no support keys; equal inputs give KL 0 and ratio 1
    same = ratio_statistics(np.array(old, dtype=np.float32), torch.tensor(old, dtype=torch.float32))
    assert "support_mean" not in same
    assert same["mismatch_kl"] == 0.0 and same["ratio_mean"] == 1.0
    assert same["ratio_p1"] == same["ratio_p99"] == 1.0 and same["out_of_band"] == 0.0


@pytest.mark.parametrize("args, kwargs, match", [
    (([0.0, 1.0], [0.0]), {}, "2 entries but old_logprobs has 1"),
    (([], []), {}, "at least one token"),
    (([[0.0]], [[0.0]]), {}, "1-D"),
    (([0.0, math.nan], [0.0, 0.0]), {}, r"new_logprobs\[1\]=nan is not finite"),
    (([0.0, 0.0], [0.0, -math.inf]), {}, r"old_logprobs\[1\]"),
    (([0.0, 0.0], [0.0, 0.0]), {"support_sizes": [1]}, "support_sizes has 1 entries"),
    (([0.0, 0.0], [0.0, 0.0]), {"support_sizes": [1, 0]}, r"support_sizes\[1\]=0"),
    (([0.0, 0.0], [0.0, 0.0]), {"support_sizes": [1.5, 2]}, "integers"),
    (([0.0, 0.0], [0.0, 0.0]), {"band": (1.1, 0.9)}, "band low"),
    ((["a"], [0.0]), {}, "new_logprobs must be"),
])
def test_ratio_statistics_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ratio_statistics(*args, **kwargs)


def test_module_imports_only_torch_numpy_stdlib():
    """The trainer's side needs no vLLM: torch, numpy, the stdlib, and of this package
    only `sampling_mask` (numpy only) and the training package's own modules."""
    import ast
    import pathlib
    import sys
    files = sorted(pathlib.Path(training.__file__).parent.glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "inputs", "segments", "logits", "hidden",
                                       "ratio"}
    roots, own, relative = set(), set(), set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots.add(node.module.split(".")[0])
                if node.module.startswith("vllm_sampling_mask"):
                    own.add(node.module)
            elif isinstance(node, ast.ImportFrom):
                relative.add((node.level, node.module))
    allowed = {"torch", "numpy", "__future__", "vllm_sampling_mask"}
    assert roots <= allowed | set(sys.stdlib_module_names), roots
    assert own <= {"vllm_sampling_mask.frontend.sampling_mask"}, own
    # relative imports stay inside the package (`from .x import ...`)
    assert all(level == 1 for level, _ in relative), relative
    assert {m for _, m in relative} <= {f.stem for f in files}, relative
    mask_src = open(sys.modules["vllm_sampling_mask.frontend.sampling_mask"].__file__).read()
    assert "import vllm" not in mask_src and "import torch" not in mask_src


def test_package_exports_the_public_names():
    """The package keeps training.py's API: every name in __all__ importable from
    `vllm_sampling_mask.training`, and the same objects as in the modules."""
    from vllm_sampling_mask.training import coverage, hidden, inputs, logits, ratio
    assert sorted(training.__all__) == [
        "Coverage", "full_logprobs", "importance_ratio", "mask_to_tensors",
        "nucleus_logprobs", "nucleus_logprobs_from_hidden", "pack_masks",
        "ratio_statistics", "support_coverage"]
    assert all(callable(getattr(training, name)) for name in training.__all__)
    assert training.nucleus_logprobs is logits.nucleus_logprobs
    assert training.nucleus_logprobs_from_hidden is hidden.nucleus_logprobs_from_hidden
    assert training.pack_masks is inputs.pack_masks
    assert training.ratio_statistics is ratio.ratio_statistics
    assert training.support_coverage is coverage.support_coverage


@pytest.mark.parametrize("chunk", [1000, 7])
def test_pair_layout_is_consistent(chunk):
    """The hidden op's index layout: id-major order sorted by id with CSR row
    pointers, every pair present once, the sampled pairs flagged, and the
    token-major order a permutation of the same pairs grouped by (block, token)."""
    from vllm_sampling_mask.training.hidden import PairLayout, build_layout
    from vllm_sampling_mask.training.segments import segment_ids
    _, tok, rows = random_case(T=9, V=31, max_size=5, seed=3)
    ids, offsets = mask_to_tensors(SamplingMask.from_lists(rows))
    T, V, N = 9, 31, ids.numel()
    L = build_layout(ids, offsets, segment_ids(offsets, T, N), tok, T, V, chunk)
    assert isinstance(L, PairLayout)
    im, tm, blocks = L.id_major, L.token_major, L.blocks
    n = N + T
    assert blocks.count == -(-V // chunk) and blocks.pair_bounds[-1] == n
    pairs = sorted([(t, v) for t, r in enumerate(rows) for v in r]
                   + [(t, int(tok[t])) for t in range(T)])
    got = sorted(zip(im.tokens.tolist(), im.vocab_ids.tolist()))
    assert got == pairs
    assert im.vocab_ids.tolist() == sorted(im.vocab_ids.tolist())
    for v in range(V):
        lo, hi = im.row_ptr[v].item(), im.row_ptr[v + 1].item()
        assert set(im.vocab_ids[lo:hi].tolist()) <= {v}
    assert im.is_target.sum().item() == T
    assert im.tokens[im.target_pos].tolist() == list(range(T))
    assert im.vocab_ids[im.target_pos].tolist() == tok.tolist()
    # token-major: the same pairs, found through id_major_pos
    assert sorted(tm.id_major_pos.tolist()) == list(range(n))
    assert tm.vocab_ids.tolist() == im.vocab_ids[tm.id_major_pos].tolist()
    for blk in blocks.each():
        p0, p1 = blk.pair_start, blk.pair_end
        seg_vocab = im.vocab_ids[p0:p1]
        assert ((seg_vocab >= blk.vocab_start)
                & (seg_vocab < blk.vocab_start + blk.vocab_rows)).all()
        ptr = tm.row_ptr[blk.index]
        assert ptr[0].item() == 0 and ptr[-1].item() == p1 - p0
        toks = im.tokens[tm.id_major_pos[p0:p1]]
        for t in range(T):
            assert (toks[ptr[t]:ptr[t + 1]] == t).all()
