"""Patches that act in the worker (the model runner, the sampler): CPU / Triton-
interpreter enablers, applied only with TRITON_INTERPRET=1."""
