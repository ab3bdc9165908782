"""Patches that act in the engine core (the scheduler): diagnostics, active only with
VLLM_SAMPLING_MASK_DEBUG_STATE=1."""
