"""The fix `rpc_refusal_log`: a `/collective_rpc` reload refused by its checks leaves
one log line in the engine core and at most one in the worker, no traceback (upstream:
three tracebacks), and the server serves on as before (conftest's shared dev-mode
`mask_server`, on every release)."""

from __future__ import annotations

import time

import pytest
import requests
from rl_route_checks import refused, serves_as_before

pytestmark = pytest.mark.release_tier  # CI runs it on every release


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
