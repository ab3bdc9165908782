"""A float32 MoE model loads on a CPU with AMX, as it does on one without.

What: wraps `CPUFusedMOE.check_grouped_gemm`
    (vllm/model_executor/layers/fused_moe/cpu_fused_moe.py), which picks the CPU
    fused-MoE kernel when a MoE layer's weights are loaded. For weights that are
    not bfloat16 on a CPU with AMX tiles, it runs upstream's own decision with
    `torch.cpu._is_amx_tile_supported` answering False for the duration of the
    call, so the layer gets the kernel a CPU without AMX picks for that dtype
    (the vectorised grouped GEMM, or the per-expert loop). bfloat16 weights, and
    CPUs without AMX, go to upstream unchanged. Applies with the mask flag on or off.
Why: upstream's AMX branch accepts only bfloat16 and raises for every other
    dtype, with a message about the intermediate size not being a multiple of 32
    (even when it is: 128): a float32 MoE model (the dtype exact masks are checked
    in) cannot start on an AMX CPU, though the non-AMX kernels serve it.
Upstream issue: none known; would file "float32 MoE refused on AMX CPUs with a
    misleading alignment error (CPUFusedMOE.check_grouped_gemm raises for any
    non-bfloat16 dtype when AMX is present)".
"""

from __future__ import annotations

import contextlib

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


@contextlib.contextmanager
def _without_amx(torch_cpu):
    saved = torch_cpu._is_amx_tile_supported
    torch_cpu._is_amx_tile_supported = lambda: False
    try:
        yield
    finally:
        torch_cpu._is_amx_tile_supported = saved


def apply(module, release: Release) -> None:
    import torch

    @wraps(module, "CPUFusedMOE.check_grouped_gemm")
    def check_grouped_gemm(wrapped, self, args, kwargs):
        layer = argument(wrapped, args, kwargs, "layer")
        if layer.w13_weight.dtype == torch.bfloat16 or not torch.cpu._is_amx_tile_supported():
            return wrapped(*args, **kwargs)
        with _without_amx(torch.cpu):
            return wrapped(*args, **kwargs)
