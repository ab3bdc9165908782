"""`POST /inference/v1/generate` served whenever the mask is on (vLLM 0.30 on).

What: in `vllm/entrypoints/scale_out/factories.py`, wraps
    `register_scale_out_api_routers`: when the server runs with
    `--return-sampling-mask` and upstream left its scale-out endpoints off (no
    `--enable-scale-out`, no `--tokens-only`: 0.30-0.31 register nothing, 0.32
    stubs that answer 403 "Scale-out endpoints are disabled"), the
    token-in/token-out router's real routes (`/inference/v1/generate`,
    `/inference/v1/abort_requests`) are served, in place of any stubs. The render
    and derender endpoints stay behind `--enable-scale-out`, as upstream has them.
Why: up to 0.29 the generate route is always served, and it is how RL trainers
    read masks; the same `vllm serve ... --return-sampling-mask` line must serve it
    on every release (README), without switching on unrelated endpoints.
Upstream: vLLM 0.30 on gates the route with `--enable-scale-out`
    (`entrypoints/scale_out/factories.py`).
"""

from __future__ import annotations

import importlib
import logging

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release

logger = logging.getLogger("vllm.sampling_mask")


def apply(module, release: Release) -> None:
    @wraps(module, "register_scale_out_api_routers")
    def register_scale_out_api_routers(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        app = argument(wrapped, args, kwargs, "app")
        tasks = argument(wrapped, args, kwargs, "supported_tasks")
        cli = getattr(app.state, "args", None)
        if ("generate" not in tasks or not getattr(cli, "return_sampling_mask", False)
                or getattr(cli, "enable_scale_out", False)
                or getattr(cli, "tokens_only", False)):
            return result   # served already, or not asked for
        api_router = importlib.import_module(release.module("generate_router"))

        paths = {route.path for route in api_router.router.routes}
        app.router.routes[:] = [r for r in app.router.routes
                                if getattr(r, "path", None) not in paths]
        app.include_router(api_router.router)
        logger.info("Sampling masks on: serving %s (the other scale-out endpoints stay "
                    "behind --enable-scale-out).", ", ".join(sorted(paths)))
        return result
