"""Calls of the three routes as the HTTP tests make them: a body sent as it is written
(a dict as JSON, or raw text), and the masks of a full response's choices."""

from __future__ import annotations

import json

import requests


def post(base, route, payload, **kwargs):
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return requests.post(base + route, data=data, timeout=120,
                         headers={"Content-Type": "application/json"}, **kwargs)


def masks_of(r):
    assert r.status_code == 200, r.text
    return [c["sampling_mask"] for c in r.json()["choices"]]
