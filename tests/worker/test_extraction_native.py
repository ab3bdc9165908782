"""A CPU host's supports in C (`_supports_native`, used by
`extraction.extract_on_host` where the install built it) against numpy's
(`extraction._numpy_supports`, the path without it): the same counts, ids,
offsets and logits for every float width, hostile values (NaN, both
infinities, subnormals, -0.0, the largest finite logit), rows chosen and
repeated, rows at and past the size limit; arguments it does not take fall
back to numpy; and `extract_on_host` gives the same host form either way."""

from __future__ import annotations

import shutil
import sysconfig

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sampling_mask.worker.extraction import host as extraction

native = extraction._supports_native
needs_native = pytest.mark.skipif(
    native is None, reason="the compiled extraction (_supports_native) is not built here: "
    "no C compiler at install; extract_on_host's numpy path serves")


def test_the_install_built_the_compiled_extraction():
    """Where a C compiler is there, the README's install builds `_supports_native`
    (setup.py's optional extension): the CPU step-cost figures assume it."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine: the install leaves the "
                    "compiled extraction out, and numpy's serves")
    assert native is not None, "a C compiler is here, but _supports_native was not built"


def special(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    return np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, info.max, info.min,
                     info.tiny, info.tiny / 4, -info.smallest_subnormal, 1.5], dtype=dtype)


@st.composite
def steps(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    batch = draw(st.integers(1, 6))
    vocab = draw(st.integers(1, 70))          # blocks of 16 and a tail
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    x = np.full((batch, vocab), -np.inf, dtype=dtype)
    keep = rng.random((batch, vocab)) < draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    x[keep] = rng.standard_normal(keep.sum()).astype(dtype)
    odd = rng.random((batch, vocab)) < 0.1
    x[odd] = rng.choice(special(dtype), odd.sum())
    rows = draw(st.none() | st.lists(st.integers(0, batch - 1), max_size=8).map(
        lambda r: np.array(r, dtype=np.int64)))
    max_size = draw(st.integers(0, vocab + 2))
    tokens = rng.integers(0, vocab, batch)          # one drawn token per batch row
    return x, rows, max_size, draw(st.booleans()), tokens


def same(got, want) -> None:
    (counts, ids, offsets, values), (w_counts, w_ids, w_offsets, w_values) = got, want
    assert counts.dtype == np.int32 and ids.dtype == np.int32 and offsets.dtype == np.int64
    np.testing.assert_array_equal(counts, w_counts)
    np.testing.assert_array_equal(ids, w_ids)
    np.testing.assert_array_equal(offsets, w_offsets)
    if w_values is None:
        assert values is None
    else:   # the logits' own bits, NaN never among them
        assert values.dtype == w_values.dtype
        np.testing.assert_array_equal(values.view(f"u{values.itemsize}"),
                                      w_values.view(f"u{w_values.itemsize}"))


@needs_native
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(steps())
def test_the_compiled_supports_are_numpys(step):
    """The same supports, and (given the drawn tokens) the same `drawn`: each row's
    token where its logit is finite and the row within the limit, else -1."""
    x, rows, max_size, values, tokens = step
    got = extraction._native_supports(x, rows, max_size, values, tokens)
    assert got is not None
    want = extraction._numpy_supports(x if rows is None else x[rows], max_size, values)
    same(got[:4], want)
    assert got[4].dtype == np.int64
    np.testing.assert_array_equal(
        got[4], extraction._numpy_drawn(x, rows, tokens, want[0], max_size))
    assert extraction._native_supports(x, rows, max_size, values)[4] is None


@needs_native
def test_wide_rows_and_rows_past_the_limit():
    """A vocabulary of 151,936 with rows of every kind: all finite, none, one at
    each end, exactly the limit, one past it."""
    vocab, limit = 151_936, 4096
    x = np.full((6, vocab), -np.inf, dtype=np.float32)
    x[0] = 0.5
    x[2, [0, vocab - 1]] = 1.0
    x[3, np.arange(limit) * 37] = -2.0
    x[4, np.arange(limit + 1) * 37] = 3.0
    x[5, 7] = np.nan
    for rows in (None, np.array([4, 3, 3, 2, 0, 1, 5], dtype=np.int64)):
        got = extraction._native_supports(x, rows, limit, True)[:4]
        same(got, extraction._numpy_supports(x if rows is None else x[rows], limit, True))
    counts = extraction._native_supports(x, None, limit, False)[0]
    assert counts.tolist() == [vocab, 0, 2, limit, limit + 1, 0]


@needs_native
@pytest.mark.parametrize("case", ["strided", "bool", "int32", "1-D", "rows out of range",
                                  "rows int32", "values of another dtype"])
def test_arguments_it_does_not_take_are_left_to_numpy(case):
    x = np.full((3, 40), -np.inf, dtype=np.float32)
    x[:, 5] = 1.0
    rows, ids = None, np.empty(120, np.int32)
    values, counts, offsets = np.empty(120, np.float32), np.empty(3, np.int32), \
        np.empty(4, np.int64)
    if case == "strided":
        x = np.full((3, 80), -np.inf, dtype=np.float32)[:, ::2]
    elif case == "bool":
        x = np.ones((3, 40), dtype=bool)
    elif case == "int32":
        x = np.zeros((3, 40), dtype=np.int32)
    elif case == "1-D":
        x = x[0]
    elif case == "rows out of range":
        rows = np.array([0, 3], dtype=np.int64)
        counts, offsets = np.empty(2, np.int32), np.empty(3, np.int64)
    elif case == "rows int32":
        rows = np.array([0], dtype=np.int32)
        counts, offsets = np.empty(1, np.int32), np.empty(2, np.int64)
    else:
        values = np.empty(120, np.float64)
    assert native.finite_support(x, rows, 10, ids, values, counts, offsets) is None
    # too little room for the ids is refused too
    assert native.finite_support(np.zeros((3, 40), np.float32), None, 40,
                                 np.empty(119, np.int32), None, np.empty(3, np.int32),
                                 np.empty(4, np.int64)) is None


@needs_native
@pytest.mark.parametrize("tokens, drawn", [
    (np.zeros(2, np.int64), np.empty(3, np.int64)),     # a token short of x's rows
    (np.zeros(3, np.int32), np.empty(3, np.int64)),     # int32 tokens
    (np.zeros(3, np.int64), np.empty(2, np.int64)),     # no room for a row's token
    (np.zeros(3, np.int64), np.empty(3, np.int32))])
def test_drawn_tokens_it_does_not_take_are_refused(tokens, drawn):
    x = np.full((3, 40), -np.inf, dtype=np.float32)
    assert native.finite_support(x, None, 40, np.empty(120, np.int32), None,
                                 np.empty(3, np.int32), np.empty(4, np.int64),
                                 tokens, drawn) is None


@needs_native
def test_a_drawn_token_outside_the_vocabulary_is_not_read():
    """A token id below 0 or at V or past it (which numpy's check would refuse
    with an IndexError) gets -1, without a read outside its row."""
    x = np.zeros((4, 40), dtype=np.float32)
    drawn = np.empty(4, np.int64)
    assert native.finite_support(x, None, 40, np.empty(160, np.int32), None,
                                 np.empty(4, np.int32), np.empty(5, np.int64),
                                 np.array([-1, 40, 1 << 40, 39], np.int64), drawn) == 160
    assert drawn.tolist() == [-1, -1, -1, 39]


@needs_native
@pytest.mark.parametrize("rows", [None, [2, 0]])
def test_extract_on_host_gives_the_same_host_form_with_it_or_without(monkeypatch, rows):
    rng = np.random.default_rng(3)
    x = np.full((4, 4096), -np.inf, dtype=np.float32)
    for r, k in enumerate((50, 0, 4097 - 1, 20)):
        x[r, rng.choice(4096, k, replace=False)] = rng.standard_normal(k)
    x[3, 11] = np.inf
    logits = torch.from_numpy(x)
    sampled = torch.tensor([int(np.flatnonzero(np.isfinite(x[0]))[0]), 5, 7, 11])
    rows = None if rows is None else np.array(rows)

    def host(max_size):
        return extraction.extract_on_host(logits, rows, max_size, sampled).host

    for max_size in (64, 4096):
        with_c = host(max_size)
        monkeypatch.setattr(extraction, "_supports_native", None)
        without = host(max_size)
        monkeypatch.setattr(extraction, "_supports_native", native)
        same((with_c.counts, with_c.ids, with_c.offsets, with_c.values),
             (without.counts, without.ids, without.offsets, without.values))
        np.testing.assert_array_equal(with_c.drawn, without.drawn)


def test_a_step_it_does_not_take_is_extracted_by_numpy(monkeypatch):
    """Logits whose rows are not contiguous (a strided view): `_supports_native`
    refuses them, and `extract_on_host` gives numpy's supports for them."""
    wide = np.full((3, 80), -np.inf, dtype=np.float32)
    wide[0, [4, 10]] = 1.0
    wide[2, [0, 78]] = 2.0
    logits = torch.from_numpy(wide)[:, ::2]
    calls = []
    monkeypatch.setattr(extraction, "_numpy_supports",
                        lambda *args, _real=extraction._numpy_supports:
                        calls.append(1) or _real(*args))
    host = extraction.extract_on_host(logits, None, 64).host
    assert calls == [1]
    assert host.counts.tolist() == [2, 0, 2]
    assert host.ids.tolist() == [2, 5, 0, 39]
