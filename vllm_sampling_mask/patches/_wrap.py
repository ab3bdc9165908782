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
