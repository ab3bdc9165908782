"""What the three HTTP routes share (`/inference/v1/generate`, `/v1/completions`,
`/v1/chat/completions`); no upstream seam of its own, the route patches use it.

- the `return_sampling_mask` body field: its declaration, and its way into the
  request's own `SamplingParams.extra_args` (where the input processor decides);
- the `return_sampling_mask_logprobs` body field (strict bool; into
  `extra_args["return_sampling_mask_logprobs"]`): per token, the processed
  logprob of every support id and log S, written as `choices[].sampling_mask_logprobs`
  (one list of floats per token, aligned with the mask's lists) and
  `choices[].sampling_mask_log_kept` (one float per token) in lists format, and
  inside the packed object (`logprobs`, `log_kept`: base85 float32) in packed format;
- the `sampling_mask_format` body field ("lists", the default, or "packed": the
  compact encoding of `vllm_sampling_mask.packed_wire`): an API-server choice of
  how `choices[].sampling_mask` is written, full responses and stream chunks;
- a completion the mask path ended (`CompletionOutput.sampling_mask_error`):
  `SamplingMaskGenerationError`, an HTTP 400 carrying the message (an error event
  in a stream), never upstream's 500 "Internal server error";
- full responses: each choice's mask in the request's format (`set_choice_mask`);
  in lists format a `MaskLists`, which the response's `model_dump()` leaves as it
  is (`WritesMaskLists`, `declare_choice_fields`) and the `json_response` patch
  writes from its arrays as the body is rendered (`MaskedBody`), the same bytes;
- stream chunks: `StreamMasks` watches the engine's DELTA outputs and writes, into
  each chunk choice upstream emits, the supports of exactly that chunk's tokens;
- `open_stream`: a stream whose first event is an error (the input processor
  refused the request) is answered with that HTTP error instead of a 200;
- `answered`: a request the route refuses without streaming (an error response
  with a 4xx code) logs one line, as a refused stream does (`refusal_log`), and an
  upstream refusal without `param` whose message starts with a sampling
  parameter's name ("top_k must be ...") gets that name as its `param`
  (`sampling_params.top_k` on generate);
- `body_is_an_object`: the OpenAI request subclasses answer a body that is no
  JSON object (`[]`) with a 400, where upstream's validators raised an
  AttributeError (HTTP 500). Remove when upstream's before-validators check
  `isinstance(data, dict)` first. `checked_body` adds the misspelled or misplaced
  mask fields (`messages.misplaced_field`), which the routes would ignore; and,
  on a release whose `check_logprobs` compares logprobs fields as sent
  (`Release.logprobs_compared_raw`: 0.24), a value there that is no number is a
  400 naming the field (`messages.refuse_non_numbers`), where upstream's
  comparison raised a TypeError answered without one. Remove that part with
  0.24 (vLLM #49144 type-checks them from 0.27).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from collections.abc import AsyncIterator

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.packed_wire import LISTS_JSON, PACKED_JSON
from vllm_sampling_mask.patches._wrap import argument, with_argument
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.sampling_mask import SamplingMask
from vllm_sampling_mask.validation import LOGPROBS_ARG, MASK_ARG

# The request body field `return_sampling_mask` (top level; the `openai` client sends
# it through `extra_body`). Strict: "yes" or 1 is a 400 naming it, never a coerced True.
BodyField = StrictBool | None


def body_field():
    return Field(default=None, description=(
        "Return, for every generated token, the ids the sampler could draw it from "
        "(`choices[].sampling_mask`). true: a mask (refused unless the server runs "
        "with --return-sampling-mask and temperature > 0); false: none; null: a mask "
        "when the server's flag is on and the distribution is truncated."))


def logprobs_field():
    return Field(default=None, description=(
        "Return, with the mask, the processed logprob of every id of each token's "
        "support (`choices[].sampling_mask_logprobs`, aligned with the mask) and log S, "
        "the log of the probability mass the support kept under the temperature-scaled "
        "distribution (`choices[].sampling_mask_log_kept`); inside the packed object "
        "with sampling_mask_format \"packed\". Implies return_sampling_mask; needs a "
        "server started with --return-sampling-mask."))


# The response choice fields of the support logprobs (lists format).
LogprobsField = list[list[float]] | None
LogKeptField = list[float] | None
# The response choice field that says why `sampling_mask` is null from some token on
# (a request that never asked for a mask, which the mask path never fails).
ReasonField = str | None


# The request body field `sampling_mask_format` (top level, like the one above).
FORMAT_ARG = "sampling_mask_format"
FormatField = Literal["lists", "packed"] | None


def format_field():
    return Field(default=None, description=(
        "How `choices[].sampling_mask` is written: \"lists\" (default) one JSON list "
        "of ids per token; \"packed\" one object {format, tokens, data} with the "
        "supports Rice-coded in base85 (docs/sampling_mask.md, Packed wire)."))


# The response choice field: one list of ids per generated token, the packed
# object (`packed_wire.encode_packed`), or null.
MaskField = list[list[int]] | dict[str, str | int] | None


def forward_body_field(params, value, logprobs=None):
    """Put the body fields into `params.extra_args[MASK_ARG]` (and
    `[LOGPROBS_ARG]`), keeping the other extra args; absent (null) leaves them as
    they are. Returns `params`."""
    if value is not None:
        params.extra_args = {**(params.extra_args or {}), MASK_ARG: value}
    if logprobs is not None:
        params.extra_args = {**(params.extra_args or {}), LOGPROBS_ARG: logprobs}
    return params


def body_is_an_object(cls, data):
    """A request body that is no JSON object (`[]`, `1`) is a 400 naming the fix.
    Upstream's own before-validators call `data.get` first: an AttributeError, HTTP
    500. A validator the subclass declares runs before the parent's."""
    if not isinstance(data, dict):
        raise ValueError(f"the request body must be a JSON object, not {type(data).__name__}")
    return data


def checked_body(cls, data):
    """The OpenAI request subclasses' before-validator: a body that is a JSON object
    (`body_is_an_object`) whose mask fields are spelled and placed as the route
    reads them (`messages.refuse_misplaced_fields`: a near miss such as
    `return_sampling_masks`, or the field inside a raw `extra_body`, is a 400 naming
    the right field; other unknown fields keep upstream's handling)."""
    from vllm_sampling_mask.messages import refuse_misplaced_fields

    return refuse_misplaced_fields(cls, body_is_an_object(cls, data), generate=False)


def declare_openai_fields(module, request: str, choice: str, response: str,
                          release: Release) -> None:
    """In an OpenAI protocol module, replace the request class `request` with a
    subclass declaring the body field (forwarded by its `to_sampling_params`) and
    checking the body first (`checked_body`; then, where the release's
    `check_logprobs` compares them as sent, that its logprobs fields are numbers),
    and the response classes (`declare_choice_fields`)."""
    from vllm_sampling_mask.messages import refuse_non_numbers
    from vllm_sampling_mask.patches._wrap import wraps

    numbers = release.logprobs_compared_raw.get(request, ())

    def checked(cls, data):
        return refuse_non_numbers(checked_body(cls, data), numbers)

    Request = type(request, (getattr(module, request),),
                   {"__annotations__": {MASK_ARG: BodyField, FORMAT_ARG: FormatField,
                                        LOGPROBS_ARG: BodyField},
                    MASK_ARG: body_field(), FORMAT_ARG: format_field(),
                    LOGPROBS_ARG: logprobs_field(),
                    "_body_is_an_object": model_validator(mode="before")(
                        classmethod(checked)),
                    "__module__": module.__name__})
    setattr(module, request, Request)
    declare_choice_fields(module, choice, response)

    @wraps(module, f"{request}.to_sampling_params")
    def to_sampling_params(wrapped, self, args, kwargs):
        return forward_body_field(wrapped(*args, **kwargs), self.return_sampling_mask,
                                  self.return_sampling_mask_logprobs)


def declare_choice_fields(module, choice: str, response: str) -> None:
    """In a protocol module, replace the response classes `choice` / `response`
    with subclasses declaring the mask's fields on the choice (the response too:
    pydantic serialises a list field by its declared item type) and writing a
    lists mask from its arrays when the route renders the response
    (`WritesMaskLists`)."""
    Choice = type(choice, (getattr(module, choice),),
                  {"__annotations__": {"sampling_mask": MaskField,
                                       "sampling_mask_logprobs": LogprobsField,
                                       "sampling_mask_log_kept": LogKeptField,
                                       "sampling_mask_reason": ReasonField},
                   "sampling_mask": None, "sampling_mask_logprobs": None,
                   "sampling_mask_log_kept": None, "sampling_mask_reason": None,
                   "__module__": module.__name__})
    Response = type(response, (WritesMaskLists, getattr(module, response)),
                    {"__annotations__": {"choices": list[Choice]},
                     "__module__": module.__name__})
    setattr(module, choice, Choice)
    setattr(module, response, Response)


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


def asks_logprobs(request) -> bool:
    """Whether the request asked for support logprobs (the body field)."""
    return getattr(request, LOGPROBS_ARG, None) is True


def packed_format(request) -> bool:
    """Whether the request asked for the packed wire (`sampling_mask_format`)."""
    return request.sampling_mask_format == "packed"


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


async def full_response_with_masks(wrapped, args, kwargs, response_type):
    """Run a route's full-response generator (`wrapped`, whose arguments name
    `request` and `result_generator`), recording each choice's final output, then
    set every choice's mask (and support logprobs) in the request's wire format.
    A response of another type (an error) is returned as it is."""
    final = {}
    args, kwargs = with_argument(wrapped, args, kwargs, "result_generator",
                                 lambda results: recording(results, final))
    response = await wrapped(*args, **kwargs)
    if isinstance(response, response_type):
        packed = packed_format(argument(wrapped, args, kwargs, "request"))
        for choice in response.choices:
            set_choice_mask(choice, final[choice.index], packed)
    return response


# a chunk's JSON as upstream writes it (compact, UTF-8 as it is); one encoder for every
# chunk, where `json.dumps` with these options builds one per call
_CHUNK_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


class StreamMasks:
    """The masks of one streamed request, handed from the engine's DELTA outputs
    to the chunks upstream builds from them.

    `watch` re-yields the result generator upstream's stream generator consumes;
    as it hands a result on, the supports of its `CompletionOutput`s become
    pending, each under its chunk choice index (`output.index + prompt index *
    stride`). Each output of a result has a choice of its own, so all of them go
    at once. The first result of a route that builds chunks from it before its
    outputs (`ahead`: chat's role chunk and echo) hands its supports on only
    when upstream starts on its outputs (`for output in res.outputs`,
    `_Reached`), so those chunks get none. `chunks` re-yields
    upstream's `data: {...}` events and sets `sampling_mask` on every chunk
    choice to what is pending for it: the supports of the tokens of the output
    upstream is building that chunk from (the chunk's own `token_ids`), with
    those of any earlier output upstream gave no chunk; `[]` for a chunk built from no output (the chat role chunk);
    null for a request without a mask; null with `sampling_mask_reason` from the
    chunk that holds the token where a request that never asked lost its mask on.
    A choice the mask path ended streams every token it drew before the failing
    step, with their masks, then raises (upstream's error event), also when the
    engine joined those tokens and the error into one output (`_before_error`).

    A chunk of one choice (every chunk but the usage one, a tool call's and, on
    some routes, n > 1's) gets those fields written into upstream's text
    (`_with_fields`): in front of its index, or in place of the null upstream
    writes where it declares the field itself (the generate route from 0.28;
    `_reach` takes each mask off its output, so upstream never writes one as
    lists); any other is parsed and written again. A stream of one
    choice in all (`choices`, where the route knows it) writes every chunk's
    fields into the text without reading its index: the choice is choice 0. A
    request that said `return_sampling_mask: false` (`asked`) carries no mask and
    loses none, so `watch` hands its results on untouched and each one-choice
    chunk gets its null without its index being read.
    """

    def __init__(self, stride: int = 0, indexed: bool = False, packed: bool = False,
                 logprobs: bool = False, asked: bool | None = None,
                 choices: int = 0, ahead: bool = False) -> None:
        # a chunk's choice index: the output's index + its prompt's index * stride
        self._stride = stride
        self._indexed = indexed  # results are (prompt index, RequestOutput) pairs
        # choice index -> the supports reached for it and given no chunk yet
        self._pending: dict[int, SamplingMask] = {}
        self._reasons: dict[int, str] = {}   # choice index -> why its mask stopped
        self._masked = False
        self._packed = packed    # `sampling_mask_format: "packed"`
        self._logprobs = logprobs  # `return_sampling_mask_logprobs: true`
        self._unasked = asked is False and not logprobs  # no mask can come
        self._one_choice = choices == 1   # the stream's choices in all (0: not known)
        # upstream builds chunks from the first result before it reads its outputs
        self._ahead = ahead

    @classmethod
    def of(cls, request, stride: int = 0, indexed: bool = False,
           choices: int = 0, ahead: bool = False) -> StreamMasks:
        """The hand-off of `request`'s stream, in the format and with the fields its
        body asked for."""
        return cls(stride, indexed, packed=packed_format(request),
                   logprobs=asks_logprobs(request), asked=request.return_sampling_mask,
                   choices=choices, ahead=ahead)

    def watch(self, results: AsyncIterator) -> AsyncIterator:
        return results if self._unasked else self._watching(results)

    async def _watching(self, results: AsyncIterator):
        # one result a streamed token: the usual one is handed on in this loop's body
        try:
            async for item in results:
                prompt, res = item if self._indexed else (0, item)
                outputs = res.outputs
                for completion in outputs:
                    if completion.sampling_mask_error is not None:
                        break
                    if completion.sampling_mask is not None:
                        self._masked = True
                else:
                    if self._ahead:   # chunks come from it first: reach when read
                        self._ahead = False
                        item = self._handing(prompt, res)
                    else:
                        self._reach(prompt, outputs)
                    yield item
                    continue
                served = _before_error(res)
                if served is not None:   # tokens that came with the error: theirs first
                    yield self._handing(prompt, served)
                raise_mask_errors(outputs)
        finally:
            await results.aclose()

    def _handing(self, prompt: int, res):
        """`res` (as the results iterator yields it) with outputs that hand their
        masks on when upstream reaches them."""
        outputs = res.outputs
        if not self._masked:
            self._masked = any(c.sampling_mask is not None for c in outputs)
        res.outputs = _Reached(outputs)
        res.outputs.reach = self, prompt
        return (prompt, res) if self._indexed else res

    def _reach(self, prompt: int, outputs) -> None:
        """The masks of a result's `outputs` become pending (their reasons kept),
        each under its choice's index, and leave their outputs: the chunk's text
        gets them from here, and upstream sees none to write itself."""
        for completion in outputs:
            index = completion.index + prompt * self._stride
            if completion.sampling_mask_reason is not None:
                self._reasons.setdefault(index, completion.sampling_mask_reason)
            elif (mask := completion.sampling_mask) is not None:
                completion.sampling_mask = None   # (generate 0.32 would write lists)
                pending = self._pending
                # tokens upstream gave no chunk go with the choice's next one
                pending[index] = (mask if index not in pending
                                  else SamplingMask.concat((pending[index], mask)))

    async def chunks(self, events: AsyncIterator[str]):
        try:
            if not self._one_choice:
                async for event in events:
                    yield self._with_masks(event)
                return
            # a stream of one choice: a chunk with a choice (the first is choice 0) gets
            # its fields here, without its index read, in front of its index or in place
            # of upstream's own null; any other event takes `_with_masks`. This is
            # `_with_fields` and `_upstream_null` written out, a call a chunk less:
            # `bench_serving.py --hand-off` read the said-false null 0.39 us a token
            # this way and 0.51 through the two calls, the masked hand-off 1.74 and 1.87
            unasked = self._unasked
            async for event in events:
                if '"sampling_mask' not in event:
                    if _CHOICES_HEAD in event:
                        event = event.replace(_CHOICES_HEAD, _CHOICES_HEAD_NO_MASK if unasked
                                              else '"choices":[{' + self._fields(0)
                                              + ',"index":', 1)
                    else:
                        event = self._with_masks(event)
                elif event.count('"sampling_mask') == 1 and _NO_MASK_TEXT in event:
                    if not unasked:
                        event = event.replace(_NO_MASK_TEXT, self._fields(0), 1)
                else:
                    event = self._with_masks(event)
                yield event
        finally:
            await events.aclose()

    def _with_masks(self, event: str) -> str:
        if self._unasked and event.count(_CHOICE) == 1:
            # no mask can come: the one choice gets null, in front of its index or
            # where upstream wrote its own
            if _upstream_null(event):
                return event
            if '"sampling_mask' not in event:
                written = event.replace(_CHOICES_HEAD, _CHOICES_HEAD_NO_MASK, 1)
                if len(written) != len(event):
                    return written
        index = _single_choice_index(event)
        if index is not None:
            return _with_fields(event, self._fields(index))
        chunk = _event_json(event)
        if chunk is None or not chunk.get("choices"):
            return event  # [DONE], an error event, the usage chunk
        for choice in chunk["choices"]:
            choice.update(json.loads("{" + self._fields(choice["index"]) + "}"))
        return f"data: {_CHUNK_JSON.encode(chunk)}\n\n"

    def _fields(self, index: int) -> str:
        """The mask fields of the chunk choice `index` as JSON text (the members
        of an object, without its braces), taking what is pending for it. The
        mask is written straight from its arrays (`packed_wire.LISTS_JSON` and
        `PACKED_JSON` where the compiled encoder is built, else
        `SamplingMask.to_lists_json` and `to_packed_json`), not through
        Python lists and json's encoder."""
        mask = self._pending.pop(index, None)
        if self._reasons and index in self._reasons:   # this token on: no mask, and why
            return _CHUNK_JSON.encode({"sampling_mask": None,
                                       "sampling_mask_reason": self._reasons[index]})[1:-1]
        if not self._masked:
            return _NO_MASK_TEXT
        if mask is None:
            mask = (SamplingMask.from_lists([], [], []) if self._logprobs
                    else SamplingMask.from_lists([]))
        if self._packed:
            text = (mask.logprobs is None and PACKED_JSON is not None
                    and PACKED_JSON(mask.ids, mask.offsets) or mask.to_packed_json())
            return '"sampling_mask":' + text
        text = (LISTS_JSON is not None and LISTS_JSON(mask.ids, mask.offsets)
                or mask.to_lists_json())
        text = '"sampling_mask":' + text
        if self._logprobs and mask.logprobs is not None:
            text += "," + _CHUNK_JSON.encode({
                "sampling_mask_logprobs": mask.logprob_lists(),
                "sampling_mask_log_kept": mask.log_kept.tolist()})[1:-1]
        return text


def _before_error(res):
    """The tokens a result with a mask error holds before the step that error ended
    a choice on, as a result of their own (None if none of them has a token).
    Under load the engine's DELTA outputs are joined until the stream takes them,
    so the tokens a choice drew before the failing step (which carries none: the
    scheduler ends it without its token) may arrive in the same output as the
    error; a stream serves them, masks and all, then the error event, whatever
    the timing."""
    outputs = []
    for completion in res.outputs:
        if completion.sampling_mask_error is not None:
            if not completion.token_ids:
                continue
            completion = copy.copy(completion)
            completion.sampling_mask_error = None
            completion.finish_reason = completion.stop_reason = None
        outputs.append(completion)
    if not any(c.token_ids for c in outputs):
        return None
    served = copy.copy(res)
    served.outputs, served.finished = outputs, False
    return served


class _Reached(list):
    """A result's outputs that hand their masks to the stream's hand-off
    (`StreamMasks._reach`; `reach` is the hand-off and the result's prompt index)
    when the stream generator starts iterating them."""

    __slots__ = ("reach",)

    def __iter__(self):
        hand_off, prompt = self.reach
        hand_off._reach(prompt, list.__iter__(self))
        return list.__iter__(self)


# a choice object in upstream's compact JSON, and a chunk's first one with its index
_CHOICE = '{"index":'
_FIRST_CHOICE = re.compile(r'"choices":\[\{"index":(\d+)[,}]')
# the fields of a chunk choice without a mask, as text
_NO_MASK_TEXT = '"sampling_mask":null'
# where a chunk's first choice starts, and the same with those fields in front
_CHOICES_HEAD = '"choices":[{"index":'
_CHOICES_HEAD_NO_MASK = '"choices":[{' + _NO_MASK_TEXT + ',"index":'


def _upstream_null(event: str) -> bool:
    """Whether the only mask field in `event` is upstream's own `"sampling_mask":null`
    (the generate route's stream choices declare the field from 0.28, and the
    hand-off takes every mask off its output before upstream reads it). Inside a
    JSON string every quote is escaped, so the text `"sampling_mask":null` is a
    key with its value; a string holding `\\"sampling_mask` makes the count 2."""
    return event.count('"sampling_mask') == 1 and _NO_MASK_TEXT in event


def _single_choice_index(event: str) -> int | None:
    """The index of the one choice of a chunk event, read from its text; None for
    any other event (no choice, several, a tool call's indexed delta, mask fields
    already there other than upstream's own null, `_upstream_null`). A JSON string
    holds no unescaped quote, so `{"index":` in the text is an object's key, never
    a string's content."""
    if event.count(_CHOICE) != 1 or ('"sampling_mask' in event
                                     and not _upstream_null(event)):
        return None
    first = _FIRST_CHOICE.search(event)
    return None if first is None else int(first[1])


def _with_fields(event: str, fields: str) -> str:
    """`event`, a chunk of one choice (`_single_choice_index`), with `fields` (JSON
    object members) written into that choice's text: where upstream wrote its own
    null, else as its first keys."""
    if '"sampling_mask' in event:
        return event.replace(_NO_MASK_TEXT, fields, 1)
    return event.replace(_CHOICES_HEAD, '"choices":[{' + fields + ',"index":', 1)


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
    (`messages.param_in_message`, with `prefix`) and logs one line
    (`messages.refusal_line`), then propagates unchanged otherwise."""
    import logging

    from vllm_sampling_mask.messages import param_in_message, refusal_line

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
    `sampling_params.<name>` (`messages.param_in_message`). (On 0.24 a client error
    is a ValueError, which pydantic turns into a schema error before it gets here:
    `validation_messages` words that one.)"""
    from vllm_sampling_mask.messages import param_in_message

    try:
        return handler(data)
    except client_error_class(release) as exc:
        if getattr(exc, "parameter", "") is None and (named := param_in_message(
                str(exc.args[0]) if exc.args else "")):
            exc.parameter = "sampling_params." + named
        import logging

        from vllm_sampling_mask.messages import refusal_line
        logging.getLogger("vllm.sampling_mask").info(
            "%s", refusal_line(exc, "/inference/v1/generate's body"))
        raise


def answered(result, where: str, ErrorResponse: type, prefix: str = ""):
    """A route's own answer, returned as it is; when it is a refusal (an error
    response with a 4xx code), its `param` filled from its message where upstream
    left it null (`messages.param_in_message`, with `prefix`: `sampling_params.` on
    generate), and one log line saying so, as `refusal_log` words a refused stream."""
    import logging

    from vllm_sampling_mask.messages import param_in_message

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
