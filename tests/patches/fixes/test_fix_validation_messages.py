"""The fix `validation_messages`: a schema error on the three routes is one sentence
naming the parameter (`formats.error_sentences.describe`), answered by the API
server's patched validation handler. No engine: the routes' real request models (as
patched) behind that handler, in FastAPI's test client."""

# (no `from __future__ import annotations`: FastAPI reads the routes' annotations)

import json
from argparse import Namespace

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient

from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release

GEN, CMPL, CHAT = "/inference/v1/generate", "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def client():
    """The three routes' request models (as patched) behind the API server's patched
    validation handler."""
    import importlib

    from vllm_sampling_mask.patches import REGISTRY

    patching.apply_all()
    # the module whose handler the patch replaced (it moved in 0.32)
    handlers = importlib.import_module(
        REGISTRY["validation_messages"].targets_for(patching.upstream_release())[0])
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    GenerateRequest = patching.upstream("GenerateRequest", "generate_protocol")

    app = FastAPI()
    app.state.args = Namespace(log_error_stack=False)
    app.exception_handler(RequestValidationError)(handlers.validation_exception_handler)

    @app.post(GEN)
    async def generate(request: GenerateRequest):
        return {}

    @app.post(CMPL)
    async def completions(request: CompletionRequest):
        return {}

    @app.post(CHAT)
    async def chat(request: ChatCompletionRequest):
        return {}

    return TestClient(app)


def body(route, **fields):
    b = ({"model": "m", "token_ids": [1, 2], "sampling_params": {"max_tokens": 2}}
         if route == GEN else {"model": "m", "max_tokens": 2})
    if route == CMPL:
        b["prompt"] = "x"
    if route == CHAT:
        b["messages"] = [{"role": "user", "content": "hi"}]
    b.update(fields)
    return b


def refuse(client, route, payload):
    data = payload if isinstance(payload, str) else json.dumps(payload)
    r = client.post(route, content=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    return error["param"], error["message"]


def readable(param, message):
    """One sentence a person reads: no Python reprs, no pydantic boilerplate, one line,
    a parameter name (not a character offset)."""
    assert "\n" not in message and "{'type'" not in message and "validation error" \
        not in message and "Input should be" not in message, message
    assert not param.startswith("body.") and not param.split(".")[-1].isdigit(), param
    assert message.endswith("."), message


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
def test_the_documented_message_on_every_route(client, route):
    param, message = refuse(client, route, body(route, return_sampling_mask="yes"))
    assert (param, message) == (
        "return_sampling_mask", "return_sampling_mask must be true, false or null, not 'yes'.")
    param, message = refuse(client, route, body(route, return_sampling_mask=1))
    assert message == "return_sampling_mask must be true, false or null, not 1."


@pytest.mark.parametrize("route", [GEN, CMPL, CHAT])
@pytest.mark.parametrize("raw", ['{"model": "m",', "not json", '{"model": "m" "x": 1}'])
def test_malformed_json_names_the_body(client, route, raw):
    param, message = refuse(client, route, raw)
    assert param == "body"
    assert message.startswith("The request body is not valid JSON (") and "character" in message
    readable(param, message)


@pytest.mark.parametrize("route, payload, param, message", [
    (GEN, body(GEN, sampling_params={"top_k": "x"}), "sampling_params.top_k",
     "sampling_params.top_k must be an integer, not 'x'."),
    (GEN, body(GEN, token_ids=[1.5]), "token_ids[0]", "token_ids[0] must be an integer, not 1.5."),
    (GEN, body(GEN, token_ids="abc"), "token_ids", None),
    (GEN, "[]", "body", "The request body must be a JSON object, not []."),
    (GEN, "", "body", "The request has no body: send one JSON object."),
    (CMPL, body(CMPL, prompt=5), "prompt", "prompt must be a list of token ids, a list of "
     "lists of token ids, a string, a list of strings or null, not 5."),
    (CMPL, body(CMPL, stop=[5]), "stop", "stop must be a string, a list of strings or "
     "null, not [5]."),
    (CMPL, body(CMPL, top_p="x"), "top_p", "top_p must be a number or null, not 'x'."),
    (CMPL, "null", "body", "The request has no body: send one JSON object."),
    (GEN, {"sampling_params": {}}, "token_ids", "token_ids is required: add it to the request."),
    (CHAT, body(CHAT, messages="hi"), "messages", "messages must be a list, not 'hi'."),
    (CHAT, body(CHAT, messages=[{"role": "user", "content": 5}]), "messages[0].content",
     "messages[0].content must be a string or a list, not 5."),
    (CHAT, body(CHAT, messages=[5]), "messages[0]", None),
    (CHAT, body(CHAT, logit_bias=[1, 2]), "logit_bias", None),
    (CMPL, body(CMPL, logit_bias={"7": "x"}), 'logit_bias["7"]',
     """logit_bias["7"] must be a number, not 'x'."""),
    (CHAT, "[]", "body", None),
])
def test_schema_errors_name_the_parameter(client, route, payload, param, message):
    got_param, got = refuse(client, route, payload)
    assert got_param == param, got
    if message is not None:
        assert got == message
    readable(got_param, got)


@pytest.mark.parametrize("route, field", [(CMPL, "logprobs"), (CMPL, "prompt_logprobs"),
                                          (CHAT, "top_logprobs"), (CHAT, "prompt_logprobs")])
def test_a_logprobs_field_that_is_no_number_names_it(client, route, field):
    """On 0.24, whose `check_logprobs` compared the field as sent (a TypeError, a 400
    naming nothing: `Release.logprobs_compared_raw`), the request subclass refuses it
    first, a schema 400 naming it; from 0.27 upstream's own check names it (vLLM
    #49144), a client error that the app's handlers answer 400 with that parameter."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError

    model = CompletionRequest if route == CMPL else ChatCompletionRequest
    payload = body(route, **{field: "x"}, **({"logprobs": True}
                                             if field == "top_logprobs" else {}))
    if field in patching.upstream_release().logprobs_compared_raw.get(model.__name__, ()):
        param, message = refuse(client, route, payload)
        assert (param, message) == (field, f"{field} must be an integer, not 'x'.")
    else:
        with pytest.raises(VLLMValidationError) as caught:
            model.model_validate(payload)
        assert caught.value.parameter == field
