"""`--api-key` guards the routes that change the server (`rl_routes_auth`).

In process, on the release's own `AuthenticationMiddleware` (the patch applied on
its import) in front of an app that answers every path: each guarded route is 401
without the key (and with a wrong one) and reaches the app with it; the open routes
reach the app either way; the same middleware without the patch
(`__call__.__wrapped__`, upstream's) lets the guarded routes through, which is what
the checks below would catch.

Against a dev-mode `vllm serve --api-key` of the demo model: the RL loop's routes
(pause / resume / is_paused, the cache resets, `/collective_rpc` `reload_weights`,
the weight-version routes) are 401 without the key and change nothing, and do
their work with it; `/v1/*` is 401 without the key as upstream has it, `/health`
and `/metrics` answer without it. A server without a key serves these routes to
any caller as before (tests/http/test_rl_routes_hostile.py runs them keyless).
"""

from __future__ import annotations

import importlib

import pytest
import requests
from conftest import free_port, host_env, server_runner

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import serving
from vllm_sampling_mask.patches.apply import upstream_release
from vllm_sampling_mask.http.rl_routes import GUARDED_PATHS, guarded

KEY = "sk-test-rl-routes"
OPEN = ("/health", "/metrics", "/ping", "/load", "/version", "/tokenize", "/server_info")


def _middleware():
    return importlib.import_module(upstream_release().module("auth")).AuthenticationMiddleware


def _client(middleware_class):
    from starlette.testclient import TestClient

    async def app(scope, receive, send):      # answers every path with 200
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"reached"})
    middleware = middleware_class(app, tokens=[KEY])

    async def asgi(scope, receive, send):     # as Starlette's middleware stack calls it
        await middleware(scope, receive, send)
    return TestClient(asgi)


@pytest.mark.release_tier
def test_the_patch_is_on_the_releases_middleware():
    assert hasattr(_middleware().__dict__["__call__"], "__wrapped__")


@pytest.mark.release_tier
@pytest.mark.parametrize("path", sorted(GUARDED_PATHS) + ["/fault_tolerance/apply"])
def test_each_guarded_route_needs_the_key(path):
    client = _client(_middleware())
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = client.post(path, headers=headers)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), headers
    r = client.post(path, headers={"Authorization": f"Bearer {KEY}"})
    assert (r.status_code, r.text) == (200, "reached")
    assert client.post(path + "/").status_code == 401
    assert client.options(path).status_code == 200      # CORS preflight, as upstream


@pytest.mark.release_tier
@pytest.mark.parametrize("path", OPEN)
def test_the_open_routes_stay_open(path):
    assert not guarded(path)
    assert _client(_middleware()).get(path).status_code == 200


@pytest.mark.release_tier
def test_upstreams_middleware_lets_the_guarded_routes_through():
    """What the checks above catch: without the patch only /v1, /v2, /inference
    need the key."""
    stock = type("Stock", (_middleware(),),
                 {"__call__": _middleware().__dict__["__call__"].__wrapped__})
    client = _client(stock)
    assert client.post("/v1/completions").status_code == 401
    assert [p for p in sorted(GUARDED_PATHS) if client.post(p).status_code == 200] == \
        sorted(GUARDED_PATHS)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-api-key") / "vllm-serve.log"
    with serving(free_port(), str(log), runner=server_runner(), extra=["--api-key", KEY],
                 env={"VLLM_SERVER_DEV_MODE": "1", **host_env()}) as base:
        yield base


def _call(base, method, path, key=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, base + path, headers=headers, timeout=600, **kw)


RELOAD = {"method": "reload_weights", "kwargs": {"weights_path": DEMO_MODEL}}
ROUTES = [("POST", "/pause", {"params": {"mode": "keep"}}), ("GET", "/is_paused", {}),
          ("POST", "/resume", {}), ("POST", "/reset_prefix_cache", {}),
          ("POST", "/reset_mm_cache", {}), ("POST", "/reset_encoder_cache", {}),
          ("POST", "/collective_rpc", {"json": RELOAD}),
          ("POST", "/update_weight_version", {"json": {"new_version": "keyed"}}),
          ("GET", "/weight_info", {})]


def test_the_rl_routes_refuse_a_caller_without_the_key_and_change_nothing(server):
    before = _call(server, "GET", "/weight_info", KEY).json()
    for method, path, kw in ROUTES:
        for key in (None, "wrong"):
            r = _call(server, method, path, key, **kw)
            assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), path
    assert _call(server, "GET", "/is_paused", KEY).json() == {"is_paused": False}
    assert _call(server, "GET", "/weight_info", KEY).json() == before
    assert _call(server, "GET", "/v1/models").status_code == 401       # upstream's
    assert _call(server, "GET", "/health").status_code == 200
    assert _call(server, "GET", "/metrics").status_code == 200


def test_with_the_key_they_do_their_work(server):
    r = _call(server, "POST", "/pause", KEY, params={"mode": "keep"})
    assert r.status_code == 200, r.text
    assert _call(server, "GET", "/is_paused", KEY).json() == {"is_paused": True}
    assert _call(server, "POST", "/resume", KEY).status_code == 200
    assert _call(server, "GET", "/is_paused", KEY).json() == {"is_paused": False}
    assert _call(server, "POST", "/reset_prefix_cache", KEY).status_code == 200
    r = _call(server, "POST", "/collective_rpc", KEY, json=RELOAD)
    assert r.status_code == 200, r.text
    r = _call(server, "POST", "/update_weight_version", KEY, json={"new_version": "keyed"})
    assert r.status_code == 200, r.text
    assert _call(server, "GET", "/weight_info", KEY).json() == {"weight_version": "keyed"}
    r = _call(server, "POST", "/v1/completions", KEY,
              json={"model": DEMO_MODEL, "prompt": "def f", "max_tokens": 4})
    assert r.status_code == 200, r.text
