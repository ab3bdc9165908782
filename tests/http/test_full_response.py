"""A full (not streamed) response's masks without a server (`patches.http.
_full_response`: `fill_masks`, the three routes' one path, with the finals recorded
from a result generator, chat's and generate's, or from completions' batch): each
choice gets its final output's mask in the request's format, and upstream's own
response builder, which reads `output.sampling_mask` where it declares the field (the
generate route, 0.28-0.32), sees none to turn into lists. (The routes end to end:
tests/http/test_generate_route.py, tests/http/test_openai_routes.py,
tests/http/test_packed_format.py.)"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.patches.http._full_response import (MaskedBody, batch_finals, fill_masks,
                                                             full_response_with_masks, mask_payload)
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

pytestmark = pytest.mark.release_tier  # CI runs it on every release


class Response(SimpleNamespace):
    pass


def output(index, mask=None, reason=None, error=None):
    return SimpleNamespace(index=index, sampling_mask=mask, sampling_mask_reason=reason,
                           sampling_mask_error=error)


def respond(results, packed=False):
    """Drive `full_response_with_masks` over a builder like upstream's: it reads
    every result, then builds one choice per final output from what it reads
    there (`sampling_mask` as 0.32's generate route reads it)."""
    seen = []

    async def build(request, result_generator):
        last = None
        async for res in result_generator:
            last = res
        seen.extend(o.sampling_mask for o in last.outputs)
        return Response(choices=[SimpleNamespace(index=o.index, sampling_mask=None)
                                 for o in last.outputs])

    async def engine():
        for outputs in results:
            yield SimpleNamespace(outputs=outputs)

    request = SimpleNamespace(sampling_mask_format="packed" if packed else "lists")
    response = asyncio.run(full_response_with_masks(build, (request, engine()), {},
                                                    Response))
    return response, seen


@pytest.mark.parametrize("packed", [False, True])
def test_each_choice_gets_its_final_mask_and_upstream_sees_none(packed):
    one, two = SamplingMask.from_lists([[3, 12], [7]]), SamplingMask.from_lists([[5]])
    logprobs = SamplingMask(np.array([4, 9], np.int32), np.array([0, 2]),
                            np.array([-0.5, -1.0], np.float32), np.array([-0.25], np.float32))
    response, seen = respond([[output(0, one), output(1, two), output(2, logprobs),
                               output(3, reason="wider")]], packed)
    assert seen == [None] * 4
    masks = [one, two, logprobs]
    got = [c.sampling_mask for c in response.choices[:3]]
    assert got == [m.to_packed() if packed else m.token_ids for m in masks]
    if not packed:
        assert response.choices[2].sampling_mask_logprobs == [[-0.5, -1.0]]
        assert response.choices[2].sampling_mask_log_kept == [-0.25]
    last = response.choices[3]
    assert last.sampling_mask is None and last.sampling_mask_reason == "wider"


def test_a_mask_error_raises_before_upstream_builds_anything():
    with pytest.raises(SamplingMaskGenerationError, match="wider than"):
        respond([[output(0, error="sampling mask: wider than --max-sampling-mask-size 8")]])


def _prompts(*outputs):
    """Completions' `final_res_batch`: one final `RequestOutput` per prompt."""
    return [SimpleNamespace(outputs=list(o)) for o in outputs]


@pytest.mark.parametrize("packed", [False, True])
def test_completions_choices_are_filled_prompt_by_prompt_in_order(packed):
    """Two prompts, n = 2: upstream numbers the choices 0..3 over the prompts in
    order, each prompt's outputs indexed 0, 1; every choice gets its own prompt's
    mask, through the one fill every route uses."""
    masks = [SamplingMask.from_lists([[i, 10 + i]]) for i in range(4)]
    finals = batch_finals(_prompts([output(0, masks[0]), output(1, masks[1])],
                                   [output(0, masks[2]), output(1, masks[3])]))
    response = Response(choices=[SimpleNamespace(index=i, sampling_mask=None)
                                 for i in range(4)])
    request = SimpleNamespace(sampling_mask_format="packed" if packed else "lists")
    assert fill_masks(response, finals, request) is response
    assert [c.sampling_mask for c in response.choices] == \
        [m.to_packed() if packed else m.token_ids for m in masks]


def test_a_mask_error_of_any_prompt_raises_before_upstream_reads_the_batch():
    batch = _prompts([output(0, SamplingMask.from_lists([[1]]))],
                     [output(0, error="sampling mask: wider than --max-sampling-mask-size 8")])
    with pytest.raises(SamplingMaskGenerationError, match="wider than"):
        batch_finals(batch)


def test_fill_masks_raises_a_mask_error_before_filling_any_choice():
    response = Response(choices=[SimpleNamespace(index=i, sampling_mask=None)
                                 for i in range(2)])
    finals = {0: output(0, SamplingMask.from_lists([[1]])),
              1: output(1, error="sampling mask: wider than --max-sampling-mask-size 8")}
    with pytest.raises(SamplingMaskGenerationError, match="wider than"):
        fill_masks(response, finals, SimpleNamespace(sampling_mask_format="lists"))
    assert [c.sampling_mask for c in response.choices] == [None, None]


def _lists_response(choices: int, seed: int = 0):
    """A `/v1/completions` response (the patched protocol's classes) whose choices
    hold lists masks as the route fills them (`mask_payload`), each choice's text
    holding the mask field's own JSON, and one choice without a mask."""
    from vllm.entrypoints.openai.completion import protocol

    rng = np.random.default_rng(seed)
    masks = [SamplingMask.from_lists([np.sort(rng.choice(4096, k, replace=False)).tolist()
                                      for k in rng.integers(1, 40, 50)])
             for _ in range(choices)]
    response = protocol.CompletionResponse(model="demo", usage=protocol.UsageInfo(), choices=[
        protocol.CompletionResponseChoice(index=i, text='"sampling_mask":null "\\"')
        for i in range(choices + 1)])
    for choice, mask in zip(response.choices, masks):
        choice.sampling_mask = mask_payload(mask, packed=False)
    return response, masks


@pytest.mark.parametrize("choices", [1, 3])
def test_full_response_lists_are_written_from_their_arrays_as_json_would(choices,
                                                                         monkeypatch):
    """What the three routes send (`JSONResponse(content=generator.model_dump())`):
    the same bytes as pydantic's and `json.dumps`'s lists, each mask written from
    its arrays, once (`json_response`); the model keeps its lists."""
    from starlette.responses import JSONResponse

    written = []
    to_lists_json = SamplingMask.to_lists_json
    monkeypatch.setattr(SamplingMask, "to_lists_json",
                        lambda mask: written.append(mask) or to_lists_json(mask))
    response, masks = _lists_response(choices)
    dumped = response.model_dump()
    assert type(dumped) is MaskedBody
    sent = JSONResponse(content=dumped).body
    assert written == masks
    assert sent == JSONResponse(content=response.model_dump(mode="python")).body
    body = json.loads(sent)
    assert [c["sampling_mask"] for c in body["choices"]] == \
        [m.token_ids for m in masks] + [None]
    assert body["choices"][0]["text"] == '"sampling_mask":null "\\"'
    assert [c.sampling_mask for c in response.choices] == [m.token_ids for m in masks] + [None]
    assert json.loads(response.model_dump_json())["choices"][0]["sampling_mask"] == \
        masks[0].token_ids


def test_a_body_whose_nulls_do_not_match_its_choices_is_dumped_as_it_is():
    from starlette.responses import JSONResponse

    response, masks = _lists_response(2)
    dumped = response.model_dump()
    dumped["sampling_mask"] = None      # a null no choice owns
    body = json.loads(JSONResponse(content=dumped).body)
    assert body["sampling_mask"] is None
    assert [c["sampling_mask"] for c in body["choices"]] == \
        [m.token_ids for m in masks] + [None]
