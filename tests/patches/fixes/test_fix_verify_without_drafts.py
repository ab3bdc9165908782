"""The fix `verify_without_drafts`, on V1's rejection sampler in this process (no
engine): a verify step without draft rows leaves the logits alone (upstream ran top-k
over an empty batch).
Speculative decoding on engines of both runners: tests/llm/test_speculative.py."""

from __future__ import annotations

import pytest
from conftest import skip_without_v1_runner

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_fix_a_verify_step_without_drafts_leaves_the_logits_alone():
    """`verify_without_drafts`: no draft row, no top-k over an empty batch."""
    skip_without_v1_runner()   # (V1's rejection sampler)
    import types

    import torch
    from vllm.v1.sample import rejection_sampler

    empty = torch.empty(0, 16)
    out = rejection_sampler.apply_sampling_constraints(
        empty, torch.zeros(2, dtype=torch.int32), types.SimpleNamespace(all_greedy=False))
    assert out is empty
