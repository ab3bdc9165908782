"""The stream hand-off (`patches._http.StreamMasks`) without a server: a chunk of
a request that carries no mask gets its `"sampling_mask": null` written into
upstream's text, and that text parses to what the JSON path writes, for every
chunk shape the routes emit and for hostile content; a request that said false
is handed on untouched; a dropped mask's reason and a masked chunk still take
the JSON path. (The routes end to end: tests/test_openai_routes.py,
tests/test_server.py, tests/test_first_hour.py.)"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_sampling_mask.patches._http import StreamMasks, _with_null_mask
from vllm_sampling_mask.sampling_mask import SamplingMask


def event(chunk: dict) -> str:
    """A chunk event as upstream writes it (pydantic's compact JSON, UTF-8 as is)."""
    return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n"


def parsed(event_text: str) -> dict:
    assert event_text.startswith("data: ") and event_text.endswith("\n\n")
    return json.loads(event_text[len("data: "):])


def with_null(chunk: dict) -> dict:
    """What the JSON path writes for a chunk of a request without a mask."""
    return {**chunk, "choices": [{**c, "sampling_mask": None} for c in chunk["choices"]]}


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
    "generate": {"request_id": "r", "choices": [{"index": 2, "token_ids": [5],
                                                 "logprobs": None, "finish_reason": None}]},
}


@pytest.mark.parametrize("shape", ONE_CHOICE)
def test_one_choice_chunks_get_the_null_in_their_text(shape):
    chunk = ONE_CHOICE[shape]
    written = _with_null_mask(event(chunk))
    assert written is not None and written.endswith("\n\n")
    assert parsed(written) == with_null(chunk)
    # the JSON path writes the same object
    assert parsed(StreamMasks()._with_masks(event(chunk))) == with_null(chunk)


@pytest.mark.parametrize("chunk", [
    {**HEAD, "choices": [], "usage": {"prompt_tokens": 3}},              # the usage chunk
    {**HEAD, "choices": [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]},
    {**HEAD, "object": "chat.completion.chunk",                          # a tool call delta
     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t"}]}}]},
    {**HEAD, "choices": [{"index": 0, "text": "a", "sampling_mask": [[1]]}]},
], ids=["usage", "two choices", "tool call", "mask written"])
def test_other_chunks_are_left_to_the_json_path(chunk):
    assert _with_null_mask(event(chunk)) is None
    assert _with_null_mask("data: [DONE]\n\n") is None
    # which writes every choice's null (the usage chunk has none)
    assert parsed(StreamMasks()._with_masks(event(chunk))) == with_null(chunk)


TEXT = st.text(alphabet=st.sampled_from(list('{}[]":,\\ \n\tindexchoices"é😀')),
               max_size=40)


@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, 2 ** 31), text=TEXT, token=TEXT,
       extra=st.dictionaries(TEXT, TEXT | st.integers() | st.none(), max_size=3))
def test_the_text_path_parses_to_the_json_paths_object_whatever_the_content(
        index, text, token, extra):
    chunk = {"id": text, "choices": [{"index": index, "text": text, **extra,
                                      "logprobs": {"tokens": [token]}}],
             "usage": None, **{k + "_": v for k, v in extra.items()}}
    written = _with_null_mask(event(chunk))
    assert written is not None
    assert parsed(written) == with_null(chunk)


def completion(mask=None, reason=None, index=0):
    return SimpleNamespace(index=index, sampling_mask=mask, sampling_mask_reason=reason,
                           sampling_mask_error=None)


async def run(masks: StreamMasks, outputs: list, chunks: list[dict]) -> list[str]:
    """Drive the hand-off as a route does: upstream's generator iterates each
    result's outputs (through `watch`), then yields its chunk's event."""
    async def results():
        for output in outputs:
            yield SimpleNamespace(outputs=[output])

    async def upstream(results):
        async for res in results:
            for _ in res.outputs:
                pass
            yield event(chunks.pop(0))

    return [e async for e in masks.chunks(upstream(masks.watch(results())))]


def test_a_request_that_said_false_is_handed_on_untouched():
    masks = StreamMasks.of(SimpleNamespace(sampling_mask_format="lists",
                                           return_sampling_mask=False,
                                           return_sampling_mask_logprobs=None))
    results = object()
    assert masks.watch(results) is results
    chunk = ONE_CHOICE["completions"]
    assert [parsed(e) for e in asyncio.run(run(masks, [completion()], [chunk]))] == \
        [with_null(chunk)]


def test_a_dropped_mask_and_a_masked_chunk_take_the_json_path():
    chunk = ONE_CHOICE["completions"]
    # a request that never asked: null, then the reason from the drop on
    reason = "dropped: wider than --max-sampling-mask-size 128"
    out = asyncio.run(run(StreamMasks(), [completion(), completion(reason=reason)],
                          [chunk, chunk]))
    assert [parsed(e) for e in out] == [
        with_null(chunk), {**with_null(chunk), "choices": [
            {**chunk["choices"][0], "sampling_mask": None,
             "sampling_mask_reason": reason}]}]
    # a masked request: its chunk's supports
    mask = SamplingMask.from_lists([[3, 12]])
    (out,) = asyncio.run(run(StreamMasks(), [completion(mask)], [chunk]))
    assert parsed(out)["choices"][0]["sampling_mask"] == [[3, 12]]
