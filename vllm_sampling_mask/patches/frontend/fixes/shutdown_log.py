"""A shutdown the operator asked for ends the server log without a traceback.

What: wraps `AsyncLLM.shutdown` (vllm/v1/engine/async_llm.py) to count the
    shutdowns in progress in this process, and adds a `logging.Filter` to that
    module's logger: while a shutdown is in progress, the output handler's
    `logger.exception("AsyncLLM output_handler failed.")` for an
    `EngineDeadError` becomes one INFO line (`[shutdown] AsyncLLM: output
    handler stopped with the engine core (EngineDeadError)`). Outside a
    shutdown, the record is left alone: an engine core that dies on its own
    still logs its traceback.
Why: on SIGTERM (Ctrl-C, the demo's `terminate()`), upstream stops the engine
    core, its output handler's next read raises `EngineDeadError`, and the log
    ends in a 7-line traceback "EngineCore encountered an issue. See stack trace
    (above) for the root cause." although nothing went wrong.
Upstream: `AsyncLLM.shutdown`, and `output_handler` in `AsyncLLM._run_output_handler`.
"""

from __future__ import annotations

import logging
import threading

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release

_lock = threading.Lock()
_in_progress = [0]   # AsyncLLM.shutdown calls running in this process


def shutting_down() -> bool:
    return _in_progress[0] > 0


class QuietShutdown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EngineDeadError) and shutting_down():
            record.msg, record.args = ("[shutdown] AsyncLLM: output handler stopped with "
                                       "the engine core (EngineDeadError)"), ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def apply(module, release: Release) -> None:
    logging.getLogger(module.__name__).addFilter(QuietShutdown())

    @wraps(module, "AsyncLLM.shutdown")
    def shutdown(wrapped, self, args, kwargs):
        with _lock:
            _in_progress[0] += 1
        try:
            return wrapped(*args, **kwargs)
        finally:
            with _lock:
                _in_progress[0] -= 1
