"""Where the engine-level flag lives once the engine is configured."""

from __future__ import annotations


def mask_enabled(vllm_config) -> bool:
    """True when the engine was started with return_sampling_mask."""
    model_config = getattr(vllm_config, "model_config", None)
    return bool(getattr(model_config, "return_sampling_mask", False))
