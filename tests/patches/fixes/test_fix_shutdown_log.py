"""The fix `shutdown_log`: a shutdown asked for logs no EngineDeadError traceback. No
engine."""

from __future__ import annotations

import logging

import pytest

from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_a_shutdown_asked_for_logs_no_engine_dead_traceback(caplog):
    """The `shutdown_log` patch: while `AsyncLLM.shutdown` runs, the output handler's
    EngineDeadError is one INFO line; outside a shutdown it keeps its traceback."""
    patching.apply_all()
    from vllm.v1.engine.exceptions import EngineDeadError

    from vllm_sampling_mask.patches.frontend.fixes import shutdown_log
    log = logging.getLogger("vllm.v1.engine.async_llm")

    def handler_fails():
        try:
            raise EngineDeadError()
        except EngineDeadError:
            log.exception("AsyncLLM output_handler failed.")

    with caplog.at_level(logging.INFO, logger=log.name):
        shutdown_log._in_progress[0] += 1
        try:
            handler_fails()
        finally:
            shutdown_log._in_progress[0] -= 1
        handler_fails()
    quiet, loud = caplog.records[-2:]
    assert quiet.exc_info is None and quiet.levelname == "INFO"
    assert quiet.getMessage().startswith("[shutdown] AsyncLLM: output handler stopped")
    assert loud.exc_info is not None and loud.levelname == "ERROR"
