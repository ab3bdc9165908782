"""`sampling_mask_format` on the three routes against the shared server (conftest's
`mask_server`, V1 runner): "packed" returns the packed object (`packed_wire`),
"lists" and no field return lists, both decode to the same masks, streamed and
not; any other value is a 400 naming the field, and the server keeps serving."""

from __future__ import annotations

import json

import pytest
import requests

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.formats.packed_wire import PACKED_FORMAT

from conftest import CHAT, CMPL, GEN, route_body

pytestmark = pytest.mark.release_tier  # CI runs it on every release

ROUTES = [GEN, CMPL, CHAT]


def body(route, stream, fmt, n=1):
    sampling = dict(temperature=1.0, top_k=40, top_p=0.95, max_tokens=8, seed=5,
                    ignore_eos=True, n=n)
    return route_body(route, sampling, completion_prompt="def f(x):\n    ",
                      return_token_ids=... if route == GEN else True,
                      stream=True if stream else ..., sampling_mask_format=fmt)


def call(base, route, stream, fmt, n=1):
    r = requests.post(base + route, json=body(route, stream, fmt, n), timeout=300,
                      stream=stream)
    assert r.status_code == 200, r.text[:500]
    if not stream:
        return r.json()
    chunks = []
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("data: {"):
            chunks.append(json.loads(line[len("data: "):]))
    return chunks


def mask_values(response, stream):
    parts = response if stream else [response]
    return [c["sampling_mask"] for p in parts for c in p.get("choices", [])]


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
@pytest.mark.parametrize("route", ROUTES)
def test_packed_and_lists_carry_the_same_masks(mask_server, route, stream):
    default = call(mask_server, route, stream, ...)
    lists = call(mask_server, route, stream, "lists")
    packed = call(mask_server, route, stream, "packed")
    for value in mask_values(default, stream) + mask_values(lists, stream):
        assert isinstance(value, list)
    values = mask_values(packed, stream)
    assert values and all(isinstance(v, dict) and v["format"] == PACKED_FORMAT
                          for v in values)
    want = SamplingMask.from_response(default)
    assert len(want) == 8
    assert SamplingMask.from_response(lists) == want
    assert SamplingMask.from_response(packed) == want


def test_packed_with_n_choices(mask_server):
    lists = call(mask_server, CMPL, False, "lists", n=3)
    packed = call(mask_server, CMPL, False, "packed", n=3)
    for i in range(3):
        assert SamplingMask.from_response(packed, index=i) == \
            SamplingMask.from_response(lists, index=i)


@pytest.mark.parametrize("value", ["bitmask", "", "PACKED", 1, True, ["packed"]])
@pytest.mark.parametrize("route", ROUTES)
def test_a_bad_format_is_a_400_naming_the_field(mask_server, route, value):
    b = body(route, False, value)
    r = requests.post(mask_server + route, json=b, timeout=120)
    assert r.status_code in (400, 422), (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert "sampling_mask_format" in f"{error['message']} {error.get('param') or ''}"
    assert requests.get(mask_server + "/health", timeout=30).status_code == 200
