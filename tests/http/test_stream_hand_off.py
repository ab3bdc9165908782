"""The stream hand-off (`patches.http._stream.StreamMasks`) without a server: a chunk of
one choice gets its mask fields written into upstream's text, and that text
parses to what the JSON path writes, for every chunk shape the routes emit, for
hostile content and for every kind of field (null, lists, packed, support
logprobs, a dropped mask's reason); other chunks take the JSON path; a request
that said false is handed on untouched. (The routes end to end:
tests/http/test_openai_routes.py, tests/http/test_generate_route.py, tests/http/,
tests/http/test_packed_format.py, tests/http/test_support_logprobs_over_http.py.)"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import unique_keys

from vllm_sampling_mask.formats import packed_wire
from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.patches.http import _stream
from vllm_sampling_mask.patches.http._stream import StreamMasks, _single_choice_index, _with_fields
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask


def event(chunk: dict) -> str:
    """A chunk event as upstream writes it (pydantic's compact JSON, UTF-8 as is)."""
    return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n"


def parsed(event_text: str) -> dict:
    """The event's chunk; a key written twice in one object fails the test (JSON
    parsers keep the last, so a duplicate would hide the first)."""
    assert event_text.startswith("data: ") and event_text.endswith("\n\n")
    return json.loads(event_text[len("data: "):], object_pairs_hook=unique_keys)


def members(fields: dict) -> str:
    """`fields` as the text of an object's members (what `_with_fields` writes)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))[1:-1]


def with_fields(chunk: dict, fields: dict) -> dict:
    """The chunk with `fields` set on every choice (what the JSON path writes)."""
    return {**chunk, "choices": [{**c, **fields} for c in chunk["choices"]]}


_NO_MASK = {"sampling_mask": None}
HEAD = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "demo"}
ONE_CHOICE = {
    "completions": {**HEAD, "choices": [{"index": 0, "text": " hi", "logprobs": None,
                                         "finish_reason": None, "stop_reason": None,
                                         "token_ids": [12]}], "usage": None},
    "chat role": {**HEAD, "object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None}]},
    "chat content": {**HEAD, "object": "chat.completion.chunk",
                     "choices": [{"index": 1, "delta": {"content": "{\"index\": 3}"},
                                  "logprobs": {"content": [{"token": "{\"index\":",
                                                            "logprob": -0.5}]},
                                  "finish_reason": "stop", "token_ids": [7, 8]}]},
    "generate": {"request_id": "r", "choices": [{"index": 12, "token_ids": [5],
                                                 "logprobs": None, "finish_reason": None}]},
    # from 0.28 the generate route's stream choices declare `sampling_mask`: upstream
    # writes its null (the hand-off takes every mask off its output first)
    "generate, upstream's null": {"request_id": "r", "choices": [{
        "index": 3, "token_ids": [5], "sampling_mask": None, "weight_versions": None}]},
}
FIELDS = {
    "null": _NO_MASK,
    "lists": {"sampling_mask": [[3, 12], [7, 8, 9]]},
    "packed": {"sampling_mask": SamplingMask.from_lists([[3, 12]]).to_packed()},
    "logprobs": {"sampling_mask": [[3, 12]], "sampling_mask_logprobs": [[-0.25, -1.5]],
                 "sampling_mask_log_kept": [-0.125]},
    "reason": {"sampling_mask": None, "sampling_mask_reason": "wider than \"128\" ids"},
}


@pytest.mark.parametrize("fields", FIELDS)
@pytest.mark.parametrize("shape", ONE_CHOICE)
def test_one_choice_chunks_get_their_fields_in_their_text(shape, fields):
    chunk = ONE_CHOICE[shape]
    assert _single_choice_index(event(chunk)) == chunk["choices"][0]["index"]
    written = _with_fields(event(chunk), members(FIELDS[fields]))
    assert written.endswith("\n\n")
    assert parsed(written) == with_fields(chunk, FIELDS[fields])


@pytest.mark.parametrize("chunk", [
    {**HEAD, "choices": [], "usage": {"prompt_tokens": 3}},              # the usage chunk
    {**HEAD, "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]},
    {**HEAD, "object": "chat.completion.chunk",                          # a tool call delta
     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t"}]}}]},
    {**HEAD, "choices": [{"index": 0, "text": "a", "sampling_mask": [[1]]}]},
    {**HEAD, "choices": [{"index": -1, "text": "a"}]},
    {**HEAD, "choices": [{"index": None}]},
], ids=["usage", "two choices", "tool call", "mask written", "negative", "null index"])
def test_other_chunks_are_left_to_the_json_path(chunk):
    assert _single_choice_index(event(chunk)) is None
    assert _single_choice_index("data: [DONE]\n\n") is None
    assert _single_choice_index('data: {"choices":[{"index":7') is None   # cut short


TEXT = st.text(alphabet=st.sampled_from(list('{}[]":,\\ \n\tindexchoices"é😀')),
               max_size=40)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, 2 ** 31), text=TEXT, token=TEXT,
       extra=st.dictionaries(TEXT.filter(lambda key: key != "index"),
                             TEXT | st.integers() | st.none(), max_size=3),
       fields=st.sampled_from(list(FIELDS.values())), upstream_null=st.booleans())
def test_the_text_path_parses_to_the_json_paths_object_whatever_the_content(
        index, text, token, extra, fields, upstream_null):
    """Whatever the strings hold, and with or without upstream's own null (its
    place taken, or the fields put first)."""
    own = {"sampling_mask": None} if upstream_null else {}
    chunk = {"id": text, "choices": [{"index": index, "text": text, **extra, **own,
                                      "logprobs": {"tokens": [token]}}],
             "usage": None, **{k + "_": v for k, v in extra.items()}}
    assert _single_choice_index(event(chunk)) == index
    assert parsed(_with_fields(event(chunk), members(fields))) == with_fields(chunk, fields)


def completion(mask=None, reason=None, index=0, error=None, token_ids=()):
    return SimpleNamespace(index=index, sampling_mask=mask, sampling_mask_reason=reason,
                           sampling_mask_error=error, token_ids=list(token_ids),
                           finish_reason="error" if error else None, stop_reason=None)


async def run(masks: StreamMasks, results: list, chunks: list[dict]) -> list[dict]:
    """Drive the hand-off as a route does: upstream's generator iterates each
    result's outputs (through `watch`), then yields its chunk's event; the
    events parsed."""
    async def engine():
        for outputs in results:
            yield SimpleNamespace(outputs=outputs, finished=False)

    async def upstream(results):
        async for res in results:
            for _ in res.outputs:
                pass
            yield event(chunks.pop(0))

    return [parsed(e) async for e in masks.chunks(upstream(masks.watch(engine())))]


def request(asked=None, packed=False, logprobs=None):
    return SimpleNamespace(sampling_mask_format="packed" if packed else "lists",
                           return_sampling_mask=asked,
                           return_sampling_mask_logprobs=logprobs)


OTHER_SHAPES = {
    "two choices": {**HEAD, "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]},
    "tool call": {**HEAD, "object": "chat.completion.chunk",
                  "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t"}]}}]},
    "usage": {**HEAD, "choices": [], "usage": {"prompt_tokens": 3}},
    # the same, with the fields of a mask written already (not by upstream's null)
    "fields written": {"request_id": "r", "choices": [{
        "index": 0, "token_ids": [5], "finish_reason": None, "sampling_mask": [[5]],
        "sampling_mask_logprobs": None}]},
}


def test_a_request_that_said_false_is_handed_on_untouched():
    masks = StreamMasks.of(request(asked=False))
    results = object()
    assert masks.watch(results) is results
    chunk = ONE_CHOICE["completions"]
    assert asyncio.run(run(masks, [[completion()]], [chunk])) == \
        [with_fields(chunk, _NO_MASK)]


@pytest.mark.parametrize("shape", [*ONE_CHOICE, *OTHER_SHAPES])
def test_a_request_that_said_false_gets_null_in_every_choice_of_every_chunk(shape):
    """Its one-choice chunks take the unasked path (null written without reading the
    index); whatever the shape, every choice reads null, as the general path writes
    it for a stream that got no mask."""
    chunk = {**ONE_CHOICE, **OTHER_SHAPES}[shape]
    said_false = StreamMasks.of(request(asked=False))
    general = StreamMasks.of(request(asked=None))
    text = event(chunk)
    got = said_false._with_masks(text)
    assert got == general._with_masks(text)
    assert parsed(got) == with_fields(chunk, _NO_MASK)
    assert said_false._with_masks("data: [DONE]\n\n") == "data: [DONE]\n\n"


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_masked_chunks_one_choice_or_several_carry_their_tokens_supports(
        packed, compiled, monkeypatch):
    """Each chunk choice carries its output's supports, written by the compiled
    encoder's call (`LISTS_JSON`, `PACKED_JSON`) or, on an install without it, by
    `SamplingMask`'s fallbacks: the same JSON."""
    if compiled and not packed_wire.NATIVE:
        pytest.skip("the compiled encoder (_packed_native) is not built here")
    if not compiled:
        monkeypatch.setattr(_stream, "LISTS_JSON", None)
        monkeypatch.setattr(_stream, "PACKED_JSON", None)
        monkeypatch.setattr(packed_wire, "_packed_native", None)
        monkeypatch.setattr(packed_wire, "LISTS_JSON", None)
    one, two = SamplingMask.from_lists([[3, 12]]), SamplingMask.from_lists([[5], [6, 7]])
    chunk = ONE_CHOICE["completions"]
    both = {**HEAD, "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]}
    got = asyncio.run(run(StreamMasks.of(request(packed=packed)),
                          [[completion(one)], [completion(two), completion(one, index=1)]],
                          [chunk, both]))

    def payload(mask):
        return mask.to_packed() if packed else mask.token_ids
    assert got[0] == with_fields(chunk, {"sampling_mask": payload(one)})
    assert [c["sampling_mask"] for c in got[1]["choices"]] == [payload(two), payload(one)]
    assert [SamplingMask.from_response(c) for c in got[1]["choices"]] == [two, one]


@pytest.mark.parametrize("shape", [*ONE_CHOICE, "tool call", "usage", "fields written"])
@pytest.mark.parametrize("kind", ["lists", "packed", "logprobs", "reason", "said false"])
def test_a_stream_of_one_choice_writes_what_the_general_path_writes(shape, kind):
    """A stream the route knows has one choice in all (`choices=1`) writes its fields
    into every chunk without reading the chunk's index; parsed, each chunk is what
    the hand-off that reads it writes (the JSON path for a tool call's), and a chunk
    with no choice is left as it is."""
    chunk = {**ONE_CHOICE, **OTHER_SHAPES}[shape]
    chunk = {**chunk, "choices": [{**c, "index": 0} for c in chunk["choices"]]}
    mask = SamplingMask(np.array([3, 12], np.int32), np.array([0, 2]),
                        np.array([-0.5, -1.0], np.float32), np.array([-0.25], np.float32))
    def outputs():   # each run's own: the hand-off takes the masks off them
        return {"lists": [completion(SamplingMask.from_lists([[3, 12]]))],
                "packed": [completion(SamplingMask.from_lists([[3, 12]]))],
                "logprobs": [completion(mask)], "reason": [completion(reason="wider")],
                "said false": [completion()]}[kind]
    asked = {"packed": dict(packed=True), "logprobs": dict(logprobs=True),
             "reason": dict(), "said false": dict(asked=False)}.get(kind, dict())
    one, general = (StreamMasks.of(request(**asked), choices=c) for c in (1, 0))
    got = asyncio.run(run(one, [outputs()], [chunk]))
    assert got == asyncio.run(run(general, [outputs()], [chunk]))
    assert all("sampling_mask" in choice for choice in got[0]["choices"])
    assert one._with_masks("data: [DONE]\n\n") == "data: [DONE]\n\n"


@pytest.mark.parametrize("choices", [1, 0])
@pytest.mark.parametrize("asked", [None, False])
def test_upstreams_own_null_is_written_over_and_upstream_sees_no_mask(choices, asked):
    """The generate route from 0.28 declares `sampling_mask` on its stream choices
    (0.32 fills it from the output's mask, as lists): the hand-off takes each mask
    off its output before upstream reads it, and writes the chunk's fields where
    upstream wrote its null, once (n = 1, and n = 2's one choice a chunk)."""
    masks = [SamplingMask.from_lists([[3, 12]]), SamplingMask.from_lists([[5], [6, 7]])]
    n = 1 if choices == 1 else 2
    results = [[completion(masks[t % 2] if asked is None else None, index=i)
                for i in range(n)] for t in range(2)]
    seen = []

    async def engine():
        for outputs in results:
            yield SimpleNamespace(outputs=outputs, finished=False)

    async def upstream(results):   # 0.32's generate stream generator, in short
        async for res in results:
            for output in res.outputs:
                seen.append(output.sampling_mask)
                mask = output.sampling_mask
                yield event({"request_id": "r", "choices": [{
                    "index": output.index, "token_ids": [5],
                    "sampling_mask": None if mask is None else mask.token_ids}]})

    async def drive():
        hand_off = StreamMasks.of(request(asked=asked), choices=choices)
        return [parsed(e) async for e in hand_off.chunks(upstream(hand_off.watch(engine())))]

    got = asyncio.run(drive())
    assert seen == [None] * 2 * n
    want = [None if asked is False else masks[t % 2].token_ids
            for t in range(2) for _ in range(n)]
    assert [chunk["choices"][0]["sampling_mask"] for chunk in got] == want
    assert [chunk["choices"][0]["index"] for chunk in got] == [i for _ in range(2)
                                                              for i in range(n)]


@pytest.mark.parametrize("ahead", [True, False])
def test_chunks_built_from_the_first_result_before_its_outputs_get_no_supports(ahead):
    """Chat builds its role chunk from the first result before it reads that
    result's outputs (`ahead`): the role chunk gets `[]`, each content chunk its
    token's supports. Other routes build no chunk ahead, and the supports of a
    result are pending from the moment it is handed on: there a chunk built ahead
    would take them (why chat says `ahead`)."""
    masks = [SamplingMask.from_lists([[3, 12]]), SamplingMask.from_lists([[5, 7, 9]])]
    role = ONE_CHOICE["chat role"]
    content = {**role, "choices": [{"index": 0, "delta": {"content": "a"},
                                    "token_ids": [12]}]}

    async def engine():
        for mask in masks:
            yield SimpleNamespace(outputs=[completion(mask)], finished=False)

    async def upstream(results):   # chat's stream generator, in short
        first = True
        async for res in results:
            if first:
                yield event(role)
                first = False
            for _ in res.outputs:
                yield event(content)

    async def drive():
        hand_off = StreamMasks.of(request(), choices=1, ahead=ahead)
        return [parsed(e)["choices"][0]["sampling_mask"]
                async for e in hand_off.chunks(upstream(hand_off.watch(engine())))]

    got = asyncio.run(drive())
    if ahead:
        assert got == [[], masks[0].token_ids, masks[1].token_ids]
    else:
        assert got == [masks[0].token_ids, [], masks[1].token_ids]


def test_support_logprobs_and_a_dropped_mask_in_the_text():
    logprobs = SamplingMask(np.array([3, 12], np.int32), np.array([0, 2]),
                            np.array([-0.5, -1.0], np.float32), np.array([-0.25], np.float32))
    chunk = ONE_CHOICE["completions"]
    got = asyncio.run(run(StreamMasks.of(request(logprobs=True)),
                          [[completion(logprobs)]], [chunk]))
    assert got == [with_fields(chunk, {"sampling_mask": [[3, 12]],
                                       "sampling_mask_logprobs": [[-0.5, -1.0]],
                                       "sampling_mask_log_kept": [-0.25]})]
    # a request that never asked: null, then the reason from the drop on
    reason = "dropped: wider than --max-sampling-mask-size 128"
    got = asyncio.run(run(StreamMasks.of(request()),
                          [[completion()], [completion(reason=reason)]], [chunk, chunk]))
    assert got == [with_fields(chunk, _NO_MASK),
                   with_fields(chunk, {"sampling_mask": None,
                                       "sampling_mask_reason": reason})]


def test_tokens_joined_with_a_mask_error_stream_before_the_error():
    """Under load the engine joins DELTA outputs until the stream takes them: the
    tokens a choice drew before the step the mask path ended it on can arrive in
    the same output as the error. They stream first, with their masks and without
    the error's finish reason; then the error, whatever the timing."""
    error = "sampling mask: wider than --max-sampling-mask-size 128"
    drawn = SamplingMask.from_lists([[3, 12], [7]])
    joined = completion(drawn, error=error, token_ids=[12, 7])
    chunk = ONE_CHOICE["completions"]
    got, seen = [], []

    async def upstream(results):
        async for res in results:
            seen.append([(c.token_ids, c.finish_reason, c.sampling_mask_error)
                         for c in res.outputs])
            yield event(chunk)

    async def drive(outputs):
        async def engine():
            for o in outputs:
                yield SimpleNamespace(outputs=o, finished=True)
        masks = StreamMasks.of(request())
        async for e in masks.chunks(upstream(masks.watch(engine()))):
            got.append(parsed(e))

    with pytest.raises(SamplingMaskGenerationError, match="--max-sampling-mask-size 128"):
        asyncio.run(drive([[joined]]))
    assert seen == [[([12, 7], None, None)]]
    assert got == [with_fields(chunk, {"sampling_mask": [[3, 12], [7]]})]
    assert joined.sampling_mask_error == error        # the engine's output left as it was
    # the error alone (nothing drawn before it in that output): raised at once
    got.clear(), seen.clear()
    with pytest.raises(SamplingMaskGenerationError):
        asyncio.run(drive([[completion(error=error)]]))
    assert got == seen == []
    # n > 1: the other choice's tokens in that output stream with the trimmed one
    got.clear(), seen.clear()
    other = completion(SamplingMask.from_lists([[5]]), index=1, token_ids=[5])
    with pytest.raises(SamplingMaskGenerationError):
        asyncio.run(drive([[joined, other]]))
    assert seen == [[([12, 7], None, None), ([5], None, None)]]


def test_the_opened_stream_serves_its_first_event_then_the_rest_however_it_is_driven():
    """`open_stream`'s result (`_Resumed`) is driven by `async for` (starlette), by
    `asyncio.create_task(anext(...))` (upstream's SSE keep-alive wrapper) and closed
    by `aclose`, which closes the events under it."""
    from vllm_sampling_mask.patches.http._refusals import _Resumed
    closed = []

    async def events():
        try:
            for event in ("b", "c"):
                yield event
        finally:
            closed.append(True)

    async def drive():
        plain = [e async for e in _Resumed("a", events())]
        tasks, stream = [], _Resumed("a", events())
        while True:
            try:
                tasks.append(await asyncio.create_task(anext(stream)))
            except StopAsyncIteration:
                break
        early = _Resumed("a", events())
        assert await anext(early) == "a" and await anext(early) == "b"
        await early.aclose()
        return plain, tasks

    assert asyncio.run(drive()) == (["a", "b", "c"], ["a", "b", "c"])
    assert closed == [True, True, True]
