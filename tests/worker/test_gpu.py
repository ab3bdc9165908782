"""CUDA-only checks of the extraction kernel and the transport (`-m gpu`).

Run where CUDA is available; they need torch and Triton, not vLLM:

    python -m pytest -m gpu tests/worker/test_gpu.py
    python scripts/gpu_check.py           # these tests + the extraction benchmark

On a CPU host they are reported as skipped (see conftest.py); the same kernel
runs there through Triton's interpreter in test_extraction_kernel.py.

Streams are held back with a device-side gate (`Gate`: a one-thread kernel
that spins until the host's main stream sets a flag), not with a sleep, so no
check depends on how long the host takes between two lines.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from vllm_sampling_mask.worker.extraction import (MaskLayout, extract_selected, extract_support,
                                           plan_layout, warm_up)
from vllm_sampling_mask.worker.transport import MaskCopy, PinnedPool, decode

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

pytestmark = pytest.mark.gpu
VOCAB = 151936
MAX_SPINS = 10_000_000      # a gate gives up after some seconds rather than hang

if triton is not None:

    @triton.jit
    def _spin_until_set(flag_ptr, max_spins):
        seen = tl.load(flag_ptr, volatile=True)
        spins = tl.zeros((), dtype=tl.int32)
        while (seen == 0) & (spins < max_spins):
            seen = tl.load(flag_ptr, volatile=True)
            spins += 1
        tl.store(flag_ptr + 1, (seen == 0).to(tl.int32))   # 1: gave up


class Gate:
    """Holds a stream until `release` runs on the main stream."""

    def __init__(self) -> None:
        self.flag = torch.zeros(2, dtype=torch.int32, device="cuda")

    def hold(self, stream: torch.cuda.Stream) -> None:
        stream.wait_stream(torch.cuda.current_stream())   # sees the zeroed flag
        with torch.cuda.stream(stream):
            _spin_until_set[(1,)](self.flag, MAX_SPINS)

    def release(self) -> None:
        self.flag[:1].fill_(1)

    def gave_up(self) -> bool:
        return bool(self.flag[1].item())


def _processed(rows, vocab, top_k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device="cuda").mul(4).round().div(4)
    kth = x.topk(top_k, dim=-1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    x[1] = float("-inf")
    x[2, ::5] = float("nan")
    x[3, ::2] = 1.0            # far wider than the size limit
    return x


@pytest.mark.parametrize("rows,top_k", [(64, 50), (256, 1024)])
def test_compiled_kernel_equals_torch_path_at_real_vocabulary(rows, top_k):
    logits = _processed(rows, VOCAB, top_k)
    base = plan_layout([top_k] * rows, VOCAB)
    layout = MaskLayout(rows, base.width, rows, VOCAB)
    kernel = extract_support(logits, layout, implementation="triton")
    reference = extract_support(logits, layout, implementation="torch")
    torch.cuda.synchronize()
    got = decode(kernel.block.cpu().numpy(), layout, np.arange(rows), np.ones(rows))
    want = decode(reference.block.cpu().numpy(), layout, np.arange(rows), np.ones(rows))
    assert np.array_equal(got.counts, want.counts) and got.wide == want.wide
    finite = torch.isfinite(logits).cpu()
    over = 0
    for r in range(rows):
        full = torch.nonzero(finite[r]).view(-1).numpy()
        assert got.counts[r] == len(full), r
        assert np.array_equal(got.row(r), want.row(r)), r
        if len(full) > layout.max_size:
            # By contract: an error for the request, and row() its first W ids.
            over += 1
            assert "--max-sampling-mask-size" in got.problem(r, int(full[0]))
            assert np.array_equal(got.row(r), full[: layout.width]), r
        else:
            assert np.array_equal(got.row(r), full), r
    assert over >= 1                            # row 3 is over the limit


def test_copy_reads_its_block_even_when_the_main_stream_reuses_memory():
    """The copy stream is held back (a gate) while the main stream frees every
    other reference to the block and allocates and overwrites memory of the same
    size: the copy must still read the block as it was written."""
    rows, top_k = 256, 50
    logits = _processed(rows, VOCAB, top_k, seed=1)
    layout = plan_layout([top_k] * rows, VOCAB)
    want = decode(extract_support(logits, layout, implementation="torch").block.cpu().numpy(),
                  layout, np.arange(rows), np.ones(rows))
    pool, copy_stream, main = PinnedPool(), torch.cuda.Stream(), torch.cuda.current_stream()
    gate = Gate()
    gate.hold(copy_stream)                    # no copy runs before gate.release()
    copies, blocks = [], []
    for _ in range(4):                        # several steps in flight
        mask = extract_support(logits, layout)
        blocks.append(weakref.ref(mask.block))
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(main)
            copy = MaskCopy(mask, pool)
            done = torch.cuda.Event()
            done.record(copy_stream)
        del mask
        gc.collect()
        for _ in range(8):                    # the main stream reuses freed blocks
            torch.full((layout.numel + 4,), 7, dtype=torch.int32, device="cuda")
        copies.append((copy, done))
    assert all(ref() is not None for ref in blocks), "a copy let its block go"
    assert not any(done.query() for _, done in copies), "a copy ran before the gate"
    gate.release()
    for copy, done in copies:
        done.synchronize()
        got = copy.result(np.ones(rows))
        assert np.array_equal(got.counts, want.counts)
        for r in range(rows):
            assert np.array_equal(got.row(r), want.row(r))
    assert not gate.gave_up()
    copies.clear()
    gc.collect()
    assert all(ref() is None for ref in blocks), "a block outlived its read"
    assert len(pool) >= 1                     # buffers came back


def test_copies_land_in_reused_pinned_buffers_without_blocking():
    rows = 64
    logits = _processed(rows, VOCAB, 50, seed=2)
    layout = plan_layout([50] * rows, VOCAB)
    pool, copy_stream = PinnedPool(), torch.cuda.Stream()
    seen = set()
    for _ in range(3):
        mask = extract_support(logits, layout)
        gate = Gate()
        gate.hold(copy_stream)
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(torch.cuda.current_stream())
            copy = MaskCopy(mask, pool)
            done = torch.cuda.Event()
            done.record(copy_stream)
        assert copy._buffer.is_pinned()
        assert not done.query()               # returned before the copy ran
        gate.release()
        seen.add(copy._buffer.data_ptr())
        done.synchronize()
        copy.result(np.ones(rows))
        assert not gate.gave_up()
    assert len(seen) == 1                     # one buffer, reused step after step


def _compiled_variants() -> int:
    from vllm_sampling_mask.worker.extraction import kernels
    total = 0
    for kernel in (kernels._chunk_pass, kernels._place_pass):
        for cache in kernel.device_caches.values():
            total += len(cache[0])
    return total


def test_no_compile_after_warm_up_across_batch_shapes():
    """After `warm_up`, batches of any size, top-k and row subset launch only
    variants that are already compiled (Triton's own kernel caches)."""
    earlier = _compiled_variants()            # other tests may have compiled some
    warm_up("cuda", VOCAB, (torch.float32, torch.bfloat16))
    before = _compiled_variants()
    assert before - earlier <= 5 and before > 0
    g = np.random.default_rng(0)
    logits = torch.randn(512, VOCAB, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        for rows in (1, 2, 3, 7, 16, 33, 100, 256, 511, 512):
            for k in (1, 20, 50, 1000, VOCAB):
                wanted = np.ones(rows, bool) if k % 2 else g.random(rows) < 0.6
                wanted[0] = True
                extract_selected(x[:rows], np.full(rows, k), wanted, max_size=4096)
    torch.cuda.synchronize()
    assert _compiled_variants() == before


def test_the_profiling_run_compiles_every_variant_a_step_launches():
    """The runners' memory-profiling run (`SamplingMaskState.profiling`) warms the
    kernels up for the logits it extracts from: later steps compile nothing."""
    from vllm_sampling_mask.worker import plan as plans
    from vllm_sampling_mask.worker.state import SamplingMaskState
    state = SamplingMaskState(max_num_reqs=64, max_size=4096)
    logits = torch.randn(64, VOCAB, device="cuda")
    with state.profiling() as step:   # MRv2's profiling batch: the model's bf16 logits
        step.planned("Sampler.sample", 64, normalise=True)
        step.capture.record(logits.bfloat16())
        step.extract("Sampler.sample", logits.bfloat16())
    torch.cuda.synchronize()
    before = _compiled_variants()
    for rows, k in ((1, 5), (3, 50), (17, 1000), (64, VOCAB)):
        wanted = np.arange(rows) % 2 == 0
        plan = plans.plan(wanted, np.zeros(rows, bool), np.full(rows, k))
        state.extract(plan, logits[:rows])     # processed: float32
    torch.cuda.synchronize()
    assert _compiled_variants() == before
