"""Patches of the HTTP server (`vllm serve`'s routes, protocol and app): diagnostics,
active only with VLLM_SAMPLING_MASK_DEBUG_STATE=1."""
