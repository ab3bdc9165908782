"""verl 0.9.1 on a CPU host: a `cpu` platform for verl's platform registry.

A harness module for CPU hosts only (examples/verl_cpu.py and
tests/integrations/test_verl_loop.py load it); it changes nothing in
`vllm_sampling_mask` and is not loaded on a CUDA host.

verl picks its device through `verl.plugin.platform.get_platform()`: the platform
named by `VERL_PLATFORM`, else the first registered one (nvidia, npu, rocm) whose
device is present, else nvidia (`_detect_platform_name`). None is for a CPU, so
every device call (`get_device_name()`, `get_torch_device()`, `get_device_id()`,
the placement groups' resource name, the weight transfer's IPC check) would name
CUDA (`return "nvidia"`, verl/plugin/platform/platform_manager.py:117).
Registering a platform is verl's own extension point ("External plugins ... can
register their own platform classes", platform_manager.py), loaded in every Ray
worker by verl's `VERL_USE_EXTERNAL_MODULES=verl_cpu_host` and picked by
`VERL_PLATFORM=cpu`. What it answers, and which CUDA line each answer stands in for:

- `device_name` "cpu": tensors, `torch.distributed` (gloo) and FSDP on the CPU, in
  place of `PlatformCUDA.device_name` "cuda" (platform_cuda.py).
- `current_device()` "cpu", as `torch.cpu.current_device()` answers: verl passes it
  as `device=` (`get_device_id()`), where CUDA's 0 would name cuda:0.
- `device_module`: `torch.cpu` with the CUDA-only calls verl makes (`empty_cache`,
  `ipc_collect`, `mem_get_info`, `memory_allocated`, ..., `get_rng_state`) answered
  for the host, in place of `torch.cuda`.
- `ray_resource_name` "GPU": the Ray head is started with logical GPUs
  (`ray start --num-gpus=N`, no code change) so that `RayResourcePool.
  get_placement_groups`'s `bundle[device_name] = 1`
  (verl/single_controller/ray/base.py:148) and the rollout's
  `get_accelerator_ids()[get_resource_name()]`
  (verl/workers/rollout/vllm_rollout/vllm_async_server.py:1348) find one per worker.
- `is_ipc_supported` False: verl's own shared-memory path for the colocated weight
  sync (`self.use_shm = not is_support_ipc()`,
  verl/workers/rollout/vllm_rollout/vllm_rollout.py:143), in place of CUDA IPC.
- `communication_backend_name` "gloo" in place of "nccl".

Two lines are replaced rather than answered:
- `initialize_global_process_group_ray` (verl/utils/distributed.py:89) forms
  `f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`, which on the CPU names the
  CPU twice (`cpu:gloo,cpu:gloo`, refused by `torch.distributed`); called without a
  backend it gets "cpu:gloo" here, what the line gives CPU tensors on any device.
- `offload_policy = CPUOffloadPolicy(pin_memory=True)`
  (verl/workers/engine/fsdp/transformer_impl.py:462), the FSDP2 policy of a
  forward-only engine (the reference policy's): pinned host memory needs a CUDA
  driver, so on this host the module's `CPUOffloadPolicy` builds it unpinned.

The FSDP training engine is registered for `device=["cuda", "npu"]` only
(`@EngineRegistry.register(...)` above `FSDPEngineWithLMHead`,
verl/workers/engine/fsdp/transformer_impl.py:1143); verl's own `VERL_ENGINE_DEVICE=cuda`
(`EngineRegistry.get_engine_cls`, verl/workers/engine/base.py:406) selects that
class on this platform, and the class itself runs on whatever `get_device_name()`
says.
"""

from __future__ import annotations

import functools
import os
import sys
import types
from contextlib import contextmanager

import torch
import wrapt

from verl.plugin.platform import PlatformBase, PlatformRegistry

# the environment every process of the run needs (Ray's runtime_env carries it)
ENV = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": "verl_cpu_host",
    "VERL_ENGINE_DEVICE": "cuda",
}


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory, as `torch.cuda.mem_get_info` answers."""
    total = free = 0
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key == "MemTotal":
                total = int(value.split()[0]) * 1024
            elif key == "MemAvailable":
                free = int(value.split()[0]) * 1024
    return free, total


def _device_module() -> types.ModuleType:
    """`torch.cpu` plus the CUDA-module calls verl makes, answered for the host."""
    module = types.ModuleType("verl_cpu_host.device")
    for name in ("synchronize", "current_stream", "stream", "Stream", "Event",
                 "is_available", "device_count", "set_device", "StreamContext"):
        if hasattr(torch.cpu, name):
            setattr(module, name, getattr(torch.cpu, name))
    noop = lambda *args, **kwargs: None  # noqa: E731
    for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction",
                 "reset_peak_memory_stats", "manual_seed", "manual_seed_all"):
        setattr(module, name, noop)
    zero = lambda *args, **kwargs: 0  # noqa: E731
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated",
                 "max_memory_reserved"):
        setattr(module, name, zero)
    module.current_device = torch.cpu.current_device   # "cpu"
    module.mem_get_info = lambda *args, **kwargs: _host_memory()
    module.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    module.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    module.get_device_name = lambda *args, **kwargs: "cpu"
    return module


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's device abstraction answered for a CPU host (see the module docstring)."""

    _module = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._module is None:
            PlatformCPU._module = _device_module()
        return PlatformCPU._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> str:
        # what torch.cpu.current_device() answers: verl passes it as `device=` (an int
        # there would name cuda:0)
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"   # what Ray sets for its (logical) GPUs

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def _gloo_process_group() -> None:
    """`initialize_global_process_group_ray(backend=None)` gets "cpu:gloo" (see the
    module docstring: verl/utils/distributed.py:89)."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_cpu_host", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._cpu_host = True
    for name, module in list(sys.modules.items()):   # verl modules that imported it by name
        if name.split(".")[0] == "verl" and \
                vars(module).get("initialize_global_process_group_ray") is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


_gloo_process_group()


def _unpinned_offload(module) -> None:
    """transformer_impl.py:462's `CPUOffloadPolicy(pin_memory=True)`, unpinned (see the
    module docstring)."""
    original = module.CPUOffloadPolicy
    if getattr(original, "_cpu_host", False):
        return

    class CPUOffloadPolicy(original):
        _cpu_host = True

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=False)

    module.CPUOffloadPolicy = CPUOffloadPolicy


wrapt.register_post_import_hook(_unpinned_offload,
                                "verl.workers.engine.fsdp.transformer_impl")
