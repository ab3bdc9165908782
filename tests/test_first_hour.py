"""What a new user met in the first hour, on the shared real server (conftest's
`mask_server`: V1 runner, float32, --max-sampling-mask-size 128, demo model with
V = 4096 ids): readable 400s on the three routes, one log line per refused streamed
request, `top_k` at or above the vocabulary size, the dtype on `/v1/models`; and from
the second pass (issue 27): a request that never asked for a mask is never refused or
ended because of it."""

from __future__ import annotations

import json

import pytest
import requests

from vllm_sampling_mask import DEMO_MODEL, SamplingMask

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body

V = 4096


def post(base, route, payload, **kwargs):
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return requests.post(base + route, data=data, timeout=120,
                         headers={"Content-Type": "application/json"}, **kwargs)


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


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "full"])
@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
def test_a_refused_request_logs_one_line(mask_server, mask_server_log, route, stream):
    """Streamed or not, a refusal logs one `Request refused in ...` line naming the
    error and its parameter, and no traceback."""
    before = mask_server_log.stat().st_size
    greedy = ({"temperature": 0.0} if route == GEN else {})
    payload = body(route, greedy, return_sampling_mask=True,
                   **({"stream": True} if stream else {}))
    if route != GEN:
        payload["temperature"] = 0.0
    r = post(mask_server, route, payload)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert requests.get(mask_server + "/health", timeout=30).status_code == 200
    with open(mask_server_log) as f:
        f.seek(before)
        logged = f.read()
    refused = [line for line in logged.splitlines() if "Request refused in " in line]
    assert len(refused) == 1, logged[-3000:]
    assert "(temperature): temperature=0.0 is greedy" in refused[0]
    assert "Traceback" not in logged and "stream generator." not in logged, logged[-3000:]


def masks_of(r):
    assert r.status_code == 200, r.text
    return [c["sampling_mask"] for c in r.json()["choices"]]


@pytest.mark.parametrize("route", [GEN, CMPL])
def test_top_k_at_or_above_the_vocabulary_means_no_top_k(mask_server, route):
    # switch null: no mask, as with top_k=0 (nothing truncates); a real top-k has one
    for top_k in (V, V + 1, 5000):
        assert masks_of(post(mask_server, route, body(route, {"top_k": top_k}))) == [None]
    assert masks_of(post(mask_server, route, body(route, {"top_k": 0}))) == [None]
    (mask,) = masks_of(post(mask_server, route, body(route, {"top_k": 20})))
    assert mask is not None and all(len(s) <= 20 for s in mask)
    # switch true: answered exactly as top_k=0 is (this server's limit, 128, is below
    # V, so a full-vocabulary step ends the request with the step's size error, not
    # an up-front top_k refusal); with top_p it truncates and is served
    answers = []
    for top_k in (0, V, 5000):
        r = post(mask_server, route, body(route, {"top_k": top_k, "seed": 3},
                                          return_sampling_mask=True))
        answers.append((r.status_code, r.json().get("error", {}).get("param")))
        assert "top_k=" not in r.text, r.text
    assert answers[0] == answers[1] == answers[2], answers
    r = post(mask_server, route, body(route, {"top_k": 5000, "top_p": 0.5, "seed": 3},
                                      return_sampling_mask=True))
    (mask,) = masks_of(r)
    assert mask is not None and len(mask) == 2


def test_models_route_says_the_dtype(mask_server):
    cards = requests.get(mask_server + "/v1/models", timeout=30).json()["data"]
    # one card per served name (the shared server answers to "demo" and the path)
    assert {c["id"] for c in cards} == {"demo", DEMO_MODEL}
    assert all(c["dtype"] == "float32" for c in cards)


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
