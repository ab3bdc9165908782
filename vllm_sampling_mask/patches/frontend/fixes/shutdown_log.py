"""A shutdown the operator asked for ends the server log without a traceback.

What it wraps and adds, in vllm/v1/engine/async_llm.py:

- `AsyncLLM.shutdown`: counts the shutdowns in progress in this process;
- a `logging.Filter` on the module's logger: during a shutdown, the output handler's
  traceback for an `EngineDeadError` becomes one INFO line; outside one, an engine core
  that dies on its own still logs its traceback.

Why: on SIGTERM the log ended in a 7-line traceback ("EngineCore encountered an issue")
although nothing went wrong.
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
    # upstream stops the engine core, and the output handler's next read raises
    # `EngineDeadError`: `logger.exception("AsyncLLM output_handler failed.")`
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
