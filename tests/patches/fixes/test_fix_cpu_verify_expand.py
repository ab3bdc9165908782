"""The fix `cpu_verify_expand`, on V1's rejection sampler in this process (no
engine): each request's sampling values reach every draft position of a verify step
(upstream's CPU override of `expand_batch_to_tokens` left them uninitialised).
Speculative decoding on engines of both runners: tests/llm/test_speculative.py."""

from __future__ import annotations

import pytest
from conftest import skip_without_v1_runner

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_fix_expand_spreads_each_requests_setting_over_its_drafts():
    """`cpu_verify_expand`: per-request values reach every draft position (upstream's
    CPU override left them uninitialised), with `replace_from` turned into `replace_to`."""
    skip_without_v1_runner()   # (V1's rejection sampler)
    import torch
    from vllm.v1.sample import rejection_sampler

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    top_k = rejection_sampler.expand_batch_to_tokens(torch.tensor([5, 7, 9], dtype=torch.int32),
                                                     cu, 6)
    assert top_k.tolist() == [5, 5, 7, 7, 7, 9] and top_k.dtype == torch.int32
    temperature = rejection_sampler.expand_batch_to_tokens(
        torch.tensor([0.5, 0.0, 1.5]), cu, 6, replace_from=0, replace_to=1)
    assert temperature.tolist() == [0.5, 0.5, 1.0, 1.0, 1.0, 1.5]
