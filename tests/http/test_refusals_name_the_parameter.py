"""A refused request is a 400 whose one sentence names the parameter and the fix, on
the shared real server (conftest's `mask_server`) and the three routes: schema
errors, a misspelled or misplaced mask field, vLLM's own sampling refusals."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body
from route_calls import masks_of, post


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
def test_schema_400s_are_one_sentence_naming_the_parameter(mask_server, route):
    r = post(mask_server, route, body(route, return_sampling_mask="yes"))
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "return_sampling_mask must be true, false or null, not 'yes'.")
    assert r.json()["error"]["param"] == "return_sampling_mask"
    raw = json.dumps(body(route))
    r = post(mask_server, route, raw[:-1])                   # the closing brace missing
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "body", error
    assert error["message"].startswith("The request body is not valid JSON (")
    assert "\n" not in error["message"] and "{'type'" not in error["message"]


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
def test_a_misspelled_mask_field_is_a_400_naming_the_right_one(mask_server, route):
    for wrong, right in (("return_sampling_masks", "return_sampling_mask"),
                         ("return_sampling_mask_logprob", "return_sampling_mask_logprobs"),
                         ("sampling_masks_format", "sampling_mask_format")):
        r = post(mask_server, route, body(route, {"top_k": 5}, **{wrong: True}))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == right and repr(wrong) in error["message"], error
    # other unknown fields keep vLLM's handling (ignored)
    r = post(mask_server, route, body(route, {"top_k": 5}, some_other_field=1))
    assert r.status_code == 200, r.text
    assert requests.get(mask_server + "/health", timeout=30).status_code == 200


def test_a_mask_field_or_a_sampling_field_in_the_wrong_place_on_generate(mask_server):
    r = post(mask_server, GEN, body(GEN, {"top_k": 5, "return_sampling_mask": True}))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "return_sampling_mask"
    assert "top level of the body, beside sampling_params" in error["message"]
    r = post(mask_server, GEN, body(GEN, top_k=5))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "sampling_params.top_k" and "inside sampling_params" in \
        error["message"]
    # where it belongs, it works (extra_args too, as before)
    assert masks_of(post(mask_server, GEN, body(GEN, {"top_k": 5},
                                                return_sampling_mask=True)))[0]
    r = post(mask_server, CMPL, body(CMPL, {"top_k": 5},
                                     extra_body={"return_sampling_mask": True}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_sampling_mask"
    assert "extra_body is the openai client's argument" in r.json()["error"]["message"]


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
@pytest.mark.parametrize("field, value", [("top_k", -2), ("min_p", 2.0), ("n", 0)])
def test_vllms_own_sampling_refusals_name_the_parameter(mask_server, route, field, value):
    r = post(mask_server, route, body(route, {field: value}))
    assert r.status_code == 400, r.text
    param = r.json()["error"]["param"]
    assert param == (f"sampling_params.{field}" if route == GEN else field), r.json()
