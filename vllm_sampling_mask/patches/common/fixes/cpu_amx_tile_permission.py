"""A bfloat16 model runs on a CPU with AMX: each vLLM process asks for AMX tile state.

What it does, when a process picks vLLM's CPU platform (`vllm.platforms.cpu` is
imported, before any CPU kernel runs), with the mask flag on or off:

- requests AMX tile data from Linux where the CPU has AMX (`worker.cpu_amx`); never
  raises: a refusal is one warning line. Elsewhere, or once granted, nothing changes.

Why: vLLM's bfloat16 CPU kernels run AMX instructions without asking Linux first: the
worker died with SIGILL, stock vLLM too.
"""

from __future__ import annotations

import logging

from vllm_sampling_mask.worker import cpu_amx
from vllm_sampling_mask.releases import Release

logger = logging.getLogger(__name__)


def _torch_says_amx() -> bool:
    try:
        import torch
        return bool(torch.cpu._is_amx_tile_supported())
    except Exception:   # an old torch without the check, or none: the flags decide
        return False


def request() -> cpu_amx.TileRequest:
    """Request AMX tile data for this process where its CPU has AMX; never raises."""
    try:
        if not cpu_amx.linux_x86_64():
            return cpu_amx.TileRequest("not-x86-64-linux")
        result = cpu_amx.request_tile_data(cpu_amx.cpu_advertises_amx() or _torch_says_amx())
    except Exception as exc:   # nothing of vLLM's start-up may fail on this
        result = cpu_amx.TileRequest("refused", f"{type(exc).__name__}: {exc}")
    if result.outcome == "refused":
        logger.warning("vllm_sampling_mask: the kernel refused AMX tile state (%s); vLLM's "
                       "AMX kernels may end this process with SIGILL: serve in float32 "
                       "(dtype='float32') on this host", result.detail)
    return result


# The API server or `LLM` front end, the engine core and the worker each resolve their
# platform; CUDA never imports the module. `arch_prctl(ARCH_REQ_XCOMP_PERM,
# XFEATURE_XTILEDATA)` where /proc/cpuinfo says `amx_tile` or torch's check (the one
# vLLM's kernels make) says so; bfloat16 is vLLM's CPU default for a float32 checkpoint.
def apply(module, release: Release) -> None:
    request()

