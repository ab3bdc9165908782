"""`GET /debug/sampling_mask/state`: how much per-request state the server holds.

What: in `vllm/entrypoints/openai/api_server.py` (0.27.1; `vllm/entrypoints/launchers/app.py`
    on 0.32, where `vllm serve` builds its app), wraps `build_app` to add,
    only when `VLLM_SAMPLING_MASK_DEBUG_STATE=1` is set in the server's
    environment, the route `GET /debug/sampling_mask/state` (no route, and no
    change at all, without it). The route answers JSON counts:
    `api_server.output_processor` (`request_states`, `parent_requests`, and the
    fork's `sampling_mask_accumulators`: request states holding a
    `MaskAccumulator`, the `output_processor` patch's declared
    `RequestState.sampling_masks`), and `engine_core` (the engine-core
    process's scheduler, KV-cache block tables and each worker's runner state,
    from the utility method the `debug_state_core` patch sets on `EngineCore`,
    called with upstream's `call_utility_async`); `total` is the sum of every
    count (0 when nothing is left behind).
Why: a soak test (`scripts/soak.py`, `tests/server/test_soak.py`) checks that finished
    and aborted requests, streamed or not, with masks or not, leave nothing
    behind in any process.
"""

from __future__ import annotations

import os

from fastapi import Request

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.patches.engine.diagnostics.debug_state_core import METHOD, WORK, enabled
from vllm_sampling_mask.releases import Release

PATH = "/debug/sampling_mask/state"


def output_processor_state(processor) -> dict:
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
