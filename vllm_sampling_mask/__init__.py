"""vLLM sampling masks for RL rollouts: an overlay on the vLLM releases in `releases`.

Installing this package makes the stock `vllm` behave as the fork in every
process (see `docs/design.md`). This module stays import-light: the site hook
imports it at every interpreter start.
"""

from __future__ import annotations

import os

from vllm_sampling_mask.releases import SUPPORTED as SUPPORTED_VLLM

__version__ = "0.1.0"
# SUPPORTED_VLLM: the vLLM releases this overlay is written for, oldest first (the
# version guard's list), from their profiles in `releases.RELEASES`: adding a release
# is a profile there plus the records and seam entries it changes.
UPSTREAM_VERSION = SUPPORTED_VLLM[-1]  # the newest supported release

DEMO_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_model")

__all__ = ["DEMO_MODEL", "SUPPORTED_VLLM", "SamplingMask", "UPSTREAM_VERSION", "__version__"]


def __getattr__(name: str):
    if name == "SamplingMask":
        from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
        return SamplingMask
    raise AttributeError(f"module 'vllm_sampling_mask' has no attribute {name!r}")
