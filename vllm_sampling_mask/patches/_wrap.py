"""What every patch module uses to wrap an upstream function.

- `wraps(module, "Class.method")`: a decorator over `wrapt.wrap_function_wrapper`.
  The decorated function is a wrapt wrapper, `(wrapped, instance, args, kwargs)`;
  the patched attribute keeps the original reachable as `__wrapped__`.
- `wraps_method(module, "Class.method")`: the same for a plain method called per
  token, installed as a plain function (no wrapt wrapper between).
- `argument(wrapped, args, kwargs, name)`: the value the call passes for the
  wrapped function's parameter `name`, positionally or by keyword (its default
  when not passed), read by the wrapped function's own signature;
  `with_argument(...)` gives `(args, kwargs)` with that argument replaced.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import FunctionType, MethodType

import wrapt


def _target(module, name: str):
    """(the object holding `module.name`'s last part, that part's name, its value)."""
    owner_name, _, attr = name.rpartition(".")
    owner = functools.reduce(getattr, owner_name.split("."), module) if owner_name else module
    return owner, attr, getattr(owner, attr)


def wraps(module, name: str):
    def decorate(wrapper):
        if getattr(_target(module, name)[2], "_one_wrapper", False):
            raise TypeError(f"wraps: {name} is wrapped by wraps_method, which stacks "
                            "with nothing")
        wrapt.wrap_function_wrapper(module, name, wrapper)
        return wrapper
    return decorate


def wraps_method(module, name: str):
    """`wraps` for a method the API server calls per token (the output processor's
    per request and step): the wrapper is called as with `wraps`, `(wrapped, self,
    args, kwargs)`, from a plain function that replaces the method (its
    `__wrapped__` the original), without wrapt's bound wrapper between. That is
    about 0.4 us a call less in a tight loop (`python
    benchmarks/bench_serving.py --hand-off`, `output processor, streams`). Only for
    a method defined as a plain function (not a classmethod, staticmethod or
    other descriptor), and its only wrapper: it stacks with nothing, either way
    round (tests/patches/test_registry.py reads the stacks wrapt records)."""
    owner, attr, original = _target(module, name)
    if not isinstance(original, FunctionType) or hasattr(original, "__wrapped__"):
        raise TypeError(f"wraps_method: {name} is not an unwrapped plain method "
                        f"({type(original).__name__}); use wraps")

    def decorate(wrapper):
        @functools.wraps(original)
        def method(self, *args, **kwargs):
            return wrapper(MethodType(original, self), self, args, kwargs)
        method._one_wrapper = True
        setattr(owner, attr, method)
        return wrapper
    return decorate


_PARAMETERS: dict[tuple[object, bool], tuple[list[str], dict[str, object]]] = {}


def _parameters(wrapped) -> tuple[list[str], dict[str, object]]:
    """(positional parameter names as the call sees them, defaults) of `wrapped`;
    worked out once per function (and per bound or not: a bound method's call
    does not pass `self`), since some wrappers ask on every step."""
    key = getattr(wrapped, "__func__", wrapped)
    found = _PARAMETERS.get((key, key is not wrapped))
    if found is None:
        params = inspect.signature(key).parameters.values()
        names = [p.name for p in params
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        defaults = {p.name: p.default for p in params if p.default is not p.empty}
        if key is not wrapped and names:
            names = names[1:]
        found = _PARAMETERS[key, key is not wrapped] = (names, defaults)
    return found


def argument(wrapped, args, kwargs, name: str):
    if name in kwargs:
        return kwargs[name]
    names, defaults = _parameters(wrapped)
    index = names.index(name) if name in names else len(args)
    if index < len(args):
        return args[index]
    if name in defaults:
        return defaults[name]
    raise TypeError(f"{getattr(wrapped, '__qualname__', wrapped)}() was called "
                    f"without {name!r}")


def with_argument(wrapped, args, kwargs, name: str, make: Callable):
    """(args, kwargs) of the call with the argument `name` replaced by `make(it)`."""
    names, _ = _parameters(wrapped)
    index = names.index(name) if name in names else len(args)
    if name not in kwargs and index < len(args):
        return (*args[:index], make(args[index]), *args[index + 1:]), kwargs
    return args, {**kwargs, name: make(argument(wrapped, args, kwargs, name))}
