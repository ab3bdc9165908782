"""`--api-key` guards the routes that change the server, not only `/v1/*`.

What: wraps `AuthenticationMiddleware.__call__` (the middleware `vllm serve` adds
    with `--api-key` or `VLLM_API_KEY`; `vllm/entrypoints/serve/utils/server_utils.py`
    up to 0.28, `vllm/entrypoints/serve/middleware/authenticate.py` from 0.29: the
    release's `auth` role). A request whose path `rl_routes.guarded` names (pause /
    resume / is_paused, the cache resets, the weight-update and weight-version
    routes, `/collective_rpc`, sleep, the profiler, ...) and that carries no valid
    `Authorization: Bearer` key is answered as upstream answers an unauthenticated
    `/v1/*` request (HTTP 401, `{"error": "Unauthorized"}`), by the middleware's
    own `verify_token`. Every other path goes on to upstream's check unchanged
    (`/health`, `/metrics` and the rest stay as upstream decides). Without a key
    upstream adds no middleware and nothing changes.
Why: upstream's middleware guards only the path prefixes `/v1`, `/v2`,
    `/inference` (and `/cohere` from 0.27): on a dev-mode server
    (`VLLM_SERVER_DEV_MODE=1`, which the RL loop needs) anyone who can reach the
    port could pause rollouts, reset caches or run `reload_weights` from a path of
    their choosing, with the key set.
Upstream: none known; would file "--api-key leaves the dev-mode/RL routes
    (/pause, /resume, /collective_rpc, weight updates, cache resets) open".
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
            if guarded(path) and not self.verify_token(Headers(scope=scope)):
                refused = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
                return refused(scope, argument(wrapped, args, kwargs, "receive"),
                               argument(wrapped, args, kwargs, "send"))
        return wrapped(*args, **kwargs)
