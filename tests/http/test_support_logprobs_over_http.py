"""`return_sampling_mask_logprobs` on the three routes against the shared server
(conftest's `mask_server`, V1 runner), streamed and not, lists and packed: per
token, `sampling_mask_logprobs` (aligned with the mask's lists) sum to 1 in
probability, `sampling_mask_log_kept` is log S (checked against transformers'
logits on the generate route, whose prompt ids are known), every format and both
delivery modes give the same arrays (`SamplingMask.from_response`), and a request
that does not ask gets none. A non-bool value is a 400 naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
import torch

from vllm_sampling_mask import SamplingMask

from conftest import CHAT, CMPL, GEN, hf_logits, route_body

pytestmark = pytest.mark.release_tier  # CI runs it on every release

ROUTES = [GEN, CMPL, CHAT]
PROMPT_IDS = [5, 6, 7]   # the generate route's prompt in conftest.route_body
TEMPERATURE = 0.9


def body(route, stream, fmt, ask=True):
    sampling = dict(temperature=TEMPERATURE, top_k=40, top_p=0.9, max_tokens=8, seed=11,
                    ignore_eos=True)
    return route_body(route, sampling, completion_prompt="def f(x):\n    ",
                      return_token_ids=... if route == GEN else True,
                      stream=True if stream else ...,
                      sampling_mask_format=... if fmt is None else fmt,
                      return_sampling_mask_logprobs=... if ask is None else ask)


def call(base, route, stream, fmt, ask=True):
    r = requests.post(base + route, json=body(route, stream, fmt, ask), timeout=300,
                      stream=stream)
    assert r.status_code == 200, r.text[:500]
    if not stream:
        return r.json()
    return [json.loads(line[len("data: "):]) for line in r.iter_lines(decode_unicode=True)
            if line.startswith("data: {")]


def choices(response, stream):
    parts = response if stream else [response]
    return [c for p in parts for c in p.get("choices", [])]


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
@pytest.mark.parametrize("route", ROUTES)
def test_every_format_carries_the_same_normalised_logprobs(mask_server, route, stream):
    lists = call(mask_server, route, stream, "lists")
    packed = call(mask_server, route, stream, "packed")
    for c in choices(lists, stream):
        assert len(c["sampling_mask_logprobs"]) == len(c["sampling_mask"])
        assert [len(v) for v in c["sampling_mask_logprobs"]] == \
            [len(ids) for ids in c["sampling_mask"]]
        assert len(c["sampling_mask_log_kept"]) == len(c["sampling_mask"])
    for c in choices(packed, stream):
        assert set(c["sampling_mask"]) >= {"logprobs", "log_kept"}
        assert c.get("sampling_mask_logprobs") is None
    mask = SamplingMask.from_response(lists)
    assert len(mask) == 8 and mask.logprobs is not None
    assert SamplingMask.from_response(packed) == mask
    for t in range(len(mask)):
        total = torch.logsumexp(torch.from_numpy(mask.logprobs_of(t)).double(), 0).item()
        assert abs(total) <= 1e-5
    assert np.all(mask.log_kept <= 0)
    # the other delivery mode gives the very same arrays
    assert SamplingMask.from_response(call(mask_server, route, not stream, "lists")) == mask


def test_log_kept_and_logprobs_match_a_reference(mask_server, hf_model):
    choice = call(mask_server, GEN, False, None)["choices"][0]
    mask = SamplingMask.from_response(choice)
    logits = hf_logits(hf_model, PROMPT_IDS, choice["token_ids"])
    for t in range(len(mask)):
        x = logits[t].double() / TEMPERATURE
        kept = x[torch.as_tensor(mask[t].astype(np.int64))]
        ref = (kept - torch.logsumexp(kept, 0)).numpy()
        assert np.abs(mask.logprobs_of(t) - ref).max() <= 5e-5
        ref_log_kept = float(torch.logsumexp(kept, 0) - torch.logsumexp(x, 0))
        assert abs(float(mask.log_kept[t]) - ref_log_kept) <= 5e-5


@pytest.mark.parametrize("route", ROUTES)
def test_requests_that_do_not_ask_get_none(mask_server, route):
    for ask in (None, False):
        for stream in (False, True):
            for c in choices(call(mask_server, route, stream, None, ask), stream):
                assert c["sampling_mask"] is not None
                assert c.get("sampling_mask_logprobs") is None
                assert c.get("sampling_mask_log_kept") is None
            mask = SamplingMask.from_response(call(mask_server, route, stream, "packed", ask))
            assert mask.logprobs is None


@pytest.mark.parametrize("route", ROUTES)
def test_a_non_bool_is_a_400_naming_the_field(mask_server, route):
    b = body(route, False, None)
    b["return_sampling_mask_logprobs"] = "yes"
    r = requests.post(mask_server + route, json=b, timeout=300)
    assert r.status_code == 400 and "return_sampling_mask_logprobs" in r.text, r.text
    b["return_sampling_mask_logprobs"] = True
    b["return_sampling_mask"] = False
    r = requests.post(mask_server + route, json=b, timeout=300)
    assert r.status_code == 400 and "return_sampling_mask_logprobs" in r.text, r.text
    assert call(mask_server, route, False, None)["choices"][0]["sampling_mask_logprobs"]
