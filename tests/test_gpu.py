"""CUDA-only checks of the extraction kernel and the transport (`-m gpu`).

Run where CUDA is available; they need torch and Triton, not vLLM:

    python -m pytest -m gpu tests/test_gpu.py
    python scripts/gpu_check.py           # these tests + the extraction benchmark

On a CPU host they are deselected by the `gpu` marker (see conftest.py); the
same kernel runs there through Triton's interpreter in test_extraction_kernel.py.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from vllm_sampling_mask.extraction import MaskLayout, extract_support, plan_layout
from vllm_sampling_mask.transport import MaskCopy, PinnedPool, decode

pytestmark = pytest.mark.gpu
VOCAB = 151936


def _processed(rows, vocab, top_k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device="cuda").mul(4).round().div(4)
    kth = x.topk(top_k, dim=-1).values[:, -1:]
    x = x.masked_fill(x < kth, float("-inf"))
    x[1] = float("-inf")
    x[2, ::5] = float("nan")
    x[3, ::2] = 1.0            # wide
    return x


@pytest.mark.parametrize("rows,top_k", [(64, 50), (256, 1024)])
def test_compiled_kernel_equals_torch_path_at_real_vocabulary(rows, top_k):
    logits = _processed(rows, VOCAB, top_k)
    base = plan_layout([top_k] * rows, VOCAB)
    layout = MaskLayout(rows, base.width, rows, VOCAB)
    kernel = extract_support(logits, layout, use_triton=True)
    reference = extract_support(logits, layout, use_triton=False)
    torch.cuda.synchronize()
    got = decode(kernel.block.cpu().numpy(), layout, np.arange(rows), np.ones(rows))
    want = decode(reference.block.cpu().numpy(), layout, np.arange(rows), np.ones(rows))
    assert np.array_equal(got.counts, want.counts) and got.wide.keys() == want.wide.keys()
    finite = torch.isfinite(logits).cpu()
    for r in range(rows):
        assert np.array_equal(got.row(r), want.row(r)), r
        assert np.array_equal(got.row(r), torch.nonzero(finite[r]).view(-1).numpy()), r


def test_copy_reads_its_block_even_when_the_main_stream_reuses_memory():
    """The copy stream is held back (a device sleep) while the main stream frees
    every other reference to the block and allocates and overwrites memory of the
    same size: the copy must still read the block as it was written."""
    rows, top_k = 256, 50
    logits = _processed(rows, VOCAB, top_k, seed=1)
    layout = plan_layout([top_k] * rows, VOCAB)
    want = decode(extract_support(logits, layout, use_triton=False).block.cpu().numpy(),
                  layout, np.arange(rows), np.ones(rows))
    pool, copy_stream, main = PinnedPool(), torch.cuda.Stream(), torch.cuda.current_stream()
    copies = []
    for _ in range(4):                        # several steps in flight
        mask = extract_support(logits, layout)
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(main)
            torch.cuda._sleep(50_000_000)     # the copy starts long after this line
            copy = MaskCopy(mask, pool)
            done = torch.cuda.Event()
            done.record(copy_stream)
        del mask
        gc.collect()
        for _ in range(8):                    # the main stream reuses freed blocks
            torch.full((layout.numel + 1,), 7, dtype=torch.int32, device="cuda")
        copies.append((copy, done))
    assert not copies[-1][1].query(), "the copy should still be pending here"
    for copy, done in copies:
        done.synchronize()
        got = copy.result(np.ones(rows))
        assert np.array_equal(got.counts, want.counts)
        for r in range(rows):
            assert np.array_equal(got.row(r), want.row(r))
    assert len(pool) >= 1                     # buffers came back


def test_copies_land_in_reused_pinned_buffers_without_blocking():
    rows = 64
    logits = _processed(rows, VOCAB, 50, seed=2)
    layout = plan_layout([50] * rows, VOCAB)
    pool, copy_stream = PinnedPool(), torch.cuda.Stream()
    seen = set()
    for _ in range(3):
        mask = extract_support(logits, layout)
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(torch.cuda.current_stream())
            torch.cuda._sleep(10_000_000)
            copy = MaskCopy(mask, pool)
            done = torch.cuda.Event()
            done.record(copy_stream)
        assert copy._buffer.is_pinned()
        assert not done.query()               # returned before the copy ran
        seen.add(copy._buffer.data_ptr())
        done.synchronize()
        copy.result(np.ones(rows))
    assert len(seen) == 1                     # one buffer, reused step after step
