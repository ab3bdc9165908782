"""Patches that act in the worker (the model runner, the sampler): fixes of upstream
bugs, active with the mask flag on or off."""
