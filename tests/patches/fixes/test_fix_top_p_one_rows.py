"""`top_p_one_rows`: a top_p = 1 row keeps its whole (top-k) support beside rows
with top_p < 1, exactly as it does alone; other rows are cut as upstream cuts them."""

from __future__ import annotations

import pytest
import torch

from vllm.v1.sample.ops import topk_topp_sampler as ops

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def kept(logits, k, p):
    return torch.isfinite(ops.apply_top_k_top_p_pytorch(logits.clone(), k, p))


def test_a_top_p_1_row_keeps_ids_of_float32_probability_zero():
    torch.manual_seed(0)
    V = 256
    row = torch.randn(V) * 300         # a low temperature: most probabilities underflow
    top50 = row.topk(50).values
    assert (torch.softmax(top50, -1) == 0).sum() > 10   # even within its top 50
    other = torch.randn(V)
    logits = torch.stack([row, other])
    k = torch.tensor([50, V])
    alone = kept(row[None], k[:1], None)[0]        # upstream passes p=None then
    beside = kept(logits, k, torch.tensor([1.0, 0.5]))
    assert alone.sum() == 50
    assert torch.equal(beside[0], alone)           # upstream: ids of probability 0 cut
    # the top_p = 0.5 row is cut as upstream would, unaffected by its neighbour
    unpatched = ops.apply_top_k_top_p_pytorch.__wrapped__
    expected = torch.isfinite(unpatched(other[None].clone(), k[1:], torch.tensor([0.5])))
    assert torch.equal(beside[1], expected[0]) and 1 <= beside[1].sum() < V


def test_without_the_patch_the_neighbour_changes_the_support():
    """The upstream behaviour the patch removes, so this test fails if it is gone."""
    torch.manual_seed(0)
    V = 256
    row = torch.randn(V) * 300
    logits = torch.stack([row, torch.randn(V)])
    unpatched = ops.apply_top_k_top_p_pytorch.__wrapped__
    out = unpatched(logits.clone(), torch.tensor([50, V]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(out[0]).sum() < 50
