"""`cpu_moe_float32_amx`: on a CPU with AMX tiles, upstream's CPU fused-MoE kernel
choice (`CPUFusedMOE.check_grouped_gemm`, 0.27.1) refuses every MoE layer whose
weights are not bfloat16, with an alignment message; the fix lets it pick what a
CPU without AMX picks.

Upstream's own method, called on a layer of real weight tensors (the shapes a MoE
layer holds: `w13_weight` [experts, 2 x intermediate, hidden], `w2_weight`
[experts, hidden, intermediate]); the engine-level run is the MoE model of
tests/llm/test_moe_router_replay.py, which starts only with the fix on such a CPU.
"""

from __future__ import annotations

import pytest
import torch

from vllm_sampling_mask.patches import REGISTRY
from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release

if not REGISTRY["cpu_moe_float32_amx"].applies_to(patching.upstream_release()):
    pytest.skip(f"cpu_moe_float32_amx is not applied on vLLM "
                f"{patching.upstream_release().version} (its record's span)",
                allow_module_level=True)
if not torch.cpu._is_amx_tile_supported():
    pytest.skip("this CPU has no AMX tiles: upstream's AMX branch is never taken",
                allow_module_level=True)

import vllm._C  # noqa: E402,F401  (the CPU kernels: prepack_moe_weight)
from vllm.model_executor.layers.fused_moe import cpu_fused_moe  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402

EXPERTS, HIDDEN, INTERMEDIATE = 4, 64, 128


def _layer(dtype: torch.dtype) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.w13_weight = torch.nn.Parameter(
        torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN).to(dtype), requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(
        torch.randn(EXPERTS, HIDDEN, INTERMEDIATE).to(dtype), requires_grad=False)
    layer.activation = MoEActivation.SILU
    return layer


def _choice(method, dtype):
    moe = object.__new__(cpu_fused_moe.CPUFusedMOE)   # the choice only: no weights packed
    return method(moe, _layer(dtype))


def test_a_float32_layer_gets_the_kernel_a_cpu_without_amx_picks():
    patched = cpu_fused_moe.CPUFusedMOE.check_grouped_gemm
    upstream = patched.__wrapped__
    with pytest.raises(RuntimeError):   # upstream: refused (its alignment message)
        _choice(upstream, torch.float32)
    use_grouped_gemm, isa = _choice(patched, torch.float32)
    assert isa != "amx"
    saved = torch.cpu._is_amx_tile_supported
    torch.cpu._is_amx_tile_supported = lambda: False
    try:
        assert (use_grouped_gemm, isa) == _choice(upstream, torch.float32)
    finally:
        torch.cpu._is_amx_tile_supported = saved


def test_a_bfloat16_layer_keeps_upstreams_amx_kernel():
    patched = cpu_fused_moe.CPUFusedMOE.check_grouped_gemm
    assert _choice(patched, torch.bfloat16) == _choice(patched.__wrapped__, torch.bfloat16) \
        == (True, "amx")
