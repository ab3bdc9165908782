"""Diagnostics, active only with VLLM_SAMPLING_MASK_DEBUG_STATE=1."""
