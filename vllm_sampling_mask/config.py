"""Configuration: the engine-level flag, and every environment variable the
overlay reads (read here and nowhere else)."""

from __future__ import annotations

import os

_TRUE = ("1", "true", "True")

# VLLM_SAMPLING_MASK_DISABLE=1: stock vLLM, no patch applied (read by the site hook).
DISABLE = "VLLM_SAMPLING_MASK_DISABLE"
# VLLM_SAMPLING_MASK_DEBUG_STATE=1: the per-request state route (diagnostics).
DEBUG_STATE = "VLLM_SAMPLING_MASK_DEBUG_STATE"
# VLLM_SAMPLING_MASK_TRITON_TOPK=1: under the interpreter, run vLLM's Triton
# top-k/top-p kernel on CPU tensors instead of the PyTorch path.
TRITON_TOPK = "VLLM_SAMPLING_MASK_TRITON_TOPK"
# VLLM_SAMPLING_MASK_RETURN=1: every engine the process builds starts as if
# `return_sampling_mask=True` had been passed (`LLM(...)`, `EngineArgs`, `vllm serve`):
# the way in for a framework that builds `LLM(...)` itself with fixed arguments.
RETURN = "VLLM_SAMPLING_MASK_RETURN"
# VLLM_SAMPLING_MASK_COVERAGE=0: the verl, OpenRLHF and SkyRL adapters skip the support's
# coverage metric (default 1: logged where the trainer takes masked log-probabilities).
COVERAGE = "VLLM_SAMPLING_MASK_COVERAGE"


def overlay_disabled() -> bool:
    return os.environ.get(DISABLE, "") in _TRUE


def return_mask_from_env() -> bool:
    return os.environ.get(RETURN, "") in _TRUE


def coverage_enabled() -> bool:
    """VLLM_SAMPLING_MASK_COVERAGE: "1" (the default, unset or empty) or "0"."""
    value = os.environ.get(COVERAGE, "").strip()
    if value in ("", "1", "true", "True"):
        return True
    if value in ("0", "false", "False"):
        return False
    raise ValueError(f"{COVERAGE} must be 1 (log the support's coverage metric) or 0 "
                     f"(skip it), got {value!r}")


def debug_state_enabled() -> bool:
    return os.environ.get(DEBUG_STATE, "") in _TRUE


def triton_interpreter_on() -> bool:
    """True when Triton's own switch TRITON_INTERPRET=1 is set."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def interpreted_triton_top_k() -> bool:
    return os.environ.get(TRITON_TOPK, "0") not in ("", "0")


def mask_settings(vllm_config):
    """The engine's `validation.EngineMaskSettings`, None when it was started
    without return_sampling_mask.

    `ModelConfig.sampling_mask_settings` is declared on the class by the
    `model_config` patch, so a config without it is an error, not "off"."""
    return vllm_config.model_config.sampling_mask_settings


def mask_enabled(vllm_config) -> bool:
    """True when the engine was started with return_sampling_mask."""
    return mask_settings(vllm_config) is not None


def serving_mask_enabled(serving) -> bool:
    """`mask_enabled` for an HTTP route's serving object (its engine client's config)."""
    return mask_enabled(serving.engine_client.vllm_config)
