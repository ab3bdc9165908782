"""HTTP 400s for a request body the schema refuses: one sentence naming the parameter.

What it replaces, in the module that registers FastAPI's `RequestValidationError`
handler (the release's: `openai/api_server.py` on 0.27.1, `serve/exception_handling/
register.py` on 0.32.0):

- `validation_exception_handler`: upstream's, its answer's `error.message` and
  `error.param` reworded by `error_sentences.describe` (e.g. `return_sampling_mask must
  be true, false or null, not 'yes'.`); status, type and code stay upstream's.

The three routes share this handler.
Why: upstream's message is Python reprs of pydantic's error dicts, and its `param` for
malformed JSON a character offset (`body.62`).
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
            # whether a top-level field also takes null: from the route's declared body
            # model; a body that is no JSON gets param `body`
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
