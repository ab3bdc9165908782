"""The fix `abort_request_ids`: the abort routes refuse a `request_ids` that is neither
a string nor a list of strings, or a body that is no object, with a 400 naming it, on
every release (conftest's shared dev-mode `mask_server`; where the fix ends, 0.34, the
token-in/token-out route's 400 is upstream's validation):

- `/abort_requests` (0.27.1 on; `/inference/v1/abort_requests` from 0.32): a 400
  naming `request_ids` (upstream: 500 "'int' object is not iterable", or 200 with the
  abort failing in a background task); afterwards the server is healthy, not paused,
  and a seeded masked request gives the tokens and masks it gave before;
- `--tokens-only`'s `/abort_requests` (the release's own `attach_router` on an app
  without an engine): a bad `request_ids` is refused before the route's background
  abort.
"""

from __future__ import annotations

import pytest
import requests
from rl_route_checks import refused, serves_as_before

from vllm_sampling_mask.patches import REGISTRY
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.releases import within

pytestmark = pytest.mark.release_tier  # CI runs it on every release


@pytest.fixture(scope="module")
def release():
    return patching.upstream_release()


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
