"""The fix `rl_route_bodies`: the weight-transfer routes' bad bodies and a missing
weight-transfer backend are HTTP 400s, against conftest's shared dev-mode
`mask_server` (no `--weight-transfer-config`), on every release:

- each weight-transfer route on the release with a body it takes: a 400 naming
  `weight_transfer_config` and the option `--weight-transfer-config` (upstream:
  500, "Weight transfer not configured" from the worker);
- a field the route's endpoint does not read (`/start_weight_update {"bogus": 1}`):
  a 400 naming the field (upstream: 200, or the 500 above);
- after them the server is healthy, not paused, and a seeded masked request gives
  the tokens and masks it gave before.

The abort routes' bodies (`abort_request_ids`), `/collective_rpc`'s (`rpc_route_body`)
and a refused reload's log (`rpc_refusal_log`) have their files in
tests/patches/fixes/.
"""

from __future__ import annotations

import pytest
import requests
from rl_route_checks import refused, serves_as_before

from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.releases import within
from vllm_sampling_mask.http.rl_route_bodies import ROUTE_FIELDS

pytestmark = pytest.mark.release_tier  # CI runs it on every release


@pytest.fixture(scope="module")
def release():
    return patching.upstream_release()


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
