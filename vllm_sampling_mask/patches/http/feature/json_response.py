"""A full response's lists masks, written from their arrays as the body is rendered.

What: wraps `starlette.responses.JSONResponse.render` (FastAPI's `JSONResponse`,
    which the three routes return a full response through:
    `JSONResponse(content=generator.model_dump(), ...)`) to render a
    `_full_response.MaskedBody` through its own `render`: upstream's JSON of the body with
    each choice's `MaskLists` null, then each of those nulls replaced by the mask's
    lists written from its arrays (`SamplingMask.to_lists_json`, compiled). Any
    other content is upstream's alone.
Why: a lists mask holds one JSON number per support id (512 tokens of 27 ids:
    13,824 in a choice). Dumped by pydantic and written by `json.dumps`, it cost
    the API server 3.5-4.2x what writing it from the arrays does (`python
    benchmarks/bench_wire.py --tokens 512`, full responses of 512 tokens:
    `lists-dumps` 2.19 and 7.11 us a token against `lists` 0.62 and 1.68, at about
    8 and 50 ids a token); the bytes sent are the same.
Upstream: none: an overlay field; upstream's own lists (0.32's generate route)
    go through pydantic and `json.dumps` as every other field.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.http._full_response import MaskedBody
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release | None) -> None:
    @wraps(module, "JSONResponse.render")
    def render(wrapped, self, args, kwargs):
        content = args[0] if args else kwargs.get("content")
        if type(content) is MaskedBody:
            return content.render(wrapped)
        return wrapped(*args, **kwargs)
