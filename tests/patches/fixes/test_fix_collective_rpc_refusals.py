"""The fix `collective_rpc_refusals`: `POST /collective_rpc` refuses a call that cannot
run before it reaches the workers, and a worker's refusal of a reload's checkpoint,
with a 400 naming the parameter, one line, no traceback (upstream: the workers fail
and the app's catch-all answers 500 with the worker's wrapped text); afterwards the
server is healthy, not paused, and a seeded masked request gives the tokens and masks
it gave before (conftest's shared dev-mode `mask_server`, without
`--weight-transfer-config`, on every release).

The check alone (`http.rpc_check.rpc_problem`, no engine) runs here too; many more bad
calls, and a storm of them beside masked streams, are in
tests/http/test_rl_routes_hostile.py, bad checkpoints in
tests/server/test_fix_reload_weights_recovery.py."""

from __future__ import annotations

import pytest
import requests
from rl_route_checks import refused, serves_as_before

from vllm_sampling_mask.http.rpc_check import rpc_problem

pytestmark = pytest.mark.release_tier  # CI runs it on every release


RELOAD = "reload_weights"
# (body, the parameter the 400 names, words its message says)
CALLS = [
    ({"method": "no_such_method"}, "method", ("no_such_method",)),
    ({"method": "_apply_mm_cache"}, "method", ()),
    ({"method": 5}, "method", ()),
    ({"method": RELOAD, "args": ["a", "b", "c", "d"]}, "args", ()),
    ({"method": RELOAD, "kwargs": "x"}, "kwargs", ()),
    ({"method": RELOAD, "kwargs": {"weights_path": "/x"}, "timeout": -1}, "timeout", ()),
    ({"method": "sleep", "kwargs": {"lvl": 1}}, "kwargs", ("lvl",)),
    ({"method": "start_weight_update"}, "weight_transfer_config",
     ("--weight-transfer-config",)),
    # refused by the worker's checks (`reload_weights_recovery`), raised again here
    ({"method": RELOAD, "kwargs": {"weights_path": "/nonexistent-crr"}}, "weights_path",
     ("/nonexistent-crr",)),
]


def test_calls_that_cannot_run_are_400s_naming_the_parameter(mask_server, before):
    for body, parameter, words in CALLS:
        r = requests.post(mask_server + "/collective_rpc", json=body, timeout=120)
        refused(r, parameter, *words)
        message = r.json()["error"]["message"]
        assert "\n" not in message and "please check the stack trace" not in message, \
            (body, message)
    serves_as_before(mask_server, before)


def test_the_type_checks_alone():
    """`rpc_check` without classes (the release tier's slice): types only."""
    assert rpc_problem("reload_weights", (), {"weights_path": "/x"}, None) is None
    assert rpc_problem(lambda worker: 1, (), {}, None) is None       # in-process callers
    for call, parameter in (((5, (), {}, None), "method"), (("_x", (), {}, None), "method"),
                            (("m", 5, {}, None), "args"), (("m", (), "x", None), "kwargs"),
                            (("m", (), {1: 2}, None), "kwargs"),
                            (("m", (), {}, -1), "timeout"), (("m", (), {}, True), "timeout"),
                            (("m", (), {}, float("nan")), "timeout")):
        assert rpc_problem(*call)[0] == parameter, call

    class Worker:
        level = 1

        def reload_weights(self, *args, **kwargs):
            pass

        def sleep(self, level: int = 1):
            pass
    assert rpc_problem("nope", (), {}, None, (Worker,))[0] == "method"
    assert rpc_problem("level", (), {}, None, (Worker,))[0] == "method"
    assert rpc_problem("sleep", (1, 2), {}, None, (Worker,))[0] == "args"
    assert rpc_problem("sleep", (), {"lvl": 1}, None, (Worker,))[0] == "kwargs"
    assert rpc_problem("sleep", (2,), {}, None, (Worker,)) is None
    assert rpc_problem("reload_weights", (1, 2, 3), {"x": 1}, None, (Worker,)) is None
    # a weight-transfer method without a backend names the option; with one, it runs
    parameter, message = rpc_problem("start_weight_update", (), {}, None, None, False)
    assert parameter == "weight_transfer_config" and "--weight-transfer-config" in message
    assert rpc_problem("start_weight_update", (), {}, None, None, True) is None
    assert rpc_problem("reload_weights", (), {}, None, None, False) is None
