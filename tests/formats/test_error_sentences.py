"""Request errors as a person reads them: what `formats.error_sentences` says for a
schema error without a route, a refusal raised while building sampling parameters and a
refusal's one log line; the serving loggers' filter (`refusal_log`); `top_k` at or above
the vocabulary size (`validation.resolve_request`); and misplaced mask fields. No
engine. The patches' own tests: tests/patches/fixes/test_fix_validation_messages.py
(the routes' schema 400s), test_fix_logit_bias_keys.py, test_fix_shutdown_log.py,
test_fix_server_signals.py, test_fix_refusal_log.py."""

from __future__ import annotations

import logging

import pytest

from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.formats.error_sentences import describe, refusal_line
from vllm_sampling_mask.frontend.validation import resolve_request

pytestmark = pytest.mark.release_tier  # CI runs it on every release

V = 4096


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
