"""`top_k` at or above the vocabulary size (V = 4096 on the demo model) is no top-k:
no mask unasked, and asked, the answer top_k=0 gets (conftest's `mask_server`)."""

from __future__ import annotations

import pytest

from conftest import CMPL, GEN
from conftest import route_body as body
from route_calls import masks_of, post


V = 4096


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
