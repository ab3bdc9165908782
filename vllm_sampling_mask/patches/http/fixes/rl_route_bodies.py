"""The RL routes' bad bodies and missing weight-transfer backend are HTTP 400s.

What: on the import of vLLM's RL router module (the release's `rl_router` role:
    `vllm/entrypoints/serve/dev/rlhf/api_router.py` up to 0.31,
    `vllm/entrypoints/rl/online/api_router.py` from 0.32), replaces the endpoints of
    its `/abort_requests` and weight-transfer routes (`/init_weight_transfer_engine`,
    `/start_weight_update`, `/start_draft_weight_update`, `/update_weights`,
    `/finish_weight_update`) in the module's router (before `build_app` includes it;
    `abort_request_ids` does the same for the token-in/token-out abort routes).
    Each new endpoint reads the body first (`rl_route_bodies.body_problem`): a
    body that is not a JSON object, a `request_ids` that is neither a string nor a
    list of strings, or a field the route's endpoint does not read on this release
    is refused with the release's validation error naming the parameter (HTTP 400); a weight-transfer route on a server started
    without `--weight-transfer-config` is refused the same way, naming it, before
    any worker is called. Everything else goes to upstream's endpoint unchanged (it
    reads the body again from the request's cache).
Why: upstream's `/abort_requests` passed any `request_ids` to `AsyncLLM.abort`:
    a number was an HTTP 500 ("'int' object is not iterable"), a body that is not
    an object a 500 before 0.32 ("'list' object has no attribute 'get'");
    without a backend every weight-transfer route reached the worker, which raised
    "Weight transfer not configured" (an HTTP 500 with the worker's wrapped text,
    a traceback in two processes); and `/start_weight_update {"bogus": 1}`
    answered 200 (unknown fields were ignored).
Upstream: none known; would file "RL routes answer bad request_ids and a missing
    weight-transfer backend with 500, and ignore unknown body fields".
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

    @functools.wraps(original)
    async def endpoint(*args, **kwargs):
        request = kwargs["raw_request"] if "raw_request" in kwargs else args[0]
        problem = body_problem(path, await request.body(), release)
        if problem is None and path in WEIGHT_TRANSFER_PATHS and _no_backend(request):
            problem = "weight_transfer_config", NO_BACKEND.format(path=path)
        if problem is not None:
            raise _refusal(path, *problem)
        return await original(*args, **kwargs)

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
