"""A bounded soak against the shared real `vllm serve` (conftest's `mask_server`,
started with `VLLM_SAMPLING_MASK_DEBUG_STATE=1`): `scripts/soak.py`'s clients for
~25 s, all three routes, streamed or not, random sampling parameters and random
disconnects; then the state route must show nothing left behind. The full run
(64 clients, 120 s, mask on vs off, RSS) is `python scripts/soak.py`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time

import pytest
import requests

from conftest import SERVER_MAX_MASK_SIZE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DURATION = 25.0
CLIENTS = 32


def load_soak():
    spec = importlib.util.spec_from_file_location(
        "soak_script", os.path.join(ROOT, "scripts", "soak.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


soak = load_soak()


@pytest.fixture(scope="module")
def report(mask_server):
    return asyncio.run(soak.run_phase(
        mask_server, duration=DURATION, clients=CLIENTS, mask_server=True, seed=11,
        abort_rate=0.25, mask_limit=SERVER_MAX_MASK_SIZE, progress=5.0,
        measure_rss=False, settle_timeout=20.0))   # the stop disconnects every client


def test_the_load_ran_and_exercised_every_path(report):
    assert report["completed"] > 0 and report["aborted"] > 0
    # clients went away mid-stream, mid-request, and all at once at the stop
    assert report["aborted_streamed"] > 0 and report["aborted_full"] > 0
    assert report["aborted_at_stop"] > 0
    assert all(n > 0 for n in report["by_route"].values()), report["by_route"]
    assert report["tokens"] > 0 and report["masked_tokens"] > 0
    # the route counted requests while they were in flight: it is not trivially zero
    assert report["state_busiest_total"] > 0


def test_no_5xx_no_broken_connections_no_unexpected_4xx(report):
    assert report["status_5xx"] == 0, report["examples"]
    assert report["connection_errors"] == 0, report["examples"]
    # 4xx only for the few requests without a top-k, whose support may outgrow
    # the server's --max-sampling-mask-size
    assert report["unexpected_4xx"] == 0, report["examples"]


def test_every_completed_choice_has_a_valid_mask(report):
    assert report["mask_violations"] == 0, report["examples"]
    assert report["missing_choices"] == 0, report["examples"]   # n = 2: both choices


def test_no_per_request_state_is_left_behind(report):
    state = report["state_after"]
    assert state is not None, "the server has no state route"
    assert state["total"] == 0, state
    op = state["api_server"]["output_processor"]
    assert op == {"request_states": 0, "parent_requests": 0,
                  "sampling_mask_accumulators": 0}
    core = state["engine_core"]
    assert set(core["scheduler"]) >= {"requests", "running", "waiting"}
    assert all(v == 0 for v in core["scheduler"].values()), core
    assert all(v == 0 for v in core["kv_cache"].values()), core
    (worker,) = core["workers"]
    assert worker["runner"] == "v1" and worker["requests"] == 0
    assert worker["input_batch_requests"] == 0 and worker["pending_sampling_mask"] == 0


def test_the_state_route_counts_an_in_flight_request(report, mask_server):
    """While a long stream is open, every layer counts it; once closed, none does."""
    body = {"model": soak_model(mask_server), "token_ids": [5, 6, 7], "stream": True,
            "return_sampling_mask": True,
            "sampling_params": {"temperature": 1.0, "top_k": 10, "max_tokens": 400,
                                "ignore_eos": True}}
    with requests.post(mask_server + "/inference/v1/generate", json=body, stream=True,
                       timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()   # kept: a discarded iterator closes the connection
        first = next(line for line in lines if line)   # it has started
        busy = requests.get(mask_server + soak.STATE_PATH, timeout=60).json()
        rest = [line for line in lines if line]
    # 400 tokens in all, then [DONE] (a loaded server may put two tokens in one chunk)
    assert rest[-1] == b"data: [DONE]"
    assert sum(len(json.loads(line[len(b"data: "):])["choices"][0]["token_ids"])
               for line in [first, *rest[:-1]]) == 400
    op = busy["api_server"]["output_processor"]
    assert op["request_states"] == 1 and op["sampling_mask_accumulators"] == 1
    core = busy["engine_core"]
    assert core["scheduler"]["requests"] == 1 and core["kv_cache"]["blocks_in_use"] > 0
    assert core["workers"][0]["requests"] == 1
    # finished: the engine core drops it at once, the worker at the engine's next step
    assert wait_for_zero(mask_server)["total"] == 0


def soak_model(base) -> str:
    return requests.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]


def wait_for_zero(base, timeout=20.0) -> dict:
    deadline = time.time() + timeout
    while True:
        state = requests.get(base + soak.STATE_PATH, timeout=60).json()
        if state["total"] == 0 or time.time() > deadline:
            return state
        time.sleep(0.25)


def test_the_route_exists_only_with_the_variable(monkeypatch):
    from fastapi import FastAPI

    from vllm_sampling_mask.patches import apply as patching
    from vllm_sampling_mask.patches.http.diagnostics import debug_state
    from vllm_sampling_mask.patches.engine.diagnostics import debug_state_core

    monkeypatch.delenv(debug_state_core.ENV, raising=False)
    app = FastAPI()
    assert debug_state.register(app) is False
    assert debug_state.PATH not in {r.path for r in app.routes}
    # nor is the engine core's method set
    class Core:
        pass

    class Module:
        EngineCore = Core

    debug_state_core.apply(Module, patching.upstream_release())
    assert not hasattr(Core, debug_state_core.METHOD)

    monkeypatch.setenv(debug_state_core.ENV, "1")
    app = FastAPI()
    assert debug_state.register(app) is True
    assert debug_state.PATH in {r.path for r in app.routes}
    debug_state_core.apply(Module, patching.upstream_release())
    assert callable(getattr(Core, debug_state_core.METHOD))


def test_upstream_build_app_has_the_route_only_with_the_variable(monkeypatch):
    """Through the patched `build_app` itself (no engine needed to build the app)."""
    from vllm_sampling_mask.patches import apply as patching

    patching.apply_patch("debug_state")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_sampling_mask.patches.http.diagnostics import debug_state
    from vllm_sampling_mask.patches.engine.diagnostics import debug_state_core
    build_app = patching.upstream("build_app", "app")
    args = patching.upstream("make_arg_parser", "cli_args")(
        FlexibleArgumentParser()).parse_args([])
    monkeypatch.delenv(debug_state_core.ENV, raising=False)
    paths = {r.path for r in build_app(args, ("generate",)).routes}
    assert "/health" in paths and debug_state.PATH not in paths
    monkeypatch.setenv(debug_state_core.ENV, "1")
    paths = {r.path for r in build_app(args, ("generate",)).routes}
    assert debug_state.PATH in paths
