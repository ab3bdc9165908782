"""The server routes that change the server or drive an RL loop, which `--api-key`
guards (with the overlay) besides upstream's own prefixes (`/v1`, `/v2`,
`/inference`, `/cohere`).

Plain data, no vLLM import: `patches/http/fixes/rl_routes_auth.py` asks `guarded(path)`
for each request upstream's authentication middleware would let through.

What is guarded: the pause and state routes, the cache resets, the weight-update
and weight-version routes, `/collective_rpc`, sleep / wake-up, the profiler, elastic
expert-parallel scaling and fault-tolerance instructions. What stays open, as
upstream decides: `/health`, `/metrics`, `/ping`, `/ready`, `/readyz`, `/load`,
`/version`, `/server_info`, the tokenizer routes and `/invocations` (upstream's
documented exceptions to its key).
"""

from __future__ import annotations

__all__ = ["GUARDED_PATHS", "GUARDED_PREFIXES", "guarded"]

# exact paths (a route's path as the app declares it; any of them absent from a
# release or a server not in dev mode answers 401 without the key, 404 with it)
GUARDED_PATHS = frozenset({
    # pause / resume and their state (the RL loop's rollout control)
    "/pause", "/resume", "/is_paused", "/abort_requests",
    # cache resets
    "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache",
    # weight updates and versions
    "/collective_rpc", "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine",
    "/start_weight_update", "/start_draft_weight_update", "/update_weights",
    "/finish_weight_update", "/update_weight_version", "/weight_info", "/weight_checker",
    "/get_world_size",
    # sleep mode
    "/sleep", "/wake_up", "/is_sleeping", "/release_kv_cache_memory",
    # the profiler, elastic EP scaling
    "/start_profile", "/stop_profile", "/scale_elastic_ep", "/is_scaling_elastic_ep",
})
GUARDED_PREFIXES = ("/fault_tolerance/",)


def guarded(path: str) -> bool:
    """Whether a request for `path` (the app's own path, root path removed) needs
    the key. A trailing slash is the same route (Starlette redirects it)."""
    if path != "/" and path.endswith("/"):
        path = path.rstrip("/")
    return path in GUARDED_PATHS or path.startswith(GUARDED_PREFIXES)
