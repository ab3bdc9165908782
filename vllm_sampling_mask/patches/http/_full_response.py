"""Full (not streamed) responses, the same path on all three routes: `fill_masks`
sets each choice's mask from its final `CompletionOutput` (by choice index) in the
request's format (`set_choice_mask`), once the route's finals are known. Only how a
route gets its finals differs, as upstream gives no common seam: chat's and
generate's full-response generators read a result generator, which `recording`
re-yields (`full_response_with_masks`); completions' collects every prompt's
final `RequestOutput` in `create_completion` and hands the batch to
`request_output_to_completion_response` (`batch_finals`). Either way a mask error
raises before upstream reads an output. In lists format a choice's mask is a
`MaskLists`, which the response's `model_dump()` leaves as it is (`WritesMaskLists`,
`_protocol.declare_choice_fields`) and the `json_response` patch writes from its
arrays as the body is rendered (`MaskedBody`), the same bytes.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping

from vllm_sampling_mask.patches._wrap import argument, with_argument
from vllm_sampling_mask.patches.http._body_fields import packed_format
from vllm_sampling_mask.patches.http._refusals import raise_mask_errors
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask


def mask_lists(completion, packed: bool = False) -> list[list[int]] | dict | None:
    """A final `CompletionOutput`'s mask as a response choice carries it (the
    packed object when the request said `sampling_mask_format: "packed"`)."""
    raise_mask_errors([completion])
    mask = completion.sampling_mask
    return None if mask is None else mask_payload(mask, packed)


def mask_payload(mask: SamplingMask, packed: bool) -> list[list[int]] | dict:
    """A mask as the response carries it: JSON lists (`MaskLists`), or the packed
    object (with the support logprobs inside when the mask has them)."""
    return mask.to_packed() if packed else MaskLists(mask)


class MaskLists(list):
    """A full response's mask in lists format: `SamplingMask.token_ids`, holding
    the mask itself. Read as a list anywhere; the response body writes it from the
    mask's arrays (`WritesMaskLists`, `MaskedBody`), in one compiled call where
    pydantic's dump and `json.dumps` would otherwise go through every id."""

    __slots__ = ("mask",)

    def __init__(self, mask: SamplingMask) -> None:
        super().__init__(mask.token_ids)
        self.mask = mask


# a choice's mask field as `json.dumps` writes it null: nowhere else in a response's
# JSON (inside a string every quote is escaped), so the n-th is the n-th null choice's
_NULL_MASK = b'"sampling_mask":null'


class WritesMaskLists:
    """A route's full-response class whose choices' lists masks (`MaskLists`) its
    `model_dump()` leaves as they are: `MaskedBody`, which `JSONResponse` writes
    from the masks' arrays (the `json_response` patch). Called with arguments, or
    without lists masks, `model_dump` is pydantic's."""

    def model_dump(self, *args, **kwargs):
        choices = self.choices if not (args or kwargs) else ()
        lists = [(i, c.sampling_mask) for i, c in enumerate(choices)
                 if type(c.sampling_mask) is MaskLists]
        if not lists:
            return super().model_dump(*args, **kwargs)
        for i, _ in lists:
            choices[i].sampling_mask = None
        try:
            body = super().model_dump()
        finally:
            for i, mask in lists:
                choices[i].sampling_mask = mask
        dumped = body["choices"]
        for i, mask in lists:
            dumped[i]["sampling_mask"] = mask
        return MaskedBody(body)


class MaskedBody(dict):
    """A response body (`model_dump()`) whose choices hold `MaskLists`: a dict like
    any other, which `JSONResponse` renders through `render`."""

    __slots__ = ()

    def render(self, dumps) -> bytes:
        """`dumps(self)` (the response's JSON bytes) with each `MaskLists` written
        from its mask's arrays (`SamplingMask.to_lists_json`): the body is dumped
        with those masks null, then each choice's null is replaced, in order. A body
        whose nulls do not match its choices one to one is dumped as it is."""
        choices = self["choices"]
        masks = [c.get("sampling_mask") for c in choices]
        written = [m for m in masks if m is None or type(m) is MaskLists]
        for c, m in zip(choices, masks):
            if type(m) is MaskLists:
                c["sampling_mask"] = None
        try:
            parts = dumps(self).split(_NULL_MASK)
        finally:
            for c, m in zip(choices, masks):
                c["sampling_mask"] = m
        if len(parts) != len(written) + 1:
            return dumps(self)
        out = [parts[0]]
        for m, part in zip(written, parts[1:]):
            out.append(_NULL_MASK if m is None
                       else b'"sampling_mask":' + m.mask.to_lists_json().encode())
            out.append(part)
        return b"".join(out)


def set_choice_mask(choice, completion, packed: bool) -> None:
    """Fill a response choice from its final `CompletionOutput`: `sampling_mask`,
    and in lists format the support logprobs beside it (when asked for)."""
    choice.sampling_mask = mask_lists(completion, packed)
    if completion.sampling_mask_reason is not None:
        choice.sampling_mask_reason = completion.sampling_mask_reason
    mask = completion.sampling_mask
    if not packed and mask is not None and mask.logprobs is not None:
        choice.sampling_mask_logprobs = mask.logprob_lists()
        choice.sampling_mask_log_kept = mask.log_kept.tolist()


async def recording(results: AsyncIterator, final: dict):
    """Re-yield the engine's `RequestOutput`s, keeping each choice's latest
    `CompletionOutput` in `final` (by index); a mask error raises. A mask stays
    with the kept copy and leaves the output upstream reads: the generate route
    (0.28-0.32) would build and check its own lists of it for the response, which
    the overlay replaces in the request's format."""
    try:
        async for res in results:
            raise_mask_errors(res.outputs)
            for completion in res.outputs:
                if completion.sampling_mask is not None:
                    final[completion.index] = copy.copy(completion)
                    completion.sampling_mask = None
                else:
                    final[completion.index] = completion
            yield res
    finally:
        await results.aclose()


def fill_masks(response, finals: Mapping[int, object], request):
    """Fill every choice of a route's full `response` from its final
    `CompletionOutput` (`finals`, by choice index) in `request`'s wire format:
    `sampling_mask`, its reason, and in lists format the support logprobs (when
    asked for). A mask error of any final raises before any choice is filled."""
    raise_mask_errors(finals.values())
    packed = packed_format(request)
    for choice in response.choices:
        set_choice_mask(choice, finals[choice.index], packed)
    return response


def batch_finals(final_res_batch) -> dict[int, object]:
    """Completions' finals by choice index: upstream numbers the choices of all
    prompts in order (`index=len(choices)`: prompt by prompt, each prompt's outputs
    in order). A mask error raises here, before upstream reads the outputs."""
    finals = dict(enumerate(c for res in final_res_batch for c in res.outputs))
    raise_mask_errors(finals.values())
    return finals


async def full_response_with_masks(wrapped, args, kwargs, response_type):
    """Run a route's full-response generator (`wrapped`, whose arguments name
    `request` and `result_generator`), recording each choice's final output, then
    fill the response's masks (`fill_masks`). A response of another type (an
    error) is returned as it is."""
    final = {}
    args, kwargs = with_argument(wrapped, args, kwargs, "result_generator",
                                 lambda results: recording(results, final))
    response = await wrapped(*args, **kwargs)
    if isinstance(response, response_type):
        fill_masks(response, final, argument(wrapped, args, kwargs, "request"))
    return response
