"""Where the engine-level flag lives once the engine is configured."""

from __future__ import annotations


def mask_enabled(vllm_config) -> bool:
    """True when the engine was started with return_sampling_mask.

    `ModelConfig.return_sampling_mask` is declared on the class by the
    `model_config` patch, so a config without it is an error, not "off"."""
    return bool(vllm_config.model_config.return_sampling_mask)
