"""`POST /collective_rpc` with a JSON body that is not an object is a 400 (0.24-0.31).

What it replaces, on the import of the dev-mode RPC route's module
(`vllm/entrypoints/serve/dev/rpc/api_router.py`), before `build_app` includes its router:

- the `/collective_rpc` endpoint: a JSON array, string, number or null is answered with
  HTTP 400 "Request body must be a JSON object" (0.32's own answer); anything else goes
  to upstream's endpoint unchanged.

Why: upstream's endpoint called `body.get("method")` on whatever JSON it parsed: an
HTTP 500 for the caller's malformed request.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.releases import Release

PATH = "/collective_rpc"


def apply(module, release: Release) -> None:
    from fastapi import HTTPException

    for route in module.router.routes:
        if getattr(route, "path", None) != PATH:
            continue
        original = route.endpoint

        @functools.wraps(original)
        async def collective_rpc(raw_request, _original=original):
            try:
                body = await raw_request.json()
            except ValueError:
                return await _original(raw_request)     # upstream's JSON-error 400
            if not isinstance(body, dict):
                raise HTTPException(status_code=400,
                                    detail="Request body must be a JSON object")
            return await _original(raw_request)   # it reads the body again from the cache

        route.endpoint = collective_rpc

