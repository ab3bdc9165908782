"""`/v1/models` says each served name's dtype (the `models_dtype` patch; conftest's
`mask_server`, float32)."""

from __future__ import annotations

import requests

from vllm_sampling_mask import DEMO_MODEL


def test_models_route_says_the_dtype(mask_server):
    cards = requests.get(mask_server + "/v1/models", timeout=30).json()["data"]
    # one card per served name (the shared server answers to "demo" and the path)
    assert {c["id"] for c in cards} == {"demo", DEMO_MODEL}
    assert all(c["dtype"] == "float32" for c in cards)
