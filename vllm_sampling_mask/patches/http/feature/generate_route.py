"""`POST /inference/v1/generate` served whenever the mask is on (vLLM 0.30 on).

What it wraps, in `vllm/entrypoints/scale_out/factories.py`:

- `register_scale_out_api_routers`: with `--return-sampling-mask` and the scale-out
  endpoints off, serves the token-in/token-out router's real routes (generate and its
  abort), in place of any stubs; render and derender stay behind `--enable-scale-out`.

Why: it is how RL trainers read masks, and the same `vllm serve ...
--return-sampling-mask` line must serve it on every release.
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
        # no `--enable-scale-out` or `--tokens-only`: 0.30-0.31 register nothing, 0.32
        # stubs that answer 403 "Scale-out endpoints are disabled" (up to 0.29 the route
        # is always served)

        api_router = importlib.import_module(release.module("generate_router"))

        paths = {route.path for route in api_router.router.routes}
        app.router.routes[:] = [r for r in app.router.routes
                                if getattr(r, "path", None) not in paths]
        app.include_router(api_router.router)
        logger.info("Sampling masks on: serving %s (the other scale-out endpoints stay "
                    "behind --enable-scale-out).", ", ".join(sorted(paths)))
        return result
