"""The sampling-mask feature: the engine flag, the mask's path from the sampler to the
response, and the HTTP routes."""
