"""The fix `refusal_log`: a refused request, streamed or not, logs one line naming the
error and its parameter and no traceback (conftest's `mask_server`)."""

from __future__ import annotations

import pytest
import requests

from conftest import CHAT, CMPL, GEN
from conftest import route_body as body
from route_calls import post


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
