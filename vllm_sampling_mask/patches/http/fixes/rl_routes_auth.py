"""`--api-key` guards the routes that change the server, not only `/v1/*`.

What it wraps: `AuthenticationMiddleware.__call__` (the middleware `vllm serve` adds with
`--api-key` or `VLLM_API_KEY`; the release's `auth` role):

- a request to a path `rl_routes.guarded` names (pause / resume, cache resets, weight
  updates, `/collective_rpc`, sleep, the profiler, ...) without a valid key gets
  upstream's own 401; every other path goes on to upstream's check unchanged.

Why: upstream guards only `/v1`, `/v2`, `/inference` (and `/cohere`): on a dev-mode
server anyone reaching the port could pause rollouts or reload weights, key or not.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.http.rl_routes import guarded


def apply(module, release: Release) -> None:
    from starlette.datastructures import Headers
    from starlette.responses import JSONResponse

    @wraps(module, "AuthenticationMiddleware.__call__")
    def call(wrapped, self, args, kwargs):
        scope = argument(wrapped, args, kwargs, "scope")
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            # the middleware's own `verify_token`, and upstream's answer to an
            # unauthenticated `/v1/*` request; without a key upstream adds no middleware
            if guarded(path) and not self.verify_token(Headers(scope=scope)):

                refused = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
                return refused(scope, argument(wrapped, args, kwargs, "receive"),
                               argument(wrapped, args, kwargs, "send"))
        return wrapped(*args, **kwargs)
