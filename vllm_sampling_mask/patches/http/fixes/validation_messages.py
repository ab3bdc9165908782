"""HTTP 400s for a request body the schema refuses: one sentence naming the parameter.

What: in `vllm/entrypoints/openai/api_server.py` (0.27.1; imported there from
    `vllm/entrypoints/serve/utils/server_utils.py`, `build_app` registers it) or
    `vllm/entrypoints/serve/exception_handling/register.py` (0.32.0, where
    `init_exception_handler` registers it), replaces the name
    `validation_exception_handler` (FastAPI's `RequestValidationError` handler)
    with a handler that calls upstream's and
    rewrites its answer's `error.message` and `error.param` with
    `error_sentences.describe(exc.errors())`: e.g. `return_sampling_mask must be true,
    false or null, not 'yes'.` with param `return_sampling_mask`, and, for a body
    that is no JSON, `The request body is not valid JSON (...)` with param
    `body`. Status, type and code stay upstream's (400); the refusal logs one
    line (`Request refused in <path>: the body (<param>): <message>`). Whether a top-level
    field also takes null is read from the route's declared body model.
Why: upstream's message is `"1 validation error:\n  {'type': 'bool_type', ...}"`
    (Python reprs of pydantic's error dicts) and its `param` for malformed JSON
    is a character offset (`body.62`): nothing a person reads at a glance. The
    three routes (`/inference/v1/generate`, `/v1/completions`,
    `/v1/chat/completions`) share this handler.
Upstream: `validation_exception_handler` in vllm/entrypoints/serve/utils/server_utils.py.
"""

from __future__ import annotations

import functools
import json
import logging
import types
import typing

from vllm_sampling_mask.formats.error_sentences import describe
from vllm_sampling_mask.releases import Release

logger = logging.getLogger("vllm_sampling_mask.validation_messages")
NAME = "validation_exception_handler"


def body_model(request):
    """The pydantic model the route declares for its body, or None."""
    route = request.scope.get("route")
    for param in getattr(getattr(route, "dependant", None), "body_params", None) or ():
        annotation = getattr(getattr(param, "field_info", None), "annotation", None)
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            return annotation
    return None


def takes_null(model, loc) -> bool | None:
    """Whether the top-level field `loc` names (`('body', name)`, pydantic's markers
    left out) takes null; None when unknown (a nested field, no model)."""
    names = [p for p in loc if isinstance(p, str) and p != "body"]
    if model is None or len(loc) != 2 or not names or names[0] not in model.model_fields:
        return None
    annotation = model.model_fields[names[0]].annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    return annotation is type(None)


def apply(module, release: Release) -> None:
    from fastapi.responses import JSONResponse

    original = getattr(module, NAME)

    @functools.wraps(original)
    async def validation_exception_handler(request, exc):
        response = await original(request, exc)
        try:
            model = body_model(request)
            param, message = describe(exc.errors(), lambda loc: takes_null(model, loc))
            body = json.loads(response.body)
            body["error"]["message"] = message
            body["error"]["param"] = param
            # one line per refused request, as for the routes' own refusals
            logging.getLogger("vllm.sampling_mask").info(
                "Request refused in %s: the body (%s): %s", request.url.path, param,
                message)
        except Exception:  # the answer stays a 400, with upstream's wording
            logger.warning("could not word a validation error", exc_info=True)
            return response
        return JSONResponse(body, status_code=response.status_code)

    setattr(module, NAME, validation_exception_handler)
