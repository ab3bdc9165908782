"""A bfloat16 model runs on a CPU with AMX: each vLLM process asks for AMX tile state.

What: when a process picks vLLM's CPU platform (`vllm.platforms.cpu` is imported:
    the API server or `LLM` front end, the engine core and the worker each resolve
    their platform before any CPU kernel runs), requests AMX tile data from the
    kernel (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, the plain code
    in `vllm_sampling_mask.worker.cpu_amx`) where the CPU has AMX (`amx_tile` in
    /proc/cpuinfo, or `torch.cpu._is_amx_tile_supported()`, the check vLLM's kernels
    make). Changes nothing off Linux x86-64, on a CPU without AMX, on other
    platforms (CUDA never imports the module), or once granted; never raises: a
    refusal is logged as one warning line. Applies with the mask flag on or off.
Why: vLLM's CPU kernels for bfloat16 (the attention and small-GEMM kernels it
    picks when `torch.cpu._is_amx_tile_supported()`) run AMX instructions, and no
    vLLM process asks Linux for AMX tile state first: the worker dies with SIGILL
    (exit code -4) as soon as it runs a bfloat16 model (vLLM's CPU default for a
    float32 checkpoint), stock vLLM too.
Upstream issue: none known; would file "CPU: bfloat16 worker dies with SIGILL on
    AMX hosts (AMX kernels run without ARCH_REQ_XCOMP_PERM for XTILEDATA)".
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


def apply(module, release: Release) -> None:
    request()
