"""What a `collective_rpc` call by name must look like before it reaches the workers.

Plain code, no vLLM import: `patches/frontend/fixes/collective_rpc_refusals.py` (the HTTP route
`POST /collective_rpc`, `AsyncLLM`) and `collective_rpc_refusals_sync` (`LLM`) ask
`rpc_problem` and refuse the call with HTTP 400 / a `ValueError` naming the parameter.

A call by name is refused when its method is no string, names a private attribute
(`__init__` would re-run the worker's constructor), names nothing the worker has (its
wrapper's and its own class's attributes, its extension's), or names an attribute
that is not a method; when `args` is no list, `kwargs` no object of names, `timeout`
no positive number of seconds; or when the arguments do not bind to the method's own
signature; or, on an engine without a weight-transfer backend, when it names one of
the worker's weight-transfer methods (`WEIGHT_TRANSFER_METHODS`: the worker would
raise "Weight transfer not configured"). A call with a callable (in-process `LLM`
callers) is left alone.
"""

from __future__ import annotations

import inspect
import math

from vllm_sampling_mask.http.rl_route_bodies import NO_BACKEND

__all__ = ["rpc_problem", "WEIGHT_TRANSFER_METHODS"]

_MISSING = object()
# the worker methods that need `--weight-transfer-config` (the routes of the same
# names are checked by `rl_route_bodies`)
WEIGHT_TRANSFER_METHODS = frozenset({
    "init_weight_transfer_engine", "start_weight_update", "start_draft_weight_update",
    "update_weights", "finish_weight_update"})


def _attribute(classes, method: str):
    for cls in classes:
        found = getattr(cls, method, _MISSING)
        if found is not _MISSING:
            return cls, found
    return None, _MISSING


def _backend_problem(method: str, weight_transfer: bool) -> tuple[str, str] | None:
    if weight_transfer or method not in WEIGHT_TRANSFER_METHODS:
        return None
    return "weight_transfer_config", NO_BACKEND.format(path=f"collective_rpc {method!r}")


def rpc_problem(method, args, kwargs, timeout, classes=None,
                weight_transfer: bool = True) -> tuple[str, str] | None:
    """(the parameter, what is wrong and the fix) for a call that cannot run, or
    None. `classes`: where the worker's methods are looked up, in order (None: the
    method and its arguments are not checked against them); `weight_transfer`:
    whether the engine has a weight-transfer backend."""
    if callable(method) or isinstance(method, bytes):
        return None
    if not isinstance(method, str) or not method:
        return "method", (f"method must be the name of a worker method (a string), "
                          f"not {method!r}")
    if method.startswith("_"):
        return "method", (f"method {method!r} is private: collective_rpc calls the "
                          "worker's public methods")
    if not isinstance(args, (tuple, list)):
        return "args", f"args must be a list of arguments, not {type(args).__name__}"
    if kwargs is not None and (not isinstance(kwargs, dict) or
                               not all(isinstance(k, str) for k in kwargs)):
        return "kwargs", ("kwargs must be an object of argument names, not "
                          f"{type(kwargs).__name__}")
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float)) or
                                not math.isfinite(timeout) or timeout <= 0):
        return "timeout", f"timeout must be a positive number of seconds, not {timeout!r}"
    if not classes:
        return _backend_problem(method, weight_transfer)
    owner, found = _attribute(classes, method)
    if found is _MISSING:
        return "method", (f"the worker has no method {method!r}: check its name "
                          "(reload_weights, ...)")
    if not callable(found):
        return "method", f"{method!r} is an attribute of the worker, not a method"
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):
        return _backend_problem(method, weight_transfer)
    static = inspect.getattr_static(owner, method, None)
    bound = () if isinstance(static, (staticmethod, classmethod)) or \
        inspect.ismethod(found) else (None,)
    try:
        signature.bind(*bound, *args, **(kwargs or {}))
    except TypeError as e:
        return ("args" if not kwargs else "kwargs"), f"{method}: {e}"
    return _backend_problem(method, weight_transfer)
