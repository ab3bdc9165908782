"""A full (not streamed) response's masks without a server (`patches._http.
full_response_with_masks`): each choice gets its final output's mask in the request's
format, and upstream's own response builder, which reads `output.sampling_mask`
where it declares the field (the generate route, 0.28-0.32), sees none to turn into
lists. (The routes end to end: tests/test_server.py, tests/test_openai_routes.py,
tests/test_packed_wire_http.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.patches._http import full_response_with_masks
from vllm_sampling_mask.sampling_mask import SamplingMask


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
