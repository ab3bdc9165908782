"""The pure rules behind the token-id and integer checks (`validation`), no engine."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_sampling_mask.frontend.validation import (
    bad_words_problem,
    blank_bad_word_problem,
    int64_problem,
    logit_bias_problem,
    sampling_id_problems,
    token_id_problem,
)

V = 4096


@pytest.mark.parametrize("ids", [[0], [V - 1], list(range(V)), [], np.array([5, 4095]),
                                 [np.int64(7)]])
def test_ids_inside_the_vocabulary_pass(ids):
    assert token_id_problem("stop_token_ids", ids, V) is None


@pytest.mark.parametrize("ids, bad, where", [
    ([V], "token id 4096", ""),                    # upstream's off-by-one lets this in
    ([1, 2, V], "token id 4096", "(position 2 of 3)"),
    ([-1], "token id -1", ""),
    ([10 ** 20], "token id 100000000000000000000", ""),
    ([1, 1.5], "1.5", "(position 1 of 2)"),
    (["a"], "'a'", ""),
    ([True], "True", ""),
])
def test_ids_outside_name_parameter_value_position_and_range(ids, bad, where):
    parameter, message = token_id_problem("stop_token_ids", ids, V)
    assert parameter == "stop_token_ids"
    assert message.startswith("stop_token_ids: ")
    assert bad in message and where in message
    assert "[0, 4095]" in message


def test_the_first_bad_id_is_reported_and_what_names_it():
    _, message = token_id_problem("prompt_token_ids", [3, -2, V], V, what="prompt ids")
    assert message.startswith("prompt ids: token id -2 (position 1 of 3)")


def test_logit_bias_keys_and_values():
    assert logit_bias_problem(None, V) is None
    assert logit_bias_problem({0: -100.0, V - 1: 100}, V) is None
    assert "token id 4096" in logit_bias_problem({V: 1.0}, V)[1]
    assert "token id -1" in logit_bias_problem({-1: 1.0}, V)[1]
    for bias in (float("nan"), float("inf"), -float("inf"), "x", None):
        parameter, message = logit_bias_problem({5: bias}, V)
        assert parameter == "logit_bias" and "logit_bias[5]" in message
        assert "finite number" in message


def test_sampling_ids_report_every_bad_parameter():
    assert sampling_id_problems(vocab_size=V) == []
    assert sampling_id_problems(vocab_size=V, allowed_token_ids=[1], logit_bias={2: 1.0},
                                stop_token_ids=[V - 1]) == []
    problems = sampling_id_problems(vocab_size=V, allowed_token_ids=[V],
                                    logit_bias={-1: 0.5}, stop_token_ids=[V])
    assert [p for p, _ in problems] == ["allowed_token_ids", "logit_bias", "stop_token_ids"]


def test_int64_fields():
    big = 2 ** 63
    assert int64_problem({"top_k": big - 1, "seed": -big, "stop": ["x"], "f": 1e300}) is None
    parameter, message = int64_problem({"n": 1, "top_k": 10 ** 20})
    assert parameter == "top_k" and "100000000000000000000" in message
    assert "64-bit" in message
    assert int64_problem({"seed": -big - 1})[0] == "seed"
    # nested: lists, dict keys and values (extra_args travels to the engine too)
    assert int64_problem({"stop_token_ids": [1, big]})[0] == "stop_token_ids"
    assert int64_problem({"logit_bias": {big: 1.0}})[0] == "logit_bias"
    assert int64_problem({"extra_args": {"k": [{"x": big}]}})[0] == "extra_args"
    assert int64_problem({"flag": True}) is None


def test_bad_words_encodings():
    assert bad_words_problem(["foo"], [[1, 2], [3]], V) is None
    assert bad_words_problem([], None, V) is None
    parameter, message = bad_words_problem(["foo"], [[1, V]], V)
    assert parameter == "bad_words" and "4096" in message and "[0, 4095]" in message


def test_whitespace_only_bad_words():
    assert blank_bad_word_problem(None) is None
    assert blank_bad_word_problem(["foo", " bar", "x\n"]) is None
    for word in ("\n", " ", "\t \n"):
        parameter, message = blank_bad_word_problem(["ok", word])
        assert parameter == "bad_words" and repr(word) in message
        assert "whitespace only" in message and "logit_bias" in message
