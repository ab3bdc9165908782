"""A float32 MoE model loads on a CPU with AMX, as it does on one without.

What it wraps, in vllm/model_executor/layers/fused_moe/cpu_fused_moe.py, with the mask
flag on or off:

- `CPUFusedMOE.check_grouped_gemm`: weights other than bfloat16 on an AMX CPU get the
  kernel a CPU without AMX picks; bfloat16, and CPUs without AMX, are upstream's.

Why: upstream's AMX branch raised for every non-bfloat16 dtype (with a misleading
alignment message), so a float32 MoE model could not start on an AMX CPU.
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
        # upstream's own decision with `torch.cpu._is_amx_tile_supported` answering False
        # for the call: the vectorised grouped GEMM, or the per-expert loop
        with _without_amx(torch.cpu):
            return wrapped(*args, **kwargs)

