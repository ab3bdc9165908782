"""On a vLLM release with a sampling mask of its own (0.28 on): the overlay's supports are
upstream's supports (that code written against upstream's mask API keeps working, on
every release, is `test_overlay.test_upstream_mask_api_reads_the_overlays_mask`).

The overlay replaces upstream's extraction and transport (docs/releases.md says why).
Here both run on the same processed logits: upstream's `SamplingMaskTensors.from_logits`
(its Triton kernel, run by Triton's interpreter on a CPU host, decoded by its own
`tolists`) and the overlay's `extract_support` (its kernel, decoded by `transport.decode`),
on rows where upstream produces a mask at all: any top-k (its compact ids), rows wider
than its compact width (its bitmask fallback), NaN, +/-inf and rows with nothing kept.
On 0.27.1, which has no mask of its own, the module is skipped, saying so.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from vllm_sampling_mask.worker.extraction import ExtractionSettings, extract_support, plan_layout
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
from vllm_sampling_mask.worker.transport import decode

pytestmark = pytest.mark.release_tier  # CI runs it on every release

upstream_output = pytest.importorskip(
    "vllm.v1.worker.gpu.sample.output",
    reason="this vLLM has no Model Runner V2 sampler output")
if not hasattr(upstream_output, "SamplingMaskTensors"):
    pytest.skip("this vLLM release (0.24.0, 0.27.1) has no sampling mask of its own to agree with",
                allow_module_level=True)

from test_extraction_kernel import hostile_logits  # noqa: E402


def upstream_supports(logits: torch.Tensor, max_num_kept: int) -> list[list[int]]:
    """Upstream's supports of `logits` (one sampled token per row), through the
    release's own API: 0.28-0.29 pack a bitmap per row; 0.30-0.31 compact up to
    `max_num_kept` ids; 0.32 also takes the rows' logits offsets."""
    rows = logits.shape[0]
    ones = torch.ones(rows, dtype=torch.int32)
    from_logits = upstream_output.SamplingMaskTensors.from_logits
    takes = inspect.signature(from_logits).parameters
    if "cu_num_logits" in takes:
        tensors = from_logits(logits, torch.arange(rows + 1, dtype=torch.int32), ones,
                              max_num_kept)
    elif "max_num_kept" in takes:
        tensors = from_logits(logits, ones, max_num_kept)
    else:
        tensors = from_logits(logits, ones)
    host = tensors.to_cpu_nonblocking()
    if "num_sampled_tokens" in inspect.signature(host.tolists).parameters:
        return host.tolists(ones.numpy()).to_nested_list()
    return host.tolists().to_nested_list()


def overlay_supports(logits: torch.Tensor, top_k: np.ndarray) -> list[list[int]]:
    layout = plan_layout(top_k, logits.shape[1], max_size=logits.shape[1])
    mask = extract_support(logits, layout, implementation="triton",
                           settings=ExtractionSettings(kernel_chunk=512))
    host = decode(mask.block.cpu().numpy(), layout, mask.row_of(), np.ones(layout.rows))
    return SamplingMask(host.ids, host.offsets).token_ids


_TAKES = inspect.signature(upstream_output.SamplingMaskTensors.from_logits).parameters


@pytest.mark.skipif(
    "max_num_kept" in _TAKES and "cu_num_logits" not in _TAKES and not torch.cuda.is_available(),
    reason="vLLM 0.30-0.31's compact kernel does not run under Triton's interpreter "
           "(InterpreterError: ValueError('mask has unsupported dtype')); it runs on 0.28-0.29 "
           "(bitmap) and 0.32, and on a GPU")
@pytest.mark.parametrize("seed,top_k,max_num_kept", [(0, 20, 20), (1, 50, 64), (2, 5, 8)])
def test_overlay_and_upstream_extract_the_same_supports(seed, top_k, max_num_kept):
    logits = hostile_logits(rows=12, vocab=3001, top_k=top_k, seed=seed)
    ours = overlay_supports(logits, np.full(12, top_k))
    theirs = upstream_supports(logits, max_num_kept)
    wide = sum(len(s) > max_num_kept for s in theirs)
    assert wide > 0, "the inputs were meant to reach upstream's bitmask fallback"
    assert ours == theirs
    reference = [torch.nonzero(torch.isfinite(row)).view(-1).tolist() for row in logits]
    assert ours == reference


@pytest.mark.skipif("cu_num_logits" not in _TAKES,
                    reason="this vLLM release (0.28-0.31) has no verify-step mask of its own "
                           "(vLLM #54166, 0.32)")
def test_a_verify_step_agrees_with_upstreams_rejection_sampler_mask():
    """A verify step: requests of 3, 1 and 4 positions (drafts, then the bonus
    position) that emitted 2, 1 and 4 tokens; upstream's mask of the emitted
    tokens (`from_logits` with the rows' offsets, as its rejection sampler calls
    it) and the overlay's (`transport.decode` with the rows per request) agree,
    token by token."""
    rows_per_request = np.array([3, 1, 4])
    emitted = np.array([2, 1, 4])
    logits = hostile_logits(rows=8, vocab=3001, top_k=20, seed=3)
    cu = np.concatenate(([0], np.cumsum(rows_per_request))).astype(np.int32)
    tensors = upstream_output.SamplingMaskTensors.from_logits(
        logits, torch.from_numpy(cu), torch.from_numpy(emitted.astype(np.int32)), 20,
        int(rows_per_request.max()))
    theirs = tensors.to_cpu_nonblocking().tolists(emitted).to_nested_list()
    layout = plan_layout(np.full(8, 20), logits.shape[1], max_size=logits.shape[1])
    mask = extract_support(logits, layout, implementation="triton",
                           settings=ExtractionSettings(kernel_chunk=512))
    host = decode(mask.block.cpu().numpy(), layout, mask.row_of(), emitted, None, 0,
                  rows_per_request)
    ours = [host.row(int(r)).tolist() for i, n in enumerate(emitted)
            for r in host.rows(i, int(n))]
    assert len(theirs) == emitted.sum()
    assert ours == [list(s) for s in theirs]
