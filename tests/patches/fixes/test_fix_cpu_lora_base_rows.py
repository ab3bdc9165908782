"""The fix `cpu_lora_base_rows`, on upstream's PyTorch LoRA ops (what a CPU host
calls), without an engine: rows of a batch with adapter index -1 (the base model) get
no adapter's product. Up to 0.32 upstream's ops gave them the last slot's (the fix
keeps them as they were); from 0.33 upstream clamps the index itself. A batch mixing
the base model and adapters on an engine: tests/llm/test_lora.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def _ops_case():
    generator = torch.Generator().manual_seed(0)
    slots, rows, r, d_in, d_out = 2, 5, 4, 6, 7
    return dict(
        x=torch.randn(rows, d_in, generator=generator),
        h=torch.randn(rows, r, generator=generator),
        a=torch.randn(slots, 1, r, d_in, generator=generator),
        b=torch.randn(slots, 1, d_out, r, generator=generator),
        out=torch.randn(rows, d_out, generator=generator),
        indices=torch.tensor([0, -1, 1, -1, 0]))


def test_fix_base_rows_are_left_alone_by_the_cpu_lora_ops():
    """Rows with adapter index -1 keep their values in every op (shrink, expand,
    expand_slice, and the prefill ops over them); the other rows get their own slot's
    product; a call of -1 rows only changes nothing. Upstream's own ops add the
    last slot's product to the -1 rows up to 0.32 (the fix); from 0.33 they clamp
    the index and give those rows no product (a shrink writes zeros there)."""
    from vllm_sampling_mask.patches import REGISTRY
    from vllm_sampling_mask.patches.apply import upstream_release
    patched = REGISTRY["cpu_lora_base_rows"].applies_to(upstream_release())
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu
    for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink"):
        assert getattr(punica_cpu, name) is getattr(lora_ops, name)   # what the CPU calls
    c = _ops_case()
    base, idx = c["indices"] < 0, c["indices"]
    want_h = torch.einsum("bi,boi->bo", c["x"], c["a"][idx.clamp(min=0), 0]) * 0.5
    want_y = torch.einsum("bi,boi->bo", c["h"], c["b"][idx.clamp(min=0), 0])

    shrunk = c["h"].clone()
    lora_ops.bgmv_shrink(c["x"], c["a"], shrunk, idx, 0.5)
    torch.testing.assert_close(shrunk[~base], want_h[~base])
    kept = c["h"] if patched else torch.zeros_like(c["h"])   # no product either way
    assert torch.equal(shrunk[base], kept[base])

    expanded = c["out"].clone()
    lora_ops.bgmv_expand(c["h"], c["b"], expanded, idx, add_inputs=True)
    torch.testing.assert_close(expanded[~base], c["out"][~base] + want_y[~base])
    assert torch.equal(expanded[base], c["out"][base])

    wide = torch.zeros(5, 10)
    lora_ops.bgmv_expand_slice(c["h"], c["b"], wide, idx, 2, 7, add_inputs=True)
    torch.testing.assert_close(wide[~base, 2:9], want_y[~base])
    assert not wide[base].any()

    # the prefill op: segments [0] [-1] [1] [-1, -1]... as upstream's sgmv explodes them
    seg = torch.tensor([0, -1, 1, -1]), torch.tensor([1, 1, 1, 2])
    prefill = c["h"].clone()
    lora_ops.sgmv_shrink(c["x"], c["a"], prefill, torch.tensor([0, 1, 2, 3]), seg[1],
                         seg[0], 4, 2, 5, 0.5)
    rows = torch.repeat_interleave(*seg) < 0
    assert torch.equal(prefill[rows], kept[rows])

    untouched = c["out"].clone()
    lora_ops.bgmv_expand(c["h"], c["b"], untouched, torch.full((5,), -1), add_inputs=True)
    assert torch.equal(untouched, c["out"])

    if patched:   # what the fix changes: upstream's op adds the last slot's product
        upstream = c["out"].clone()
        lora_ops.bgmv_expand.__wrapped__(c["h"], c["b"], upstream, idx, add_inputs=True)
        last = torch.einsum("bi,boi->bo", c["h"], c["b"][[1] * 5, 0])
        torch.testing.assert_close(upstream[base], c["out"][base] + last[base])
