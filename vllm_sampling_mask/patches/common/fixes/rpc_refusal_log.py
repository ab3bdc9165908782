"""A reload the worker refused leaves one log line per process, not tracebacks.

What: on the import of `vllm/v1/executor/abstract.py` (imported by the engine
    core, to build its executor, and by each multiprocessing worker, through
    `multiproc_executor`), adds a `logging.Filter` to the loggers of
    `vllm/v1/executor/multiproc_executor.py` (the worker's "WorkerProc hit an
    exception.") and `vllm/v1/engine/core.py` (the engine core's "Invocation of
    collective_rpc method failed"). A record whose exception carries the overlay's
    reload refusal (`WeightsRefusedError`, raised by `reload_weights_recovery`
    before any weight was touched; in the engine core it arrives as the
    executor's `RuntimeError` with the refusal in its text:
    `weights_check.refusal_in`) loses its traceback and reads `collective_rpc
    refused in <process>: <the refusal's line>` at INFO. Every other record (a
    reload undone part-way, any other failure) is left alone.
Why: the caller gets a clean HTTP 400 (`collective_rpc_refusals`) or a
    `WeightsRefusedError` (`LLM`) for a checkpoint that failed a check, yet the
    worker logged two copies of its traceback (`logger.exception` and the
    traceback it adds to the exception as a note) and the engine core a third, 60
    lines for an expected refusal of the caller's input.
Upstream: `logger.exception(...)` in `WorkerProc`'s RPC loop and
    `EngineCoreProc._invoke_utility_method`.
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
