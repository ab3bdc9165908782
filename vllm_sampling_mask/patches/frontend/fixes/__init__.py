"""Patches that act in the API server / LLM front end, outside the HTTP layer (input and
output processing, the engine client): fixes of upstream bugs, active with the mask flag
on or off."""
