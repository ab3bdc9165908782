"""The Triton extraction kernel, run by Triton's interpreter, equals the torch path.

On a CPU host `tests/conftest.py` sets TRITON_INTERPRET=1, so the "triton"
implementation runs the extraction kernel (`_chunk_pass`, `_place_pass`) in Triton's interpreter on CPU tensors: the
same kernel source CUDA hosts compile. (On a CUDA host these run compiled; the
`gpu` tests in test_gpu.py add the CUDA-only checks.) Both paths are compared
through what the host decodes, since slot numbers may differ between them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_sampling_mask.worker.extraction import (NO_SLOT, ExtractionSettings, MaskLayout,
                                           extract_selected, extract_support, plan_layout)
from vllm_sampling_mask.worker.transport import decode

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Small kernel chunks: a row of a few thousand logits spans many programs, so
# the cross-chunk scan, the crossing chunk and the wide-row copy all run.
SMALL = ExtractionSettings(kernel_chunk=128)


def decoded(logits, layout, implementation, settings=SMALL, padded=False):
    mask = extract_support(logits, layout, implementation=implementation, settings=settings)
    block = mask.block.cpu().numpy()
    host = decode(block, layout, mask.row_of(), np.ones(layout.rows))
    return (host, layout.views(block)[1].copy()) if padded else host


def expected_rows(logits):
    finite = torch.isfinite(logits.float()).cpu()
    return [torch.nonzero(row).view(-1).numpy().astype(np.int32) for row in finite]


def hostile_logits(rows, vocab, top_k, seed):
    """Processed-logit-like rows: top-k cuts with coarse ties, NaN, +/-inf,
    all-excluded rows and rows much wider than their top-k."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g).mul(4).round().div(4)   # many ties
    kth = x.topk(top_k, dim=-1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    kinds = torch.randint(0, 6, (rows,), generator=g).tolist()
    for r, kind in enumerate(kinds):
        if kind == 1:
            x[r] = float("-inf")                                  # nothing kept
        elif kind == 2:
            x[r, torch.randint(0, vocab, (vocab // 7,), generator=g)] = float("nan")
        elif kind == 3:
            x[r, torch.randint(0, vocab, (5,), generator=g)] = float("inf")
        elif kind == 4:
            x[r, :: 3] = 0.5                                      # far wider than W
    return x


@pytest.mark.parametrize("seed,chunk", [(0, 128), (1, 512), (2, 1024), (3, 4096)])
def test_kernel_equals_torch_and_isfinite_on_hostile_rows(seed, chunk):
    rows, vocab, top_k = 24, 3001, 20
    logits = hostile_logits(rows, vocab, top_k, seed).to(DEVICE)
    layout = plan_layout([top_k] * rows, vocab)
    layout = MaskLayout(rows, layout.width, rows, vocab)    # a slot for every wide row
    want = expected_rows(logits)
    settings = ExtractionSettings(kernel_chunk=chunk)
    kernel, kernel_ids = decoded(logits, layout, "triton", settings, padded=True)
    assert kernel.counts.tolist() == [len(w) for w in want]
    assert kernel.wide, "no wide row tested"
    others = ["torch"] + (["host"] if DEVICE == "cpu" else [])
    for implementation in others:
        other, other_ids = decoded(logits, layout, implementation, settings, padded=True)
        assert np.array_equal(kernel.counts, other.counts), implementation
        assert set(kernel.wide) == set(other.wide), implementation
        for r in range(rows):
            assert np.array_equal(kernel.row(r), want[r]), r
            assert np.array_equal(other.row(r), want[r]), (implementation, r)
            assert np.array_equal(kernel_ids[r], other_ids[r]), (implementation, r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_reads_half_precision_and_strided_rows(dtype):
    logits = hostile_logits(9, 700, 8, seed=7).to(dtype)
    wide = torch.full((9, 900), float("-inf"), dtype=dtype)
    wide[:, :700] = logits
    view = wide[:, :700]                                     # row stride 900
    layout = plan_layout([8] * 9, 700)
    layout = MaskLayout(9, layout.width, 9, 700)
    got = decoded(view.to(DEVICE), layout, implementation="triton")
    for r, want in enumerate(expected_rows(logits)):
        assert np.array_equal(got.row(r), want)


def test_kernel_width_at_vocab_and_vocab_not_multiple_of_32():
    vocab = 1000 + 13
    logits = torch.randn(8, vocab)
    logits[3, 500:] = float("-inf")
    layout = plan_layout([vocab] * 8, vocab)          # top_k >= V: no top-k
    assert layout.width == vocab                        # the size limit exceeds V
    got = decoded(logits.to(DEVICE), layout, implementation="triton")
    for r, want in enumerate(expected_rows(logits)):
        assert np.array_equal(got.row(r), want)


def test_kernel_marks_wide_rows_beyond_the_slots_lost():
    vocab = 2048
    logits = torch.zeros(6, vocab)
    logits[:, ::2] = float("-inf")                    # 1024 kept per row, top-k 4
    layout = MaskLayout(6, 4 + 16, 2, vocab)
    mask = extract_support(logits.to(DEVICE), layout, implementation="triton", settings=SMALL)
    meta = mask.block[: 6 * 3].view(6, 3).cpu()
    assert (meta[:, 1] == NO_SLOT).sum() == 4
    got = decode(mask.block.cpu().numpy(), layout, np.arange(6), np.ones(6))
    assert len(got.lost) == 4 and len(got.wide) == 2
    for r in got.wide:
        assert got.row(r).tolist() == list(range(1, vocab, 2))
    for r in got.lost:
        assert got.problem(r, 1) is not None


def test_kernel_extracts_only_the_selected_rows():
    logits = hostile_logits(10, 999, 12, seed=3).to(DEVICE)
    wanted = np.array([i % 3 == 1 for i in range(10)])
    kernel = extract_selected(logits, np.full(10, 12), wanted, max_size=4096, settings=SMALL)
    assert kernel.layout.rows == int(wanted.sum())
    got = decode(kernel.block.cpu().numpy(), kernel.layout, kernel.row_of(), np.ones(10))
    want = expected_rows(logits)
    for r in np.flatnonzero(wanted):
        if r not in got.lost:
            assert np.array_equal(got.row(r), want[r])
    assert not any(got.wants(r) for r in np.flatnonzero(~wanted))


def test_empty_batch():
    layout = plan_layout([], 100)
    mask = extract_support(torch.zeros(0, 100, device=DEVICE), layout, implementation="triton")
    assert mask.block.numel() == layout.numel


def _launch_keys(logits, top_k, wanted, settings=ExtractionSettings()):
    """The specialisation keys of the launches `extract_selected` would make."""
    from vllm_sampling_mask.worker.extraction import HEADER
    from vllm_sampling_mask.worker.extraction.kernels import _launches, specialisation
    rows = None if wanted.all() else np.flatnonzero(wanted)
    layout = plan_layout(top_k if rows is None else top_k[rows], logits.shape[1])
    block = torch.empty(HEADER + layout.numel, dtype=torch.int32, device=logits.device)
    source = None if rows is None else torch.from_numpy(rows.astype(np.int32)).to(DEVICE)
    return {specialisation(kernel, args, constexprs)
            for kernel, _, args, constexprs in _launches(logits[: len(wanted)], source,
                                                         block, layout,
                                                         settings.kernel_chunk)}


def test_kernel_variants_are_few_and_fixed_across_batch_shapes():
    """Triton compiles one variant per specialisation key: the key of every
    launch over R = 1..1024, several top-k (hence widths and slots) and row
    subsets is one of the few keys `warm_up` compiles at start-up."""
    from vllm_sampling_mask.worker.extraction import warm_up
    vocab = 4099                                  # odd: V / 8 is not 16-aligned
    logits = torch.zeros(1024, vocab, device=DEVICE)
    warm = warm_up(DEVICE, vocab, (torch.float32,))
    assert len(warm) == 3       # the first pass with and without a row subset, the second
    seen = set()
    g = np.random.default_rng(0)
    for rows in range(1, 1025):
        top_k = np.full(rows, (1, 5, 20, 50, 1000, vocab)[rows % 6])
        wanted = np.ones(rows, bool) if rows % 2 else g.random(rows) < 0.7
        wanted[0] = True
        seen |= _launch_keys(logits, top_k, wanted)
    assert seen <= warm, seen - warm
    assert len(seen) == 3


def test_warm_up_runs_every_variant_and_the_kernel_stays_exact_after():
    from vllm_sampling_mask.worker.extraction import warm_up
    vocab = 700
    keys = warm_up(DEVICE, vocab, (torch.float32, torch.bfloat16), settings=SMALL)
    assert len(keys) == 5       # per dtype two first-pass variants; one second pass
    logits = hostile_logits(5, vocab, 8, seed=11).to(DEVICE)
    layout = MaskLayout(5, 24, 5, vocab)
    got = decoded(logits, layout, implementation="triton")
    for r, want in enumerate(expected_rows(logits)):
        assert np.array_equal(got.row(r), want), r


def test_kernel_at_real_vocabulary_and_default_chunk():
    """V = 151,936 with the chunk the GPU runs (38 chunks of 16 word groups):
    a top-k row, a row of ties crossing W mid-vocabulary (a wide row), a row
    with NaN and +inf, and a row of one id in the last chunk."""
    vocab, top_k = 151936, 50
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, vocab, generator=g)
    kth = x.topk(top_k, dim=-1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    x[1, 7::50] = 0.5                                   # ~3000 ids: wide, within N
    x[2, torch.randint(0, vocab, (40,), generator=g)] = float("nan")
    x[2, torch.randint(0, vocab, (3,), generator=g)] = float("inf")
    x[3] = float("-inf")
    x[3, vocab - 1] = 0.0
    layout = plan_layout([top_k] * 4, vocab)
    got = decoded(x.to(DEVICE), layout, implementation="triton", settings=ExtractionSettings())
    assert got.wide == {1}
    for r, want in enumerate(expected_rows(x)):
        assert got.counts[r] == len(want), r
        assert np.array_equal(got.row(r), want), r
        assert got.problem(r, int(want[0])) is None, r


@pytest.mark.parametrize("implementation", ["triton", "torch"]
                         + (["host"] if DEVICE == "cpu" else []))
def test_rows_over_the_size_limit_take_no_wide_row_slot(implementation):
    """A row wider than --max-sampling-mask-size is an error whatever happens:
    it must not take the only slot from a row that ties past W within the limit."""
    vocab = 2000
    logits = torch.full((2, vocab), float("-inf"))
    logits[0, :1500] = 0.0                    # over the limit of 1000
    logits[1, 100:700] = 0.0                  # 600 ties: wide, within the limit
    layout = MaskLayout(2, 20, 1, vocab, max_size=1000)
    got = decoded(logits.to(DEVICE), layout, implementation)
    assert got.wide == {1} and not got.lost
    assert got.row(1).tolist() == list(range(100, 700)) and got.problem(1, 100) is None
    assert "--max-sampling-mask-size 1000" in got.problem(0, 0)
    assert got.row(0).tolist() == list(range(20))          # its first W ids


_COMPILE_FOR_SM90 = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from vllm_sampling_mask.worker.extraction import DEFAULT_SETTINGS
from vllm_sampling_mask.worker.extraction import kernels as e
V, CHUNK = 151936, DEFAULT_SETTINGS.kernel_chunk
n_chunks, wpc = triton.cdiv(V, CHUNK), CHUNK // 32
target = GPUTarget("cuda", 90, 32)
for dt in ("bf16", "fp16", "fp32"):
    for has_rows in (False, True):
        sig = dict(logits_ptr="*" + dt, logits_stride="i32", rows_ptr="*i32",
                   bitmap_ptr="*i32", counts_ptr="*i32", counter_ptr="*i32",
                   vocab_size="i32", HAS_ROWS="constexpr", CHUNK="constexpr",
                   N_CHUNKS="constexpr")
        triton.compile(ASTSource(e._chunk_pass, sig, constexprs=dict(
            HAS_ROWS=has_rows, CHUNK=CHUNK, N_CHUNKS=n_chunks)), target=target,
            options=dict(num_warps=4))
consts = dict(CHUNK=CHUNK, N_CHUNKS=n_chunks, CHUNKS_P2=triton.next_power_of_2(n_chunks),
              WPC=wpc, GROUP=8, N_GROUPS=wpc // 8, PAD_BLOCK=256, COPY_BLOCK=1024)
sig = {n: "*i32" for n in ("bitmap_ptr", "counts_ptr", "out_ptr", "counter_ptr")}
sig.update({n: "i32" for n in ("width", "n_slots", "words", "ids_offset", "bits_offset",
                               "max_size")})
sig.update({k: "constexpr" for k in consts})
compiled = triton.compile(ASTSource(e._place_pass, sig, constexprs=consts), target=target,
                          options=dict(num_warps=4))
assert "cubin" in compiled.asm
print("compiled")
"""


def test_kernels_compile_for_an_sm90_gpu_without_one():
    """The interpreter does not type-check like the compiler: compile both passes
    for sm_90 (Triton's CUDA backend and its bundled ptxas; no GPU needed)."""
    import os
    import subprocess
    import sys
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Triton's CUDA backend is not installed: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
