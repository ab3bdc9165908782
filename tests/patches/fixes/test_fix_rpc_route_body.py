"""The fix `rpc_route_body`: `POST /collective_rpc` with a JSON body that is not an
object (an array, a string, a number, null) is a 400 saying the body must be a JSON
object, on every release (conftest's shared dev-mode `mask_server`). Up to 0.31 the
fix gives it (upstream called `.get` on the body: a 500 "'list' object has no
attribute 'get'"); from 0.32 upstream's route checks it itself, in the same words.
Afterwards the server is healthy, not paused, and a seeded masked request gives the
tokens and masks it gave before."""

from __future__ import annotations

import pytest
import requests
from rl_route_checks import serves_as_before

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_a_body_that_is_no_object_is_a_400(mask_server, before):
    for body in ("[1, 2]", '["reload_weights"]', '"reload_weights"', "5", "null"):
        r = requests.post(mask_server + "/collective_rpc", data=body, timeout=120,
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (body, r.status_code, r.text[:400])
        assert "Request body must be a JSON object" in r.text, (body, r.text[:400])
        assert "Traceback" not in r.text and "has no attribute" not in r.text, r.text
    serves_as_before(mask_server, before)
