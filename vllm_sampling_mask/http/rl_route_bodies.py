"""What the RL routes' request bodies may hold, checked before upstream's endpoint runs.

Plain code, no vLLM import: `patches/http/fixes/rl_route_bodies.py` asks `body_problem`
for vLLM's dev-mode RL routes (`/abort_requests`, the weight-transfer routes) and the
token-in/token-out abort routes, and refuses a body that cannot run with HTTP 400
naming the parameter and the fix.

- `/abort_requests` (`/inference/v1/abort_requests`): `request_ids` is a request-id
  string or a list of them (left out, null or empty: what upstream does with none;
  0.34's token-in/token-out route declares the same, `str | list[str]`);
- the weight-transfer routes take only the fields upstream's endpoint reads
  (`ROUTE_FIELDS`, by release): any other field is refused by name, where upstream
  ignored it and answered 200;
- every route here takes a JSON object, or no body where upstream reads none.
"""

from __future__ import annotations

import json

from vllm_sampling_mask import releases
from vllm_sampling_mask.releases import Release

__all__ = ["ABORT_PATHS", "WEIGHT_TRANSFER_PATHS", "ROUTE_FIELDS", "fields_of",
           "body_problem", "request_ids_problem", "NO_BACKEND"]

ABORT_PATHS = frozenset({"/abort_requests", "/inference/v1/abort_requests"})
# the routes that reach the worker's weight-transfer engine (none configured: the
# worker raises "Weight transfer not configured", an HTTP 500 upstream)
WEIGHT_TRANSFER_PATHS = frozenset({
    "/init_weight_transfer_engine", "/start_weight_update", "/start_draft_weight_update",
    "/update_weights", "/finish_weight_update"})

# (path, since, until, the body fields upstream's endpoint reads) over
# `releases.RELEASES`: 0.24 reads `is_checkpoint_format` from `/start_weight_update`'s
# body and no body for `/finish_weight_update`; from 0.27.1 `/start_weight_update`
# reads none and `/finish_weight_update` takes `weight_version`
ROUTE_FIELDS: tuple[tuple[str, str | None, str | None, frozenset[str]], ...] = (
    ("/init_weight_transfer_engine", None, None, frozenset({"init_info"})),
    ("/start_weight_update", None, "0.27.1", frozenset({"is_checkpoint_format"})),
    ("/start_weight_update", "0.27.1", None, frozenset()),
    ("/start_draft_weight_update", None, None, frozenset()),
    ("/update_weights", None, None, frozenset({"update_info"})),
    ("/finish_weight_update", None, "0.27.1", frozenset()),
    ("/finish_weight_update", "0.27.1", None, frozenset({"weight_version"})),
)

NO_BACKEND = ("no weight-transfer backend is configured on this server: start it with "
              "--weight-transfer-config (e.g. '{{\"backend\": \"nccl\"}}') to use {path}, or "
              "load a checkpoint with POST /collective_rpc "
              "{{\"method\": \"reload_weights\", \"kwargs\": {{\"weights_path\": DIR}}}}")


def fields_of(path: str, release: Release) -> frozenset[str] | None:
    """The body fields `path`'s endpoint reads on `release`; None for a path whose
    fields are not checked here."""
    for route, since, until, fields in ROUTE_FIELDS:
        if route == path and releases.within(release, since, until):
            return fields
    return None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def request_ids_problem(body: dict) -> tuple[str, str] | None:
    """(the parameter, what is wrong and the fix) for an abort body whose
    `request_ids` cannot run, or None."""
    ids = body.get("request_ids")
    if ids is None or isinstance(ids, str):
        return None
    if not isinstance(ids, list):
        return "request_ids", ("request_ids must be a list of request-id strings "
                               f"(e.g. [\"cmpl-1\"]) or one such string, not {_shown(ids)}")
    bad = [i for i in ids if not isinstance(i, str)]
    if bad:
        return "request_ids", ("request_ids must hold request-id strings only "
                               f"(e.g. [\"cmpl-1\"]), not {_shown(bad[0])}")
    return None


def body_problem(path: str, raw: bytes, release: Release) -> tuple[str, str] | None:
    """(the parameter, what is wrong and the fix) for a body of `path` that cannot
    run, or None. An empty body is left to upstream (it reads none, or answers its
    own 400)."""
    if not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "body", f"the body of {path} must be a JSON object, not invalid JSON"
    if not isinstance(body, dict):
        return "body", f"the body of {path} must be a JSON object, not {_shown(body)}"
    if path in ABORT_PATHS:
        return request_ids_problem(body)
    fields = fields_of(path, release)
    if fields is None:
        return None
    unknown = sorted(k for k in body if k not in fields)
    if unknown:
        takes = (f"it takes {', '.join(sorted(fields))}" if fields
                 else "it takes no fields (send {} or no body)")
        return unknown[0], (f"{path} has no field {unknown[0]!r}: {takes}")
    return None
