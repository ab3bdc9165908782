"""Request errors as a person reads them: the wording of schema 400s (`messages`,
patch `validation_messages`), the one log line of a refusal (`refusal_log`), and
`top_k` at or above the vocabulary size (`validation.resolve_request`); and what a
shutdown asked for leaves (`shutdown_log`, `server_signals`). No engine:
the three routes' real request models behind the patched handler, in FastAPI's test
client."""

# (no `from __future__ import annotations`: FastAPI reads the routes' annotations)

import json
import logging
from argparse import Namespace

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient

from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.formats.error_sentences import describe, refusal_line
from vllm_sampling_mask.frontend.validation import resolve_request

pytestmark = pytest.mark.release_tier  # CI runs it on every release

GEN, CMPL, CHAT = "/inference/v1/generate", "/v1/completions", "/v1/chat/completions"
V = 4096


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


def test_describe_without_a_route():
    # a field whose nullability is unknown is not said to take null
    assert describe([{"type": "bool_type", "loc": ("body", "stream"), "msg": "x",
                      "input": "yes"}]) == ("stream", "stream must be true or false, not 'yes'.")
    # several fields: each said, worst first, at most three
    errors = [{"type": "int_parsing", "loc": ("body", f"f{i}"), "msg": "x", "input": "a"}
              for i in range(5)]
    param, message = describe(errors)
    assert param == "f0" and message.count("must be an integer") == 3
    assert message.endswith("(2 more problems.)")


def test_a_refusal_raised_while_building_sampling_params_names_its_field():
    """0.24's `SamplingParams` refuses a value with a plain ValueError, which pydantic
    reports at `sampling_params`: the parameter its message starts with is named."""
    error = {"type": "value_error", "loc": ("body", "sampling_params"),
             "msg": "Value error, top_k must be 0 (disable), or at least 1, got -2.",
             "input": {"top_k": -2}, "ctx": {"error": ValueError(
                 "top_k must be 0 (disable), or at least 1, got -2.")}}
    assert describe([error]) == ("sampling_params.top_k",
                                 "top_k must be 0 (disable), or at least 1, got -2.")
    # a message naming no sampling parameter stays at sampling_params
    error["ctx"] = {"error": ValueError("something else")}
    assert describe([error])[0] == "sampling_params"


def test_a_logit_bias_key_that_is_no_token_id_names_logit_bias():
    """What the OpenAI requests' `to_sampling_params` meets: upstream names
    `logit_bias` for a key `int()` does not take (vLLM #46612, 0.27.1 on); on 0.24,
    whose bare `int()` raised a plain ValueError, the `logit_bias_keys` patch does."""
    patching.apply_all()
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    with pytest.raises(VLLMValidationError) as caught:
        SamplingParams.from_optional(logit_bias={"abc": 1.0, "7": 2.0})
    assert caught.value.parameter == "logit_bias" and "'abc'" in str(caught.value)
    # keys int() takes are converted, biases clamped, as upstream does
    assert SamplingParams.from_optional(logit_bias={"7": 200.0}).logit_bias == {7: 100.0}


def test_a_refusal_is_one_log_line():
    from vllm.exceptions import VLLMValidationError
    line = refusal_line(VLLMValidationError("temperature=0.0 is greedy,\n  so no mask.",
                                            parameter="temperature"), "stream generator")
    assert "\n" not in line
    assert line.startswith("Request refused in stream generator: VLLMValidationError "
                           "(temperature): temperature=0.0 is greedy, so no mask.")


def test_the_serving_loggers_log_a_refusal_without_traceback(caplog):
    """The filter the `refusal_log` patch puts on the routes' serving loggers: a client
    error logged with `logger.exception` (upstream's stream generators) becomes one
    line; a server error keeps its traceback."""
    patching.apply_all()
    from vllm.exceptions import VLLMValidationError

    from vllm_sampling_mask.patches.http.fixes.refusal_log import LOGGERS, OneLineRefusals
    for name in LOGGERS:
        log = logging.getLogger(name)
        assert any(isinstance(f, OneLineRefusals) for f in log.filters), name
        with caplog.at_level(logging.INFO, logger=name):
            caplog.clear()
            try:
                raise VLLMValidationError("top_k=200 is too wide", parameter="top_k")
            except VLLMValidationError:
                log.exception("Error in completion stream generator.")
            try:
                raise RuntimeError("a bug")
            except RuntimeError:
                log.exception("Error in completion stream generator.")
        refused, bug = caplog.records[-2:]
        assert refused.exc_info is None and refused.levelname == "INFO"
        assert refused.getMessage() == ("Request refused in completion stream generator: "
                                        "VLLMValidationError (top_k): top_k=200 is too wide "
                                        "(parameter=top_k)")
        assert bug.exc_info is not None and bug.levelname == "ERROR"


def resolve(requested, top_k, top_p=1.0, vocab_size=V, max_size=4096):
    return resolve_request(engine_on=True, requested=requested, temperature=1.0,
                           top_k=top_k, top_p=top_p, min_p=0.0, max_size=max_size,
                           vocab_size=vocab_size)


@pytest.mark.parametrize("top_k", [V, V + 1, 5000, 10 ** 6])
def test_top_k_at_or_above_the_vocabulary_is_no_top_k(top_k):
    """Whatever the switch: null -> no mask (nothing truncates), as with top_k=0;
    true -> a mask, never refused for a support that cannot exceed V <= limit."""
    assert resolve(None, top_k) == resolve(None, 0) == (False, None)
    assert resolve(True, top_k) == resolve(True, 0) == (True, None)
    assert resolve(None, top_k, top_p=0.9) == (True, None)   # top_p still truncates
    # a limit below the vocabulary: like top_k=0 (a step wider than the limit ends
    # the request), not refused up front
    assert resolve(True, top_k, max_size=128) == resolve(True, 0, max_size=128) == (True, None)


def test_a_top_k_between_the_limit_and_the_vocabulary_is_still_refused():
    wants, (param, message) = resolve(True, 200, max_size=128)
    assert not wants and param == "top_k" and "--max-sampling-mask-size 128" in message
    assert resolve(True, V - 1, max_size=128)[1][0] == "top_k"
    assert resolve(None, V - 1) == (True, None)     # a real top-k below V truncates


def test_a_shutdown_asked_for_logs_no_engine_dead_traceback(caplog):
    """The `shutdown_log` patch: while `AsyncLLM.shutdown` runs, the output handler's
    EngineDeadError is one INFO line; outside a shutdown it keeps its traceback."""
    patching.apply_all()
    from vllm.v1.engine.exceptions import EngineDeadError

    from vllm_sampling_mask.patches.frontend.fixes import shutdown_log
    log = logging.getLogger("vllm.v1.engine.async_llm")

    def handler_fails():
        try:
            raise EngineDeadError()
        except EngineDeadError:
            log.exception("AsyncLLM output_handler failed.")

    with caplog.at_level(logging.INFO, logger=log.name):
        shutdown_log._in_progress[0] += 1
        try:
            handler_fails()
        finally:
            shutdown_log._in_progress[0] -= 1
        handler_fails()
    quiet, loud = caplog.records[-2:]
    assert quiet.exc_info is None and quiet.levelname == "INFO"
    assert quiet.getMessage().startswith("[shutdown] AsyncLLM: output handler stopped")
    assert loud.exc_info is not None and loud.levelname == "ERROR"


def test_the_http_server_leaves_sigterm_to_vllms_own_handlers():
    """The `server_signals` patch (0.24): the uvicorn server `serve_http` builds
    installs no SIGINT/SIGTERM handler of its own, so on SIGTERM vLLM's handlers
    stop the engine client before the HTTP server stops (uvicorn's own closed the
    port at once). Every other uvicorn name `serve_http` reads is uvicorn's."""
    import importlib
    import signal

    import uvicorn

    from vllm_sampling_mask.patches import REGISTRY

    release, record = patching.upstream_release(), REGISTRY["server_signals"]
    if not record.applies_to(release):
        pytest.skip(f"a 0.24 patch (this is vLLM {release.version}): 0.27.1 registers "
                    "its handlers after uvicorn's (vLLM #49668), 0.28 on builds a server "
                    "that installs none (#50916)")
    patching.apply_all()
    launcher = importlib.import_module(record.targets_for(release)[0])
    server = launcher.uvicorn.Server(uvicorn.Config(FastAPI()))
    assert isinstance(server, uvicorn.Server) and launcher.uvicorn.Config is uvicorn.Config
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with server.capture_signals():
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    # stock uvicorn takes SIGTERM over inside the same block (what the patch prevents)
    with uvicorn.Server(uvicorn.Config(FastAPI())).capture_signals():
        assert signal.getsignal(signal.SIGTERM) != before[0]


def test_misplaced_mask_fields_and_generate_sampling_fields_name_the_right_place():
    """Issue 27, item 3 (plain rules; tests/http/ sends them)."""
    from vllm_sampling_mask.formats.error_sentences import misplaced_field, param_in_message

    declared = {"model", "token_ids", "sampling_params", "stream", "return_sampling_mask",
                "return_sampling_mask_logprobs", "sampling_mask_format"}

    def found(body, generate=True):
        return misplaced_field(body, declared=declared, generate=generate)

    for wrong, right in (("return_sampling_masks", "return_sampling_mask"),
                         ("Return-Sampling-Mask", "return_sampling_mask"),
                         ("return_sampling_mask_logprob", "return_sampling_mask_logprobs"),
                         ("sampling_masks_format", "sampling_mask_format")):
        param, message = found({wrong: True})
        assert param == right and repr(wrong) in message and "top level" in message
    param, message = found({"sampling_params": {"return_sampling_mask": True}})
    assert param == "return_sampling_mask" and "beside sampling_params" in message
    param, message = found({"top_k": 5})
    assert param == "sampling_params.top_k" and message.startswith("top_k goes inside")
    assert found({"top_k": 5}, generate=False) is None     # the OpenAI routes take it
    param, message = found({"extra_body": {"return_sampling_mask": True}}, generate=False)
    assert param == "return_sampling_mask" and "extra_body" in message
    # everything else keeps upstream's handling
    for body in ({"foo": 1}, {"return_mask": True}, {"sampling_mask": [[1]]},
                 {"return_token_ids": True}, {"sampling_params": {"extra_args": {
                     "return_sampling_mask": True}}}, [], "x"):
        assert found(body) is None, body
    assert param_in_message("top_k must be 0 (disable), or at least 1, got -2.") == "top_k"
    assert param_in_message("n must be at least 1, got 0.") == "n"
    assert param_in_message("something must be done") is None
