"""A reload the worker refused leaves one log line per process, not tracebacks.

What it adds, on the import of `vllm/v1/executor/abstract.py` (the engine core and each
multiprocessing worker import it):

- a `logging.Filter` on the loggers of `multiproc_executor` and `engine/core`: a record
  whose exception carries the overlay's reload refusal (`WeightsRefusedError`) loses its
  traceback and reads `collective_rpc refused in <process>: <the refusal's line>` at
  INFO; every other record is left alone.

Why: the caller gets a clean refusal, yet the processes logged 60 lines of tracebacks
for an expected refusal of the caller's input.
"""

from __future__ import annotations

import logging

from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.weights_check import refusal_in

# logger name -> the process it logs for
LOGGERS = {"vllm.v1.executor.multiproc_executor": "the worker",
           "vllm.v1.engine.core": "the engine core"}


class OneLineReloadRefusals(logging.Filter):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    # The worker logged two copies (`logger.exception` in WorkerProc's RPC loop and the
    # traceback it adds to the exception as a note), the engine core a third
    # (`_invoke_utility_method`), where it arrives as the executor's `RuntimeError` with
    # the refusal in its text. A reload undone part-way is no refusal: left alone.
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        line = refusal_in(str(exc)) if exc is not None else None

        if line is not None:
            record.msg, record.args = f"collective_rpc refused in {self.where}: {line}", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def apply(module, release: Release) -> None:
    for name, where in LOGGERS.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, OneLineReloadRefusals) for f in log.filters):
            log.addFilter(OneLineReloadRefusals(where))
