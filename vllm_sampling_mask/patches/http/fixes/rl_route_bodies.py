"""The RL routes' bad bodies and missing weight-transfer backend are HTTP 400s.

What it replaces, on the import of vLLM's RL router module (the release's `rl_router`
role), in its router before `build_app` includes it:

- the endpoints of `/abort_requests` and the weight-transfer routes: a bad body, or a
  weight-transfer route without `--weight-transfer-config`, is refused with the release's
  validation error naming the parameter (HTTP 400); the rest goes to upstream's endpoint.

`abort_request_ids` does the same for the token-in/token-out abort routes.
Why: upstream answered these with HTTP 500s (or a 200 that ignored unknown fields).
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.http.rl_route_bodies import (ABORT_PATHS, NO_BACKEND,
                                                WEIGHT_TRANSFER_PATHS, body_problem)

_CHECKED = "_sampling_mask_body_checked"


def _refusal(path: str, parameter: str, message: str) -> Exception:
    from vllm.exceptions import VLLMValidationError
    return VLLMValidationError(f"{path} refused ({parameter}): {message}",
                               parameter=parameter)


def _no_backend(request) -> bool:
    engine = getattr(request.app.state, "engine_client", None)
    config = getattr(engine, "vllm_config", None)
    return config is not None and getattr(config, "weight_transfer_config", 0) is None


def checked(original, path: str, release: Release):
    """`original` behind the body (and backend) checks of `path`."""
    if getattr(original, _CHECKED, False):
        return original

    # Upstream passed any `request_ids` to `AsyncLLM.abort` (a number: "'int' object is not
    # iterable"; a body that is no object, before 0.32: "'list' object has no attribute
    # 'get'"); without a backend every weight-transfer route reached the worker ("Weight
    # transfer not configured", a traceback in two processes); `/start_weight_update
    # {"bogus": 1}` answered 200.
    @functools.wraps(original)
    async def endpoint(*args, **kwargs):
        request = kwargs["raw_request"] if "raw_request" in kwargs else args[0]
        # a body that is no JSON object, `request_ids` neither a string nor a list of
        # strings, a field the route does not read on this release
        problem = body_problem(path, await request.body(), release)
        if problem is None and path in WEIGHT_TRANSFER_PATHS and _no_backend(request):
            problem = "weight_transfer_config", NO_BACKEND.format(path=path)
        if problem is not None:   # before any worker is called
            raise _refusal(path, *problem)
        return await original(*args, **kwargs)   # it reads the body again from the cache


    setattr(endpoint, _CHECKED, True)
    return endpoint


def check_routes(router, paths, release: Release) -> None:
    """Put the checks before each route of `router` whose path is in `paths`."""
    for route in router.routes:
        path = getattr(route, "path", None)
        if path in paths:
            route.endpoint = checked(route.endpoint, path, release)


def apply(module, release: Release) -> None:
    check_routes(module.router, ABORT_PATHS | WEIGHT_TRANSFER_PATHS, release)
