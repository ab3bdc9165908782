"""Stream chunks: `StreamMasks` watches the engine's DELTA outputs and writes,
into each chunk choice upstream emits, the supports of exactly that chunk's tokens.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator

from vllm_sampling_mask.formats.packed_wire import LISTS_JSON, PACKED_JSON
from vllm_sampling_mask.patches.http._body_fields import asks_logprobs, packed_format
from vllm_sampling_mask.patches.http._refusals import _event_json, raise_mask_errors
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask


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
