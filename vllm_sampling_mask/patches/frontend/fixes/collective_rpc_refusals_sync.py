"""`LLM.collective_rpc`: a call that cannot run, or a refused weight reload, raises a
ValueError naming the parameter.

What: wraps `LLMEngine.collective_rpc` (vllm/v1/engine/llm_engine.py; `LLM.collective_rpc`
    calls it). A call by name that cannot run is refused before it reaches the
    workers, as `collective_rpc_refusals` refuses it (`VLLMValidationError`, a
    `ValueError`). A worker's `WeightsRefusedError` (`reload_weights_recovery`), which
    reaches this process as text inside a plain `Exception` when the engine core runs
    in its own process (`LLM`'s default), is raised again as `WeightsRefusedError` (a
    `ValueError`) with its own line; a reload undone part-way as `WeightsRestoredError`
    with its line. Every other failure, and every success, is left as it was
    (`collective_rpc_refusals.translated`, as the API server's twin reads them).
Why: the caller gets `Exception("Call to collective_rpc method failed: Worker failed
    with error '...', please check the stack trace above for the root cause")`: no
    class to catch a bad checkpoint by, and the executor's wording around the cause.
Upstream: none known; would file "collective_rpc: a worker's exception reaches the
    caller as a plain Exception with its text wrapped twice".
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
            known = translated(exc, client=False)
            if known is None or known is exc:
                raise
            raise known from None
