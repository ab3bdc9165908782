"""A refused request leaves one log line, not a traceback.

What it adds, on the API server's import (`openai/api_server.py`; on 0.32
`launchers/app.py`):

- a `logging.Filter` on the three routes' serving modules' loggers: a record carrying a
  client error (`release.client_error`) loses its traceback and reads `Request refused
  in <where>: <Error> (<parameter>): <message>`; every other record is left alone.

Why: upstream's stream generators log a 29-line traceback for what the client gets as
a clean HTTP 400; refusals are expected traffic, and a traceback says "bug".
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

    # A refused streamed request reaches upstream's `except Exception:
    # logger.exception("Error in completion stream generator.")` (the route patches open
    # the stream on its first event). Client errors: the input processor's checks, the
    # mask's request checks.
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
