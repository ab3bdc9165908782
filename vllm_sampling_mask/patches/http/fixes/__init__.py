"""Patches of the HTTP server (`vllm serve`'s routes, protocol and app): fixes of
upstream bugs, active with the mask flag on or off."""
