"""A request that never asked for a mask is never refused or ended because of it, over
HTTP (conftest's `mask_server`, --max-sampling-mask-size 128): served without a mask,
full or streamed, with the reason from the token it was dropped on. The rules alone:
tests/frontend/test_requests_without_a_mask_never_fail.py."""

from __future__ import annotations

import json

import pytest
import requests

from vllm_sampling_mask import SamplingMask

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body
from route_calls import masks_of, post


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
def test_a_request_that_never_asked_is_never_failed_by_the_size_limit(mask_server, route):
    # top_k above this server's limit (128), known up front: served without a mask
    r = post(mask_server, route, body(route, {"top_k": 200}))
    assert masks_of(r) == [None], r.text
    assert r.json()["choices"][0].get("sampling_mask_reason") is None
    # asking for it is still the clear 400 up front
    r = post(mask_server, route, body(route, {"top_k": 200}, return_sampling_mask=True))
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
    # top_p alone: a step wider than 128 ids; served to its end, mask null with why
    r = post(mask_server, route, body(route, {"top_p": 0.999, "max_tokens": 4, "seed": 5,
                                              "ignore_eos": True}))
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["finish_reason"] == "length" and choice["sampling_mask"] is None
    assert "--max-sampling-mask-size 128" in choice["sampling_mask_reason"]
    with pytest.raises(ValueError, match="more than --max-sampling-mask-size 128"):
        SamplingMask.from_response(choice)
    assert requests.get(mask_server + "/health", timeout=30).status_code == 200


def test_a_stream_that_never_asked_carries_null_and_the_reason_from_the_drop_on(mask_server):
    payload = body(GEN, {"top_p": 0.999, "max_tokens": 6, "seed": 5, "ignore_eos": True},
                   stream=True)
    with requests.post(mask_server + GEN, json=payload, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line and line != b"data: [DONE]"]
    choices = [c for chunk in chunks for c in chunk.get("choices", [])]
    assert sum(len(c.get("token_ids") or []) for c in choices) == 6
    assert all("error" not in chunk for chunk in chunks), chunks
    dropped = [i for i, c in enumerate(choices) if c.get("sampling_mask_reason")]
    assert dropped, choices
    # from the first chunk that lost it on, every chunk is null with the reason
    assert all(c["sampling_mask"] is None and c["sampling_mask_reason"]
               for c in choices[dropped[0]:])
    assert all(c["sampling_mask"] is not None for c in choices[:dropped[0]])
    with pytest.raises(ValueError, match="sampling mask dropped from this token on"):
        SamplingMask.from_response(chunks)
