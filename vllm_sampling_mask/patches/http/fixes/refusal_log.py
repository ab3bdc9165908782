"""A refused request leaves one log line, not a traceback.

What: on the API server's import (`vllm/entrypoints/openai/api_server.py`; on 0.32
    `vllm/entrypoints/launchers/app.py`), adds a
    `logging.Filter` to the loggers of the three routes' serving
    modules (`vllm/entrypoints/openai/completion/serving.py`,
    `.../chat_completion/serving.py`,
    the generate route's, `release.module("generate_serving")`). A record
    carrying an exception that is a client error (`release.client_error`:
    `vllm.exceptions.VLLMClientError`, on 0.24 `VLLMValidationError`:
    the input processor's checks, the mask's request checks) loses its traceback
    and reads `Request refused in <where>: <Error> (<parameter>): <message>`
    (`error_sentences.refusal_line`). Every other record, server errors included, is
    left alone.
Why: a refused *streamed* request reaches upstream's stream generators, whose
    `except Exception: logger.exception("Error in completion stream generator.")`
    logs a 29-line traceback for what the client gets as a clean HTTP 400 (the
    route patches open the stream on its first event). Refusals are expected
    traffic; a traceback says "bug".
Upstream: `logger.exception(...)` in `completion_stream_generator`,
    `chat_completion_stream_generator` and the generate route's stream generator.
"""

from __future__ import annotations

import logging

from vllm_sampling_mask.formats.error_sentences import refusal_line
from vllm_sampling_mask.patches.http._refusals import client_error_class
from vllm_sampling_mask.releases import Release

# the completion and chat routes' serving modules; the generate route's is the
# release's (`generate_serving`)
LOGGERS = ("vllm.entrypoints.openai.completion.serving",
           "vllm.entrypoints.openai.chat_completion.serving")


class OneLineRefusals(logging.Filter):
    def __init__(self, client_error: type) -> None:
        super().__init__()
        self.client_error = client_error   # the release's class of client errors

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, self.client_error):
            where = str(record.getMessage()).rstrip(".").removeprefix("Error in ")
            record.msg, record.args = refusal_line(exc, where), ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def apply(module, release: Release) -> None:
    # applied on the API server's import: the serving modules' loggers (vLLM's
    # `init_logger(__name__)`) are the same objects whenever they are imported
    for name in (*LOGGERS, release.module("generate_serving")):
        log = logging.getLogger(name)
        if not any(isinstance(f, OneLineRefusals) for f in log.filters):
            log.addFilter(OneLineRefusals(client_error_class(release)))
