"""How the HTTP routes refuse a request that concerns masks.

- a completion the mask path ended (`CompletionOutput.sampling_mask_error`):
  `SamplingMaskGenerationError`, an HTTP 400 carrying the message (an error event in a
  stream), never upstream's 500 "Internal server error";
- `open_stream`: a stream whose first event is an error (the input processor refused
  the request) is answered with that HTTP error instead of a 200;
- `answered`: a request the route refuses without streaming (an error response with a
  4xx code) logs one line, as a refused stream does (`refusal_log`), and an upstream
  refusal without `param` whose message starts with a sampling parameter's name
  ("top_k must be ...") gets that name as its `param` (`sampling_params.top_k` on
  generate).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator

from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.patches._wrap import argument
from vllm_sampling_mask.releases import Release


async def create_with_masks(serving, wrapped, args, kwargs, release: Release):
    """The route's `create_*` entry: a mask error raised while the response was
    built becomes an HTTP 400 carrying its message, and a stream of a request
    that concerns masks (the engine flag on, or the body field set) starts only
    once its first event is not an error."""
    from vllm_sampling_mask.config import serving_mask_enabled

    request = argument(wrapped, args, kwargs, "request")
    error_response = error_response_class(release)
    try:
        result = answered(await refusing(wrapped(*args, **kwargs), wrapped.__name__,
                                         release),
                          wrapped.__name__, error_response)
    except SamplingMaskGenerationError as exc:
        return serving.create_error_response(exc)
    if isinstance(result, AsyncIterator) and (
            serving_mask_enabled(serving)
            or request.return_sampling_mask is not None
            or request.return_sampling_mask_logprobs is not None):
        return await open_stream(result, error_response)
    return result


def raise_mask_errors(completions) -> None:
    for completion in completions:
        if completion.sampling_mask_error is not None:
            raise SamplingMaskGenerationError(completion.sampling_mask_error)


def _event_json(event: str) -> dict | None:
    if not event.startswith("data: {"):
        return None
    return json.loads(event[len("data: "):])


def error_response_class(release: Release) -> type:
    """The release's `ErrorResponse` (its module moved in 0.29)."""
    return importlib.import_module(release.module("error_response")).ErrorResponse


def client_error_class(release: Release) -> type:
    """The release's class of client errors (`release.client_error`: 0.24 has no
    `VLLMClientError`, only `VLLMValidationError`)."""
    return getattr(importlib.import_module("vllm.exceptions"), release.client_error)


async def refusing(call, where: str, release: Release, prefix: str = ""):
    """Await a route's call; a client error it raises (vLLM 0.32 raises refusals to
    the app's exception handlers, 0.27.1 returns them: `answered`) gets its
    `parameter` filled from its message where upstream left it None
    (`error_sentences.param_in_message`, with `prefix`) and logs one line
    (`error_sentences.refusal_line`), then propagates unchanged otherwise."""
    import logging

    from vllm_sampling_mask.formats.error_sentences import param_in_message, refusal_line

    client_error = client_error_class(release)
    try:
        return await call
    except (client_error, *refused_plainly(release)) as exc:
        if isinstance(exc, SamplingMaskGenerationError):
            raise
        named = param_in_message(str(exc.args[0]) if exc.args else "")
        if not isinstance(exc, client_error) and named:
            # a plain ValueError naming a sampling parameter (0.24): the client error
            # it is elsewhere, with that parameter
            from vllm.exceptions import VLLMValidationError

            named_error = VLLMValidationError(str(exc.args[0]), parameter=prefix + named)
            logging.getLogger("vllm.sampling_mask").info(
                "%s", refusal_line(named_error, where))
            raise named_error from exc
        if getattr(exc, "parameter", "") is None and named:
            exc.parameter = prefix + named
        logging.getLogger("vllm.sampling_mask").info("%s", refusal_line(exc, where))
        raise


def refused_plainly(release: Release) -> tuple[type, ...]:
    """What else the routes answer as a refusal, beside the client-error class:
    `ValueError` where upstream refuses a sampling value with a plain one
    (`release.plain_sampling_refusals`)."""
    return (ValueError,) if release.plain_sampling_refusals else ()


def naming_sampling_refusals(cls, data, handler, release: Release):
    """A wrap-validator for `/inference/v1/generate`'s body: upstream's own refusal of
    a sampling parameter, raised while pydantic builds `sampling_params` ("top_k must
    be 0 (disable), or at least 1, got -2.", no parameter), names
    `sampling_params.<name>` (`error_sentences.param_in_message`). (On 0.24 a client error
    is a ValueError, which pydantic turns into a schema error before it gets here:
    `validation_messages` words that one.)"""
    from vllm_sampling_mask.formats.error_sentences import param_in_message

    try:
        return handler(data)
    except client_error_class(release) as exc:
        if getattr(exc, "parameter", "") is None and (named := param_in_message(
                str(exc.args[0]) if exc.args else "")):
            exc.parameter = "sampling_params." + named
        import logging

        from vllm_sampling_mask.formats.error_sentences import refusal_line
        logging.getLogger("vllm.sampling_mask").info(
            "%s", refusal_line(exc, "/inference/v1/generate's body"))
        raise


def answered(result, where: str, ErrorResponse: type, prefix: str = ""):
    """A route's own answer, returned as it is; when it is a refusal (an error
    response with a 4xx code), its `param` filled from its message where upstream
    left it null (`error_sentences.param_in_message`, with `prefix`: `sampling_params.` on
    generate), and one log line saying so, as `refusal_log` words a refused stream."""
    import logging

    from vllm_sampling_mask.formats.error_sentences import param_in_message

    if not isinstance(result, ErrorResponse):
        return result
    error = result.error
    if not 400 <= int(error.code) < 500:
        return result
    if error.param is None and (named := param_in_message(error.message)):
        error.param = prefix + named
    named = f" ({error.param})" if error.param else ""
    logging.getLogger("vllm.sampling_mask").info(
        "Request refused in %s: %s%s: %s", where, error.type, named,
        " ".join(str(error.message).split()))
    return result


async def open_stream(events: AsyncIterator[str], ErrorResponse: type):
    """Pull a stream's first event before the response starts. An error event
    there (the input processor refused the request, or its first step failed)
    becomes the HTTP error response (`ErrorResponse`, the release's class; status =
    its code), as for a request that is not streamed; otherwise the stream goes on
    unchanged."""
    try:
        first = await anext(events)
    except StopAsyncIteration:
        return events
    event = _event_json(first)
    if event is not None and "error" in event and "choices" not in event:
        await events.aclose()
        return ErrorResponse.model_validate(event)
    return _Resumed(first, events)


class _Resumed:
    """`events` with the `first` event, already pulled, in front: every later event
    is `events`' own `__anext__`, with no generator between (one per streamed token
    would cost a frame resumption per chunk)."""

    __slots__ = ("_first", "_events")

    def __init__(self, first: str, events: AsyncIterator[str]) -> None:
        self._first, self._events = first, events

    def __aiter__(self):
        return self

    def __anext__(self):
        if self._first is None:
            return self._events.__anext__()
        first, self._first = self._first, None
        return _now(first)

    def aclose(self):
        return self._events.aclose()


async def _now(value):
    return value
