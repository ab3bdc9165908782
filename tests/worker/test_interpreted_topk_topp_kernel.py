"""vLLM's Triton top-k/top-p kernel, run by Triton's interpreter on CPU tensors.

`reference_triton_top_k_top_p_mask` is an independent model of which logits
`_topk_topp_kernel` (vllm.v1.sample.ops.topk_topp_triton) keeps, as launched
for CPU tensors (tiles of 256, pivot-search tiles of 128) and run by the
interpreter. Other tests may import it.

What the kernel keeps, per row (V = vocab size):

* top-k, when k < V and more than k logits are > -inf: a ternary search for a
  logit pivot with exactly k logits at or above the k-th largest. It keeps the
  k largest; on a tie at the k-th value it keeps the lowest indices, so
  exactly k survive ("tie" means within 1e-9, which in float32 is equality
  for |logit| > ~0.01). If k >= V, or at most k logits are finite, top-k does
  nothing. If all finite logits are equal, nothing is masked at all.
* top-p, when p < 1: a bisection (at most 18 rounds) for a probability pivot,
  with float32 softmax probabilities. It keeps the fewest most likely tokens
  whose mass reaches p. On a tie at the boundary it keeps the lowest indices
  only if the tied logit comes back exactly from log(prob * sum) + shift in
  float32; if not, it keeps the whole tied group. When 18 rounds don't
  separate the two probabilities at the cut (they differ by less than about
  2**-18 of the largest probability), it stops at the midpoint of its last
  bracket. It then keeps everything above that midpoint, which may be a few
  tokens short of p. Alone, top-p uses a softmax shifted by mean + 10 std of
  the first 256 logits, not by the maximum.
* top-k then top-p: top-p runs on the top-k survivors' probabilities. When
  top-k gathered its candidates as outliers, the probabilities of ties that
  top-k cut still count in top-p's search. The final pass masks by the top-p
  pivot alone, so those ties can come back: more than k tokens can survive.

These are properties of the algorithm, not of the interpreter. Which
near-boundary cases fall which way depends on float32 rounding, so the model
repeats the kernel's arithmetic (the pivot searches, tile by tile, in numpy
float32 as the interpreter computes). It never calls the kernel or Triton.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.worker.interpreter import triton_interpreter_on

# ---------------------------------------------------------------- reference

_F = np.float32
_INF = _F(np.inf)
_EPS = _F(1e-9)              # the kernel's tie tolerance (a float32 constant)
_ROUNDS = 18                 # pivot-search rounds before it settles on a midpoint
_TILE, _TRUNC_TILE = 256, 128  # the launcher's tile sizes for CPU tensors
_U32 = 0xFFFFFFFF


def _to_u32(v) -> int:
    """float32 -> uint32 as the interpreter casts it (numpy astype)."""
    with np.errstate(invalid="ignore"):
        return int(np.array([v], dtype=np.float32).astype(np.uint32)[0])


def _tiles(values, size, fill):
    rows = max(1, -(-len(values) // size))
    out = np.full(rows * size, fill, dtype=np.float32)
    out[:len(values)] = values
    return out.reshape(rows, size)


def _sum(values, size):
    """A float32 sum as the kernel takes it: per tile, then tile by tile."""
    total = _F(0.0)
    for s in np.sum(_tiles(values, size, 0.0), axis=1):
        total = _F(total + s)
    return total


def _smallest_above(tiles, above, sentinel):
    """(smallest value above the pivot, how many are within _EPS of it), merged tile by tile."""
    with np.errstate(invalid="ignore"):
        tile_min = np.where(above, tiles, _F(sentinel)).min(axis=1)
        counts = (above & (np.abs(tiles - tile_min[:, None]) < _EPS)).sum(axis=1)
        best, count = _F(sentinel), 0
        for m, c in zip(tile_min, counts):
            if m < best:
                count = int(c)
            elif abs(m - best) < _EPS:
                count += int(c)
            best = min(best, m)
    return best, count


def _search_k(tiles, lo, hi, k):
    """Ternary search for a pivot with k logits above it counting the k-th's ties.

    Returns (pivot, count above it, smallest logit above it, its multiplicity).
    """
    pivot, above_count, smallest, ties = _INF, 0, _INF, 0
    for rnd in range(1, _ROUNDS + 1):
        span = _F(hi - lo)
        pivots = (_F(_F(span / _F(3.0)) + lo), _F(_F(_F(span * _F(2.0)) / _F(3.0)) + lo))
        stats = []
        for pv in pivots:
            above = tiles > pv
            stats.append((int(above.sum()), *_smallest_above(tiles, above, np.inf)))
        done = False
        for pv, (n, m, c) in zip(pivots, stats):
            if n >= k and n - c < k:
                pivot, above_count, smallest, ties, done = pv, n, m, c, True
        (n0, m0, c0), (n1, _, _) = stats
        if n1 > k:
            lo = pivots[1]
        elif n0 > k:
            lo = pivots[0]
        if n0 < k:
            hi = pivots[0]
        elif n1 < k:
            hi = pivots[1]
        if rnd >= _ROUNDS or abs(_F(lo - hi)) < _EPS:  # settle: midpoint, first pivot's stats
            pivot, smallest, ties, done = _F(_F(hi + lo) / _F(2.0)), m0, c0, True
        if done:
            return pivot, above_count, smallest, ties


def _search_p(tiles, lo, hi, p):
    """Bisection for a probability pivot whose mass above first reaches p.

    Returns (pivot, smallest probability above it, its multiplicity, mass above).
    """
    for rnd in range(1, _ROUNDS + 1):
        pv = _F(_F(_F(hi - lo) * _F(0.5)) + lo)
        above = tiles > pv
        mass = _F(0.0)
        for s in np.sum(tiles * above, axis=1):
            mass = _F(mass + s)
        smallest, ties = _smallest_above(tiles, above, 1.0)
        found = None
        if mass >= p and _F(mass - _F(smallest * _F(ties))) < p:
            found = (pv, smallest, ties, mass)
        if mass > p:
            lo = pv
        elif mass < p:
            hi = pv
        if _F(hi - lo) < _EPS or rnd >= _ROUNDS:
            found = (_F(_F(hi + lo) / _F(2.0)), smallest, ties, mass)
        if found is not None:
            return found


def _head_stats(x):
    """Mean and std of the finite logits among the first tile."""
    head = x[:_TILE]
    finite = head[head > -_INF]
    if len(finite) == 0:
        return _F(0.0), _F(0.0)
    vals = _tiles(np.where(head > -_INF, head, _F(0.0)), _TILE, 0.0)[0]
    n = _F(len(finite))
    mean = _F(np.sum(vals) / n)
    mean_sq = _F(np.sum(vals * vals) / n)
    return mean, _F(np.sqrt(max(_F(mean_sq - _F(mean * mean)), _F(0.0))))


def _beyond_first(values, tie_value, n_keep):
    """Values tied (within _EPS) with tie_value after the first n_keep of them."""
    with np.errstate(invalid="ignore"):
        tie = np.abs(values - tie_value) < _EPS
    return tie & (np.cumsum(tie) > n_keep)


def _row_mask(x, k, p, std_table, sigma_table):
    V = len(x)
    max_logit = _F(np.max(x))
    finite = x[x > -_INF]
    min_logit = min(_F(finite.min()) if len(finite) else _INF, max_logit)
    pivot, tie_value, n_ties, n_keep = -_INF, _INF, 0, 0

    if k is not None and k < V:
        mean, std = _head_stats(x)
        sigma = _F(std_table[min(_to_u32(_F(_F(_F(k) / _F(V)) * _F(200))), 199)])
        cut = _F(mean + _F(std * _F(sigma + _F(abs(sigma) * _F(-0.15)))))
        outliers = x[x > cut]                  # the search runs on these when enough
        gathered = len(outliers) > k
        if gathered:
            k_pivot, n_above, tie_value, n_ties = _search_k(
                _tiles(outliers, _TRUNC_TILE, -np.inf), cut, max_logit, k)
        else:
            k_pivot, n_above, tie_value, n_ties = _search_k(
                _tiles(x, _TILE, -np.inf), min_logit, max_logit, k)
        n_keep = (n_ties - ((n_above - k) & _U32)) & _U32
        pivot = k_pivot if len(finite) > k else -_INF
        if p is not None and len(finite) > k and p < 1.0:
            src = outliers if gathered else x
            inside = src > k_pivot
            if n_keep < n_ties or not gathered:
                inside &= ~_beyond_first(src, tie_value, n_keep)
            e = np.exp(np.where(inside, src, -_INF) - max_logit)
            total = _sum(e, _TRUNC_TILE if gathered else _TILE)
            # gathered: every outlier's probability, the cut ties included
            probs = np.exp(outliers - max_logit) / total if gathered else e[inside] / total
            p_pivot, smallest, n_ties, mass = _search_p(
                _tiles(probs, _TRUNC_TILE, 0.0),
                _F(np.exp(_F(k_pivot - max_logit)) / total), _F(_F(1.0) / total), p)
            tie_value = _F(np.log(_F(smallest * total)) + max_logit)
            n_keep = (n_ties - _to_u32(_F(_F(mass - p) / smallest))) & _U32
            pivot = _F(np.log(_F(p_pivot * total)) + max_logit)

    if p is not None and pivot == -_INF and p < 1.0:
        mean, std = _head_stats(x)
        shift = _F(mean + _F(std * _F(10.0)))
        total = _sum(np.exp(x - shift), _TILE)
        probs = np.exp(x - shift) / total
        idx = int(np.array([_F(p * _F(200))], dtype=np.float32).astype(np.int32)[0])
        sigma = _F(sigma_table[max(0, min(idx, 199))])
        cut = _F(mean + _F(std * _F(sigma + _F(abs(sigma) * _F(-0.25)))))
        cut_prob = _F(np.exp(_F(cut - shift)) / total)
        is_out = probs > cut_prob
        lo = _F(np.exp(_F(min_logit - shift)) / total)
        hi = _F(np.exp(_F(max_logit - shift)) / total)
        if _sum(probs * is_out, _TILE) > p:
            tiles, lo = _tiles(probs[is_out], _TRUNC_TILE, 0.0), cut_prob
        else:
            tiles = _tiles(probs, _TILE, 0.0)
        p_pivot, smallest, n_ties, mass = _search_p(tiles, lo, hi, p)
        tie_value = _F(np.log(_F(smallest * total)) + shift)
        n_keep = (n_ties - _to_u32(_F(_F(mass - p) / smallest))) & _U32
        pivot = _F(np.log(_F(p_pivot * total)) + shift)

    if not (pivot < max_logit) or pivot == -_INF:   # nothing would survive: mask nothing
        return np.isfinite(x)
    keep = x > pivot
    if n_keep < n_ties:
        keep &= ~_beyond_first(x, tie_value, n_keep)
    return keep & np.isfinite(x)


def reference_triton_top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor | None,
                                      p: torch.Tensor | None) -> torch.Tensor:
    """The [B, V] bool mask of the logits vLLM's Triton top-k/top-p kernel keeps.

    `logits` float [B, V]; `k` int [B] (k >= 1; k >= V means no top-k) or
    None; `p` float [B] (0 < p <= 1) or None. Models the kernel as launched
    for CPU tensors and interpreted (see the module docstring). NaN logits
    are not modelled. `logits` is not modified.
    """
    from vllm.v1.sample.ops import topk_topp_triton as kernel_module  # its lookup tables

    std_table = np.asarray(kernel_module._PERCENTILE_TO_STD_TABLE, dtype=np.float32)
    sigma_table = np.asarray(kernel_module._NORMAL_CDF_TO_SIGMA_TABLE, dtype=np.float32)
    x = logits.detach().to("cpu", torch.float32).numpy()
    ks = None if k is None else k.to(torch.int32).cpu().tolist()
    ps = None if p is None else p.to(torch.float32).cpu().numpy()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        rows = [_row_mask(x[r], None if ks is None else ks[r],
                          None if ps is None else _F(ps[r]), std_table, sigma_table)
                for r in range(x.shape[0])]
    return torch.from_numpy(np.stack(rows)) if rows else torch.zeros(x.shape, dtype=torch.bool)


# -------------------------------------------------------------------- tests

pytestmark = [
    pytest.mark.skipif(not triton_interpreter_on(),
                       reason="runs vLLM's Triton kernel through TRITON_INTERPRET=1"),
    # the kernel's own inf - inf and 0 / 0 on masked lanes, as numpy reports them
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


@pytest.fixture(scope="module")
def sampler():
    """vLLM's top-k/top-p module; importing it applies the interpreter shim."""
    import vllm.v1.sample.ops.topk_topp_sampler as module
    return module


def _kernel_mask(logits, k, p):
    from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton
    return torch.isfinite(apply_top_k_top_p_triton(logits.clone(), k, p))


def _inputs(seed, batch, vocab, ties):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g) * (4.0 if ties else 2.0)
    if ties:
        logits = logits.round() / 4            # a coarse grid: many ties at every cut
    k = torch.randint(1, 300, (batch,), generator=g, dtype=torch.int32)
    p = torch.rand(batch, generator=g) * 0.98 + 0.01
    k[1], k[2] = vocab, vocab + 7              # top-k off
    p[3], p[2] = 1.0, 1.0                      # top-p off (row 2: nothing to do)
    p[4] = 0.99999                             # top-p keeps (nearly) all top-k
    return logits, k, p


def _assert_same(got, want):
    bad = (got != want).any(1).nonzero().view(-1).tolist()
    assert not bad, f"rows {bad}: kernel keeps {got[bad].sum(1).tolist()}, " \
                    f"reference {want[bad].sum(1).tolist()}"


@triton.jit
def _loop_variable_probe(out_ptr, n, wide_n):
    pid = tl.program_id(0)
    for i in tl.range(pid, n, tl.num_programs(0)):
        tl.static_assert(i.dtype == tl.int32)
        tl.store(out_ptr + i.to(tl.int64), i * 10)
    for j in tl.range(0, wide_n.to(tl.int64)):
        tl.static_assert(j.dtype == tl.int64)
    for s in tl.static_range(2):
        tl.store(out_ptr + n + s, s + 100)


def test_tl_range_yields_typed_tensors(sampler):
    out = torch.zeros(7, dtype=torch.int32)
    _loop_variable_probe[(2,)](out, 5, 3)
    assert out.tolist() == [0, 10, 20, 30, 40, 100, 101]


@pytest.mark.parametrize("case", ["top_k", "top_p", "both"])
def test_kernel_equals_reference_with_ties(sampler, case):
    logits, k, p = _inputs(seed=15, batch=10, vocab=4096, ties=True)
    k, p = (k, None) if case == "top_k" else (None, p) if case == "top_p" else (k, p)
    got = _kernel_mask(logits, k, p)
    _assert_same(got, reference_triton_top_k_top_p_mask(logits, k, p))
    if case == "both":   # top-p's final cut brings back ties that top-k cut (rows 4, 7)
        assert (got.sum(1) > k).any()


def test_kernel_equals_reference_continuous(sampler):
    logits, k, p = _inputs(seed=12, batch=10, vocab=4096, ties=False)
    _assert_same(_kernel_mask(logits, k, p), reference_triton_top_k_top_p_mask(logits, k, p))
    logits, p = logits[:8], p[:8]
    _assert_same(_kernel_mask(logits, None, p), reference_triton_top_k_top_p_mask(logits, None, p))


def test_kernel_equals_reference_odd_rows(sampler):
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(8, 999, generator=g) * 3       # vocab not a tile multiple
    logits[torch.rand(8, 999, generator=g) < 0.4] = float("-inf")  # grammar-masked ids
    logits[0] = 0.5                                      # all equal: nothing is masked
    logits[1, 5:] = float("-inf")                        # fewer finite logits than k
    logits[2] = float("-inf")
    k = torch.tensor([3, 20, 4, 1, 998, 999, 500, 60], dtype=torch.int32)
    p = torch.tensor([0.5, 0.9, 0.3, 0.2, 0.95, 0.6, 1.0, 0.75])
    for kk, pp in ((k, None), (None, p), (k, p)):
        want = reference_triton_top_k_top_p_mask(logits, kk, pp)
        _assert_same(_kernel_mask(logits, kk, pp), want)


def test_top_k_alone_keeps_exactly_k_lowest_index_first(sampler):
    """The plain statement of top-k, checked without the pivot-search model."""
    logits, k, _ = _inputs(seed=14, batch=8, vocab=4096, ties=True)
    got = _kernel_mask(logits, k, None)
    for r in range(8):
        kk = min(int(k[r]), 4096)
        # stable sort on -logit: equal logits stay in index order
        order = torch.sort(-logits[r], stable=True).indices[:kk]
        want = torch.zeros(4096, dtype=torch.bool)
        want[order] = True
        assert torch.equal(got[r], want), r
    assert (got.sum(1) == k.clamp(max=4096)).all()


def test_cpu_dispatch_runs_the_triton_kernel_and_the_shim_picks_the_cpu_path(sampler,
                                                                              monkeypatch):
    """Upstream's dispatch, on CPU with HAS_TRITON, takes the Triton kernel at any
    batch size; the shim's default (no VLLM_SAMPLING_MASK_TRITON_TOPK) takes the
    PyTorch path a CPU host without Triton takes, which keeps every tie."""
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and sampler.HAS_TRITON
    calls = []
    triton_path, torch_path = sampler.apply_top_k_top_p_triton, sampler.apply_top_k_top_p_pytorch

    def spy(logits, k, p, *args, **kwargs):
        calls.append(logits.shape[0])
        return triton_path(logits, k, p, *args, **kwargs)

    upstream = sampler.apply_top_k_top_p.__wrapped__
    monkeypatch.setattr(sampler, "apply_top_k_top_p_triton", spy)
    g = torch.Generator().manual_seed(15)
    for batch in (8, 3):
        logits = (torch.randn(batch, 512, generator=g) * 4).round() / 4
        k = torch.full((batch,), 40, dtype=torch.int32)
        p = torch.full((batch,), 0.9)
        for kk, pp in ((k, None), (k, p)):
            want = reference_triton_top_k_top_p_mask(logits, kk, pp)
            got = torch.isfinite(upstream(logits.clone(), kk, pp))
            _assert_same(got, want)
        # the kernel keeps exactly 40; the CPU path keeps every tie with the 40th logit
        assert (torch.isfinite(upstream(logits.clone(), k, None)).sum(1) == 40).all()
        cpu = torch.isfinite(sampler.apply_top_k_top_p(logits.clone(), k, None))
        assert torch.equal(cpu, torch.isfinite(torch_path(logits.clone(), k, None)))
        assert (cpu.sum(1) > 40).any()
    assert calls == [8, 8, 8, 3, 3, 3]


def test_shim_changes_nothing_without_interpreter(monkeypatch):
    import wrapt

    from vllm_sampling_mask.patches.worker.enablers import interpreter_top_k_top_p as shim

    wrapped = []
    monkeypatch.setattr(wrapt, "wrap_function_wrapper", lambda *a, **kw: wrapped.append(a))
    monkeypatch.setattr(shim, "_applied", False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    shim.apply(None, patching.upstream_release())
    assert wrapped == []
