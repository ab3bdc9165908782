"""`wraps(module, "Class.method")`: a decorator over `wrapt.wrap_function_wrapper`.

The decorated function is a wrapt wrapper, `(wrapped, instance, args, kwargs)`;
the patched attribute keeps the original reachable as `__wrapped__`.
"""

from __future__ import annotations

import wrapt


def wraps(module, name: str):
    def decorate(wrapper):
        wrapt.wrap_function_wrapper(module, name, wrapper)
        return wrapper
    return decorate


def run_worst_case(sampler, wrapped, args, kwargs):
    """Call `wrapped` (the memory-profiling sampler run) with the sampler's declared
    `sampling_mask_worst_case` set, so the mask is extracted with the largest layout
    a step can use and the KV cache is sized with it included."""
    if not sampler.return_sampling_mask:
        return wrapped(*args, **kwargs)
    sampler.sampling_mask_worst_case = True
    try:
        return wrapped(*args, **kwargs)
    finally:
        sampler.sampling_mask_worst_case = False
