"""Patches of the HTTP server (`vllm serve`'s routes, protocol and app)."""
