"""No request can crash the server: a matrix of bad input on the three HTTP routes.

Every case goes to the shared real `vllm serve` (conftest's `mask_server`) and must
come back 400 (or 422 where a schema layer answers) with a non-empty message naming
the field, never a 5xx; `GET /health` must answer 200 after each. Token ids are
checked against the model's vocabulary (4096 ids on the demo model) on every route:
upstream let an id equal to the vocabulary size through and the engine died. A field
the route does not have on the installed release (`bad_words` on 0.24's
`/v1/completions`: `releases_facts`' `completion_bad_words`) is ignored as upstream
ignores any field it does not know: a 200, the server healthy.
"""

from __future__ import annotations

import json
import math

import pytest
import requests

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body
from releases_facts import facts

ROUTES = (GEN, CMPL, CHAT)
V = 4096                       # the demo model's vocabulary
RANGE = f"[0, {V - 1}]"        # what the token-id messages name as the valid range
BIG = 10 ** 20                 # beyond 64 bits


@pytest.fixture(scope="module")
def server(mask_server):
    return mask_server


def post(base, route, payload):
    """`payload`: a dict (sent as JSON, NaN and Infinity included) or raw text."""
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return requests.post(base + route, data=data, timeout=120,
                         headers={"Content-Type": "application/json"})


def assert_refused(base, r, mentions=(), status=(400, 422)):
    assert r.status_code in status, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["message"].strip(), r.text
    # one sentence a person reads: no Python reprs of pydantic's error dicts, and a
    # parameter name as `param` (not `body.62`, a character offset)
    assert "{'type'" not in error["message"] and "validation error" not in error["message"]
    param = error.get("param") or ""
    assert not param.startswith("body.") and not param.split(".")[-1].isdigit(), param
    said = f"{error['message']} {error.get('param') or ''}"
    for text in mentions:
        assert text in said, (text, said[:500])
    assert requests.get(base + "/health", timeout=30).status_code == 200


NAN, INF = math.nan, math.inf

# (field, value, what the message must mention beyond the field's name): sent on every
# route, as a sampling parameter (generate: in sampling_params; chat's `logprobs` is
# its `top_logprobs`).
SAMPLING = [
    ("temperature", "hot", ()), ("temperature", -1, ()), ("temperature", 3.0, ()),
    ("temperature", NAN, ()), ("temperature", INF, ()),
    ("top_k", -2, ()), ("top_k", 1.5, ()), ("top_k", "x", ()), ("top_k", BIG, ()),
    ("top_p", 0, ()), ("top_p", 1.5, ()), ("top_p", "x", ()), ("top_p", NAN, ()),
    ("min_p", -0.1, ()), ("min_p", 1.5, ()), ("min_p", "x", ()),
    ("presence_penalty", 3, ()), ("presence_penalty", "x", ()),
    ("frequency_penalty", -3, ()), ("repetition_penalty", 0, ()),
    ("repetition_penalty", INF, ()),
    ("n", 0, ()), ("n", 1.5, ()), ("n", "x", ()), ("n", 10 ** 6, ()),
    ("max_tokens", 0, ()), ("max_tokens", -1, ()), ("max_tokens", "x", ()),
    ("max_tokens", BIG, ()),
    ("min_tokens", -1, ()), ("min_tokens", 5, ()), ("min_tokens", "x", ()),
    ("seed", "x", ()), ("seed", 1.5, ()), ("seed", 2 ** 64, ()),
    ("logprobs", -2, ()), ("logprobs", 10 ** 6, ()), ("logprobs", "x", ()),
    ("logit_bias", {"abc": 1}, ()), ("logit_bias", {"1": "x"}, ()),
    ("logit_bias", [1, 2], ()),
    ("logit_bias", {"4096": 1}, ("4096", RANGE)), ("logit_bias", {"-1": 1}, ("-1", RANGE)),
    ("allowed_token_ids", [V], ("4096", RANGE)), ("allowed_token_ids", [-1], ("-1", RANGE)),
    ("allowed_token_ids", [1, 10 ** 9], ("1000000000", RANGE)),
    ("allowed_token_ids", [], ()), ("allowed_token_ids", ["a"], ()),
    ("allowed_token_ids", 5, ()),
    ("bad_words", [""], ()), ("bad_words", [1], ()), ("bad_words", "abc", ()),
    ("bad_words", ["\n"], ("whitespace only",)),      # upstream: IndexError, HTTP 500
    ("stop", [""], ()), ("stop", 5, ()), ("stop", [5], ()),
    # upstream never range-checked these: an id == vocab size with min_tokens killed
    # the engine, a negative one silently banned another token
    ("stop_token_ids", [V], ("4096", RANGE)), ("stop_token_ids", [-1], ("-1", RANGE)),
    ("stop_token_ids", [BIG], (str(BIG),)),
    ("stop_token_ids", ["a"], ()), ("stop_token_ids", 5, ()),
]

# Whole-request cases: (route, body or raw text, what the message must mention).
REQUESTS = [
    # prompt token ids: == vocab size killed the engine (upstream's off-by-one)
    (GEN, body(GEN, token_ids=[V]), ("token_ids", "4096", RANGE)),
    (GEN, body(GEN, token_ids=[4095, V]), ("token_ids", "4096", "position 1", RANGE)),
    (GEN, body(GEN, token_ids=[BIG]), ("token_ids",)),
    (GEN, body(GEN, token_ids=[-1]), ("token_ids",)),
    (GEN, body(GEN, token_ids=[]), ("token_ids",)),
    (GEN, body(GEN, token_ids=[1.5]), ("token_ids",)),
    (GEN, body(GEN, token_ids=["a"]), ("token_ids",)),
    (GEN, body(GEN, token_ids="abc"), ("token_ids",)),
    (GEN, body(GEN, token_ids=...), ("token_ids",)),
    (GEN, body(GEN, sampling_params="x"), ("sampling_params",)),
    (GEN, body(GEN, sampling_params=None), ("sampling_params",)),
    (GEN, body(GEN, sampling_params=...), ("sampling_params",)),
    (GEN, body(GEN, stream=True, token_ids=[V]), ("4096", RANGE)),
    (GEN, body(GEN, {"stop_token_ids": [V], "min_tokens": 1}, stream=True),
     ("stop_token_ids", RANGE)),
    # the generate route takes biases as given: a non-finite one is refused
    (GEN, body(GEN, {"logit_bias": {"1": NAN}}), ("logit_bias", "finite")),
    (GEN, body(GEN, {"logit_bias": {"1": INF}}), ("logit_bias", "finite")),
    (CMPL, body(CMPL, prompt=[V]), ("prompt", "4096", RANGE)),
    (CMPL, body(CMPL, prompt=[[1, 2], [3, V]]), ("prompt", "4096", RANGE)),
    (CMPL, body(CMPL, prompt=[V], echo=True), ("prompt", "4096", RANGE)),
    (CMPL, body(CMPL, prompt=[V], stream=True), ("prompt", "4096", RANGE)),
    (CMPL, body(CMPL, prompt=[BIG]), ("prompt",)),
    (CMPL, body(CMPL, prompt=[-1]), ("prompt",)),
    (CMPL, body(CMPL, prompt=[[-1]]), ("prompt",)),
    (CMPL, body(CMPL, prompt=[]), ("prompt",)),
    (CMPL, body(CMPL, prompt=[[]]), ("prompt",)),
    (CMPL, body(CMPL, prompt=[1.5]), ("prompt",)),
    (CMPL, body(CMPL, prompt=5), ("prompt",)),
    (CMPL, body(CMPL, prompt={"a": 1}), ("prompt",)),
    (CMPL, body(CMPL, prompt=None), ("prompt",)),
    (CMPL, body(CMPL, prompt=...), ("prompt",)),
    (CMPL, body(CMPL, {"stop_token_ids": [V], "min_tokens": 1}, stream=True),
     ("stop_token_ids", RANGE)),
    (CHAT, body(CHAT, messages=...), ("messages",)),
    (CHAT, body(CHAT, messages=[]), ("conversation",)),
    (CHAT, body(CHAT, messages="hi"), ("messages",)),
    (CHAT, body(CHAT, messages=[5]), ("messages",)),
    (CHAT, body(CHAT, messages=[{"role": "user", "content": 5}]), ("messages",)),
    (CHAT, body(CHAT, messages=None), ()),
    (CHAT, body(CHAT, {"stop_token_ids": [V], "min_tokens": 1}, stream=True),
     ("stop_token_ids", RANGE)),
    (CHAT, body(CHAT, {"logprobs": True, "top_logprobs": -1}), ("logprobs",)),
    # upstream's structured-output validators raise plain ValueErrors, which
    # AsyncLLM.generate turned into an empty HTTP 500
    (CMPL, body(CMPL, structured_outputs={"regex": "("}), ("structured_outputs", "regex")),
    (CMPL, body(CMPL, structured_outputs={"json": "notjson"}), ("structured_outputs",)),
    (CHAT, body(CHAT, response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "bogus"}}}), ("structured_outputs", "bogus")),
    (CHAT, body(CHAT, response_format={"type": "bogus"}), ("response_format",)),
    (GEN, body(GEN, {"structured_outputs": {"regex": "("}}), ("structured_outputs",)),
]
for route in ROUTES:
    REQUESTS += [
        (route, body(route, return_sampling_mask="yes"), ("return_sampling_mask",)),
        (route, body(route, return_sampling_mask=1), ("return_sampling_mask",)),
        # with min_tokens the stop ids index the logits: == vocab size killed the engine
        (route, body(route, {"stop_token_ids": [V], "min_tokens": 1}),
         ("stop_token_ids", "4096", RANGE)),
        (route, body(route, {"stop_token_ids": [-1], "min_tokens": 1}),
         ("stop_token_ids", "-1", RANGE)),
        (route, "not json", ("JSON",)), (route, "{", ("JSON",)), (route, "", ("body",)),
        (route, "null", ("body",)), (route, "1", ("body",)),
        # upstream's OpenAI validators called `[].get`: HTTP 500
        (route, "[]", ("body",) if route == GEN else ("JSON object",)),
    ]


def sampling_body(route, field, value):
    if route == CHAT and field == "logprobs":
        return body(route, {"logprobs": True, "top_logprobs": value})
    return body(route, {field: value})


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("field, value, mentions", SAMPLING,
                         ids=[f"{f}={v!r}"[:40] for f, v, _ in SAMPLING])
def test_bad_sampling_parameters_are_refused(server, route, field, value, mentions):
    r = post(server, route, sampling_body(route, field, value))
    if route == CMPL and field == "bad_words" and not facts(release()).completion_bad_words:
        # not a parameter of this route on the release (vLLM #46793 added it after
        # 0.24): ignored as any field the route does not know, the request served
        assert r.status_code == 200, (r.status_code, r.text[:500])
        assert requests.get(server + "/health", timeout=30).status_code == 200
        return
    name = field  # chat's top_logprobs: upstream's message says "logprobs"
    if route == GEN and beyond_64_bits(value):
        # upstream's own check on this route (msgspec, before the input processor)
        # answers first; its message names no field
        name, mentions = "can't serialize ints", ()
    assert_refused(server, r, mentions=(name, *mentions))


def release():
    from vllm_sampling_mask.patches import apply as patching
    return patching.upstream_release()


def beyond_64_bits(value):
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, int) and not -2 ** 63 <= v < 2 ** 64 for v in values)


@pytest.mark.parametrize("route, payload, mentions", REQUESTS,
                         ids=[f"{r}:{json.dumps(p) if not isinstance(p, str) else p!r}"[:90]
                              for r, p, _ in REQUESTS])
def test_bad_requests_are_refused(server, route, payload, mentions):
    assert_refused(server, post(server, route, payload), mentions=mentions)
