"""Patches that act in the worker (the model runner, the sampler): the sampling mask
itself."""
