"""The RL routes' bad bodies and a missing weight-transfer backend are HTTP 400s, and a
refused reload leaves one log line (`rl_route_bodies`, `abort_request_ids`,
`rpc_refusal_log`), against conftest's shared dev-mode `mask_server` (no
`--weight-transfer-config`), on every release:

- `/abort_requests` (0.27.1 on; `/inference/v1/abort_requests` from 0.32) with a
  `request_ids` that is neither a string nor a list of strings, or a body that is
  no object: a 400
  naming `request_ids` (upstream: 500 "'int' object is not iterable", or 200 with
  the abort failing in a background task);
- each weight-transfer route on the release with a body it takes: a 400 naming
  `weight_transfer_config` and the option `--weight-transfer-config` (upstream:
  500, "Weight transfer not configured" from the worker);
- a field the route's endpoint does not read (`/start_weight_update {"bogus": 1}`):
  a 400 naming the field (upstream: 200, or the 500 above);
- a reload refused by its checks: the engine core's and the worker's log carry one
  line each, no traceback (upstream: three tracebacks);
- after all of them the server is healthy, not paused, and a seeded masked request
  gives the tokens and masks it gave before;
- `--tokens-only`'s `/abort_requests` (the release's own `attach_router` on an app
  without an engine): a bad `request_ids` is refused before the route's background
  abort.
"""

from __future__ import annotations

import time

import pytest
import requests
from rl_http import Stream

from vllm_sampling_mask.patches import REGISTRY
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.releases import within
from vllm_sampling_mask.http.rl_route_bodies import ROUTE_FIELDS

pytestmark = pytest.mark.release_tier  # CI runs it on every release

SEED = 31


@pytest.fixture(scope="module")
def release():
    return patching.upstream_release()


@pytest.fixture(scope="module")
def before(mask_server):
    """The seeded masked request's tokens and masks before any bad call."""
    ids, masks, finish = Stream(mask_server, seed=SEED).join()
    assert finish == "length"
    return ids, masks


def refused(r: requests.Response, parameter: str, *words: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:400])
    assert "Traceback" not in r.text
    error = r.json()["error"]
    assert error["param"] == parameter, error
    for word in words:
        assert word in error["message"], (word, error["message"])


def serves_as_before(base: str, before) -> None:
    assert requests.get(base + "/health", timeout=60).status_code == 200
    assert requests.get(base + "/is_paused", timeout=60).json() == {"is_paused": False}
    ids, masks, finish = Stream(base, seed=SEED).join()
    assert (ids, masks, finish) == (*before, "length")


def abort_paths(release) -> list[str]:
    paths = ["/abort_requests"] if within(release, "0.27.1", None) else []
    if within(release, "0.32.0", None):   # the token-in/token-out route, served here
        paths.append("/inference/v1/abort_requests")
    return paths


def test_abort_request_ids_that_cannot_run_are_400s(mask_server, release, before):
    if not abort_paths(release):
        pytest.skip(f"vLLM {release.version}'s RL routes have no /abort_requests")
    for path in abort_paths(release):
        # from 0.34 the token-in/token-out route validates its body itself
        # (`abort_request_ids` ends): the 400 is upstream's validation error, in the
        # overlay's sentence for it
        own = path == "/abort_requests" or REGISTRY["abort_request_ids"].applies_to(release)
        for ids in (5, [1, 2], ["a", 3], {"a": 1}, 1.5, True):
            r = requests.post(mask_server + path, json={"request_ids": ids}, timeout=60)
            refused(r, "request_ids", "request_ids must", *(
                () if not own else ("list of request-id strings",)
                if not isinstance(ids, list) else ("strings only",)))
        refused(requests.post(mask_server + path, json=[1], timeout=60), "body",
                "JSON object")
        # what upstream takes still runs: ids it does not know abort nothing
        for ids in (["no-such-id"], "no-such-id"):
            r = requests.post(mask_server + path, json={"request_ids": ids}, timeout=60)
            assert r.status_code == 200, r.text[:300]
    serves_as_before(mask_server, before)


def weight_routes(release) -> dict[str, dict]:
    """Each weight-transfer route of the release with a body it takes."""
    bodies = {"/init_weight_transfer_engine": {"init_info": {}},
              "/start_weight_update": {}, "/start_draft_weight_update": {},
              "/update_weights": {"update_info": {}}, "/finish_weight_update": {}}
    present = {path for path, since, until, _ in ROUTE_FIELDS
               if within(release, since, until)}
    if not within(release, "0.27.1", None):
        present.discard("/start_draft_weight_update")
    return {path: body for path, body in bodies.items() if path in present}


def test_weight_transfer_routes_without_a_backend_are_400s(mask_server, release, before):
    for path, body in weight_routes(release).items():
        r = requests.post(mask_server + path, json=body, timeout=120)
        refused(r, "weight_transfer_config", "--weight-transfer-config", path)
    # 0.27.1 on: upstream's start route reads no body
    if within(release, "0.27.1", None):
        refused(requests.post(mask_server + "/start_weight_update", timeout=120),
                "weight_transfer_config", "--weight-transfer-config")
    serves_as_before(mask_server, before)


def test_unknown_body_fields_are_400s_naming_the_field(mask_server, release, before):
    for path, body in weight_routes(release).items():
        r = requests.post(mask_server + path, json={**body, "bogus": 1}, timeout=120)
        refused(r, "bogus", f"{path} has no field 'bogus'")
    r = requests.post(mask_server + "/start_weight_update", data="[1]", timeout=120,
                      headers={"Content-Type": "application/json"})
    refused(r, "body", "JSON object")
    serves_as_before(mask_server, before)


def test_a_refused_reload_logs_one_line_per_process(mask_server, mask_server_log, before):
    start = mask_server_log.stat().st_size
    r = requests.post(mask_server + "/collective_rpc", timeout=120, json={
        "method": "reload_weights", "kwargs": {"weights_path": "/nonexistent-w2"}})
    refused(r, "weights_path", "/nonexistent-w2")
    deadline = time.monotonic() + 30
    while True:
        with open(mask_server_log, errors="replace") as f:
            f.seek(start)
            new = f.read()
        lines = [line for line in new.splitlines() if "/nonexistent-w2" in line]
        if any("refused in the engine core" in line for line in lines) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert any("collective_rpc refused in the engine core: reload_weights refused "
               "(weights_path)" in line for line in lines), new[-3000:]
    assert "Traceback" not in new, new[-3000:]
    # the worker (a process of its own under the multiprocessing executor) likewise
    workers = [line for line in lines if "refused in the worker" in line]
    assert len(workers) <= 1 and "WorkerProc hit an exception" not in new, new[-3000:]
    serves_as_before(mask_server, before)


def test_the_tokens_only_abort_route_refuses_before_its_background_task(release):
    """`--tokens-only`'s `/abort_requests` as the release's own `attach_router` adds
    it (up to 0.31 inside `attach_router`; from 0.32 `abort_router`), on an app
    with no engine: a bad `request_ids` is refused before the route's background
    abort (upstream answered 200, or 500 here where no engine is reachable). From
    0.34 upstream validates the body itself (`AbortRequestsRequest`; the fork's
    `abort_request_ids` ends there): FastAPI's validation error, a 422 on this bare
    app, which vLLM's server answers with 400."""
    import importlib
    from argparse import Namespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.exceptions import VLLMValidationError

    app = FastAPI()
    app.state.args = Namespace(tokens_only=True)
    importlib.import_module(release.module("generate_router")).attach_router(app)
    client = TestClient(app)
    patched = REGISTRY["abort_request_ids"].applies_to(release)
    for body, parameter in (({"request_ids": 5}, "request_ids"),
                            ({"request_ids": [1]}, "request_ids"), ([1], "body")):
        if not patched:
            r = client.post("/abort_requests", json=body)
            assert r.status_code == 422, r.text
            assert all(parameter in error["loc"] for error in r.json()["detail"]), r.text
            continue
        with pytest.raises(VLLMValidationError) as refusal:
            client.post("/abort_requests", json=body)
        assert refusal.value.parameter == parameter, refusal.value
