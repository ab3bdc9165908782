"""Every request still pending when the engine client shuts down gets its answer.

What it wraps, in vllm/v1/engine/async_llm.py and its output processor:

- `AsyncLLM.shutdown`: once upstream's shutdown stopped the engine core, finishes every
  request still pending with an abort output (its tokens so far and their masks);
- `OutputProcessor.propagate_error`: during that shutdown, an `EngineDeadError` answers
  the pending requests the same way instead of with a 500.

Shutdown only: no per-request cost; with the mask flag on or off.
Why: on SIGTERM upstream cancelled its output handler without answering pending
requests, and uvicorn kept the process alive until every such client gave up.
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

    # declared on the class: a shutdown from `__del__` of a half-built client finds
    # nothing to do
    module.AsyncLLM.output_handler = None
    op.OutputProcessor.shutting_down = False

    # The output handler may see the engine core die first (its read raises
    # `EngineDeadError`, which upstream hands every pending request as a 500). Any other
    # error, or one outside a shutdown, propagates as upstream's.
    @wraps(op, "OutputProcessor.propagate_error")
    def propagate_error(wrapped, self, args, kwargs):
        if self.shutting_down and isinstance(argument(wrapped, args, kwargs, "e"),
                                             EngineDeadError):
            return answer_pending(self)
        return wrapped(*args, **kwargs)

    # `launcher.serve_http` shuts the engine client down before uvicorn, and requests are
    # answered only by outputs from the engine core: with `--shutdown-timeout 0` a core
    # busy in a step is SIGKILLed before it sends its abort outputs; with a timeout, a
    # request arriving after the core drained is sent to a core that no longer reads.
    # A request arriving after this fails fast upstream (`engine_dead`: a 500).
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
                # upstream's own `abort_requests(..., internal=True)`: each queue gets a
                # final output with finish_reason "abort", answered at once (a 200, or a
                # last chunk and [DONE] when streamed)
                run_in_loop(self.output_handler.get_loop(), answer_pending,

                            self.output_processor)
