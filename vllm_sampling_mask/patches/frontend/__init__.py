"""Patches that act in the API server / LLM front end, outside the HTTP layer (input and
output processing, the engine client)."""
