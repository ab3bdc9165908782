"""The fix `token_id_validation` over HTTP, on the shared real `vllm serve` (conftest's
`mask_server`): a token id the model has no row for is refused, 400, naming the
parameter, the id, its position and the valid range; the ids at the vocabulary's
edges still generate. (Every route's matrix of bad ids: tests/http/test_bad_input.py;
the same checks through `LLM.generate`: tests/llm/test_engine.py, on its engine.)"""

from __future__ import annotations

import pytest

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body
from route_calls import post

V = 4096                       # the demo model's vocabulary


@pytest.fixture(scope="module")
def server(mask_server):
    return mask_server


def test_token_id_messages_name_parameter_value_and_range(server):
    """The one message a new user hits first, in full, on each route."""
    r = post(server, GEN, body(GEN, token_ids=[5, V]))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt_token_ids"
    message = r.json()["error"]["message"]
    assert "token id 4096 (position 1 of 2) is outside this model's vocabulary" in message
    assert "[0, 4095] (vocabulary size 4096)" in message
    r = post(server, CHAT, body(CHAT, {"allowed_token_ids": [7, V]}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids"
    assert r.json()["error"]["message"].startswith(
        "allowed_token_ids: token id 4096 (position 1 of 2) is outside")


def test_ids_at_the_edges_of_the_vocabulary_still_generate(server):
    """The checks refuse exactly the ids the model has no row for."""
    r = post(server, GEN, body(GEN, {"allowed_token_ids": [0, V - 1],
                                     "logit_bias": {"0": 1.0, str(V - 1): -1.0}},
                               token_ids=[0, V - 1]))
    assert r.status_code == 200, r.text
    assert set(r.json()["choices"][0]["token_ids"]) <= {0, V - 1}
    r = post(server, GEN, body(GEN, {"stop_token_ids": [0, V - 1], "min_tokens": 1}))
    assert r.status_code == 200, r.text
    r = post(server, CMPL, body(CMPL, {"stop_token_ids": [V - 1], "min_tokens": 1},
                                prompt=[[0], [V - 1]]))
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2
    r = post(server, CHAT, body(CHAT, {"logit_bias": {str(V - 1): 100}, "min_tokens": 2,
                                       "stop_token_ids": [V - 1]}))
    assert r.status_code == 200, r.text
