"""`LLM.collective_rpc`: a call that cannot run, or a refused weight reload, raises a
ValueError naming the parameter.

What it wraps: `LLMEngine.collective_rpc` (vllm/v1/engine/llm_engine.py;
`LLM.collective_rpc` calls it), as `collective_rpc_refusals` wraps the API server's:

- a call by name that cannot run is refused before it reaches the workers;
- a worker's `WeightsRefusedError` / `WeightsRestoredError` is raised again as itself,
  with its own line; every other failure and every success are left as they were.

Why: the caller got a plain `Exception("Call to collective_rpc method failed: ...")`: no
class to catch a bad checkpoint by, and the executor's wording around the cause.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.patches.frontend.fixes.collective_rpc_refusals import refused, translated
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    @wraps(module, "LLMEngine.collective_rpc")
    def collective_rpc(wrapped, self, args, kwargs):
        refusal = refused(self, args, kwargs, wrapped)
        if refusal is not None:
            raise refusal
        try:
            return wrapped(*args, **kwargs)
        except Exception as exc:
            # as text inside a plain `Exception` when the engine core runs in its own
            # process (`LLM`'s default)
            known = translated(exc, client=False)

            if known is None or known is exc:
                raise
            raise known from None
