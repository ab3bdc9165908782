"""The token-in/token-out abort routes refuse a bad `request_ids` with HTTP 400.

What: on the import of the token-in/token-out router module (the release's
    `generate_router` role: `vllm/entrypoints/serve/disagg/api_router.py` on 0.24,
    `vllm/entrypoints/scale_out/token_in_token_out/api_router.py` from 0.27.1),
    puts `rl_route_bodies`' body check before its abort routes' endpoint: from 0.32
    the module-level routes `/inference/v1/abort_requests` (`router`) and
    `/abort_requests` (`abort_router`), replaced on import; up to 0.31 the
    `/abort_requests` route that `attach_router` adds to its router with
    `--tokens-only`, replaced as `attach_router` includes that router (it is handed
    the app behind a proxy whose `include_router` checks the router's abort routes
    first). A body that is not a JSON object, or a `request_ids` that is neither a
    string nor a list of strings, is refused with the release's validation error
    naming the parameter (HTTP 400); everything else goes to upstream's endpoint
    unchanged.
Why: upstream's endpoint calls `body.get("request_ids")` on whatever JSON it
    parsed (a body that is no object: HTTP 500, "'list' object has no attribute
    'get'") and hands any `request_ids` to `AsyncLLM.abort` in a background task: a
    number or a list of numbers answered 200 and failed in that task, nothing
    aborted and the caller never told.
Upstream: none known; would file "/inference/v1/abort_requests answers 200 for a
    request_ids that cannot be aborted, and 500 for a body that is not an object".
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.patches.http.fixes.rl_route_bodies import check_routes
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.http.rl_route_bodies import ABORT_PATHS


class _Including:
    """The app as `attach_router` sees it: each router it includes gets the abort
    routes' checks first."""

    def __init__(self, app, release: Release) -> None:
        self._app, self._release = app, release

    def __getattr__(self, name):
        return getattr(self._app, name)

    def include_router(self, router, *args, **kwargs):
        check_routes(router, ABORT_PATHS, self._release)
        return self._app.include_router(router, *args, **kwargs)


def apply(module, release: Release) -> None:
    for name in ("router", "abort_router"):   # from 0.32, routes of the module
        if hasattr(module, name):
            check_routes(getattr(module, name), ABORT_PATHS, release)

    @wraps(module, "attach_router")
    def attach_router(wrapped, instance, args, kwargs):
        app = argument(wrapped, args, kwargs, "app")
        return wrapped(_Including(app, release))
