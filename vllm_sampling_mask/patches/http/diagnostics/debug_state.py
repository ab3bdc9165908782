"""`GET /debug/sampling_mask/state`: how much per-request state the server holds.

What it wraps, in the module `vllm serve` builds its app in (`openai/api_server.py`;
`launchers/app.py` on 0.32), only with `VLLM_SAMPLING_MASK_DEBUG_STATE=1` in the server's
environment (without it nothing changes):

- `build_app`: adds the route, which answers JSON counts of the output processor's
  state and the engine core's (`debug_state_core`), and their `total` (0 when nothing
  is left behind).

Why: a soak test checks that finished and aborted requests leave nothing behind in any
process.
"""

from __future__ import annotations

import os

from fastapi import Request

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.patches.engine.diagnostics.debug_state_core import METHOD, WORK, enabled
from vllm_sampling_mask.releases import Release

PATH = "/debug/sampling_mask/state"


def output_processor_state(processor) -> dict:
    # `sampling_mask_accumulators`: request states holding a `MaskAccumulator`
    # (`RequestState.sampling_masks`, declared by the `output_processor` patch)
    states = processor.request_states
    return {"request_states": len(states),
            "parent_requests": len(processor.parent_requests),
            "sampling_mask_accumulators": sum(
                1 for s in states.values() if s.sampling_masks is not None)}


def total(counts) -> int:
    """The sum of every integer count in a nested dict/list (names and the
    workers' work counters excluded)."""
    if isinstance(counts, dict):
        return sum(total(v) for k, v in counts.items() if k != WORK)
    if isinstance(counts, list):
        return sum(total(v) for v in counts)
    return counts if isinstance(counts, int) and not isinstance(counts, bool) else 0


async def state(request: Request) -> dict:
    """The route: counts from this process and from the engine core."""
    engine = request.app.state.engine_client
    counts = {
        # which API server answered (a string: `total` counts integers only)
        "api_server": {"process": f"pid {os.getpid()}",
                       "output_processor": output_processor_state(engine.output_processor)},
        # the utility method `debug_state_core` sets on `EngineCore`
        "engine_core": await engine.engine_core.call_utility_async(METHOD),

    }
    return {**counts, "total": total(counts)}


def register(app) -> bool:
    """Add the route to a FastAPI `app` if the variable is set; True if added."""
    if not enabled():
        return False

    async def sampling_mask_debug_state(request: Request) -> dict:
        return await state(request)

    app.add_api_route(PATH, sampling_mask_debug_state, methods=["GET"],
                      include_in_schema=False)
    return True


def apply(module, release: Release) -> None:
    @wraps(module, "build_app")
    def build_app(wrapped, instance, args, kwargs):
        app = wrapped(*args, **kwargs)
        register(app)
        return app
