"""A refused weight reload is the caller's error: HTTP 400 with its one line.

What: wraps `AsyncLLM.collective_rpc` (vllm/v1/engine/async_llm.py; the route
    `POST /collective_rpc` and `AsyncLLM` callers; `reload_refusals_sync` does the
    same for `LLM`). A worker's
    `WeightsRefusedError` (`reload_weights_recovery`: the checkpoint failed a check,
    nothing was loaded) reaches the API process as text inside a plain
    `Exception("Call to collective_rpc method failed: ...")` (the engine core's
    utility failure, the executor's "Worker failed with error ..."); its own line is
    raised again as the release's validation error (`VLLMValidationError`,
    `parameter="weights_path"`), which the app answers with HTTP 400. A reload that failed
    part-way and was undone (`WeightsRestoredError`) is raised as that error with its
    line alone (HTTP 500 without the worker's text). Every other failure, and every
    success, is left as it was.
Why: upstream's route has no error handling of its own: any worker exception
    becomes a plain `Exception`, which the app's catch-all handler answers with
    HTTP 500 and the whole wrapped text (a nonexistent path as a 500 with a worker
    traceback), although the request, not the server, is at fault.
Upstream: none known; would file "/collective_rpc answers every worker exception
    with 500 (caller errors included); the worker's error type is lost as text".
Remove when: upstream's utility calls carry the worker's exception class across
    processes and the route answers client errors with 4xx.
"""

from __future__ import annotations

from vllm_sampling_mask.errors import WeightsRefusedError, WeightsRestoredError
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.weights_check import failure_in, refusal_in


def _reason(line: str, mark: str) -> str:
    return line[len(mark):]


def translated(exc: Exception, client: bool) -> Exception | None:
    """The overlay's reload error that `exc` carries (as itself or as text), as the
    API raises it: a validation error for the HTTP app (`client`), the overlay's
    own class for `LLM`; None when it carries none."""
    text = str(exc)
    refusal = refusal_in(text)
    if refusal is not None:
        if client:
            from vllm.exceptions import VLLMValidationError
            return VLLMValidationError(refusal, parameter="weights_path")
        return exc if isinstance(exc, WeightsRefusedError) else \
            WeightsRefusedError(_reason(refusal, WeightsRefusedError.MARK))
    failure = failure_in(text)
    if failure is not None:
        if isinstance(exc, WeightsRestoredError):
            return exc
        restored = WeightsRestoredError(RuntimeError())
        restored.args = (failure,)
        return restored
    return None


def apply(module, release: Release) -> None:
    @wraps(module, "AsyncLLM.collective_rpc")
    async def collective_rpc(wrapped, self, args, kwargs):
        try:
            return await wrapped(*args, **kwargs)
        except Exception as exc:
            known = translated(exc, client=True)
            if known is None or known is exc:
                raise
            raise known from None
