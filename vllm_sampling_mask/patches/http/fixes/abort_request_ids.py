"""The token-in/token-out abort routes refuse a bad `request_ids` with HTTP 400.

What it replaces and wraps, on the import of the token-in/token-out router module (the
release's `generate_router` role):

- the abort routes' endpoints (from 0.32, `router` and `abort_router`), behind
  `rl_route_bodies`' body check;
- `attach_router` (up to 0.31, whose `--tokens-only` router holds `/abort_requests`):
  the same check on the routers it includes.

A bad body or `request_ids` is refused with the release's validation error naming the
parameter (HTTP 400); everything else goes to upstream's endpoint unchanged.
Why: upstream answered a body that is no object with a 500, and bad `request_ids` with
a 200 that aborted nothing.
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

    # Upstream's endpoint calls `body.get("request_ids")` on whatever JSON it parsed and
    # hands any `request_ids` to `AsyncLLM.abort` in a background task: a number failed
    # in that task, and the caller was never told.
    @wraps(module, "attach_router")
    def attach_router(wrapped, instance, args, kwargs):
        # the app behind a proxy whose `include_router` checks the router's abort routes

        app = argument(wrapped, args, kwargs, "app")
        return wrapped(_Including(app, release))
