"""Every request still pending when the engine client shuts down gets its answer.

What: wraps `AsyncLLM.shutdown` (vllm/v1/engine/async_llm.py). Once upstream's
    shutdown has stopped the engine core (whatever it raised), every request
    still in the output processor is finished on the event loop of the output
    handler, with upstream's own `OutputProcessor.abort_requests(..., internal=
    True)`: its queue gets a final output with `finish_reason: "abort"`, the
    tokens so far and their masks, so its HTTP handler answers at once (a 200,
    or a last chunk and `[DONE]` when streamed). A request arriving afterwards
    already fails fast upstream (`engine_dead` is set: `EngineDeadError`, a
    500). The output handler may see the engine core die first (its read raises
    `EngineDeadError`, which upstream hands every pending request as a 500):
    the wrapper marks the output processor (declared
    `OutputProcessor.shutting_down`, False) before upstream's shutdown starts,
    and a wrapped `OutputProcessor.propagate_error` answers the pending
    requests with the same abort outputs instead when it is an
    `EngineDeadError` during that shutdown (any other error, or one outside a
    shutdown, propagates as upstream's). `AsyncLLM.output_handler` is declared
    (None) on the class, so a shutdown from `__del__` of a half-built client
    finds nothing to do.
    Shutdown only: no per-request cost. Applies with the mask flag on or off.
Why: on SIGTERM the API server (`launcher.serve_http`) shuts the engine client
    down before uvicorn, and requests are answered only by outputs from the
    engine core. With `--shutdown-timeout 0` an engine core busy in a step is
    SIGKILLed before it sends its abort outputs; with a timeout, a request
    reaching the API server after the engine core finished draining is sent
    to a core that no longer reads. `AsyncLLM.shutdown` then cancels its
    output handler without failing those requests, so their clients were never
    answered, and uvicorn (no graceful-shutdown timeout) kept the process
    alive until every such client gave up (found by tests/server/test_faults.py).
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def answer_pending(output_processor) -> None:
    """Finish every request the output processor still holds with an abort output
    (runs on the output handler's event loop)."""
    output_processor.abort_requests(list(output_processor.request_states), internal=True)


def apply(module, release: Release) -> None:
    from vllm.utils.async_utils import run_in_loop
    from vllm.v1.engine import output_processor as op
    from vllm.v1.engine.exceptions import EngineDeadError

    module.AsyncLLM.output_handler = None
    op.OutputProcessor.shutting_down = False

    @wraps(op, "OutputProcessor.propagate_error")
    def propagate_error(wrapped, self, args, kwargs):
        if self.shutting_down and isinstance(argument(wrapped, args, kwargs, "e"),
                                             EngineDeadError):
            return answer_pending(self)
        return wrapped(*args, **kwargs)

    @wraps(module, "AsyncLLM.shutdown")
    def shutdown(wrapped, self, args, kwargs):
        processor = getattr(self, "output_processor", None)   # a half-built client has none
        if processor is not None:
            processor.shutting_down = True
        try:
            return wrapped(*args, **kwargs)
        finally:
            # set together with output_processor, once a request or the loop started it
            if self.output_handler is not None:
                run_in_loop(self.output_handler.get_loop(), answer_pending,
                            self.output_processor)
