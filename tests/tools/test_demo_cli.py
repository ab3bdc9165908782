"""`python -m vllm_sampling_mask.demo` when its server cannot start (issue 27, item
5): a port already taken is a one-line error naming it, before any start-up; a server
that exits is reported with its log file and the log's last lines. No engine starts."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from conftest import free_port
from vllm_sampling_mask.tools import demo


def test_a_port_in_use_is_one_line_naming_it_before_anything_starts():
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        r = subprocess.run([sys.executable, "-m", "vllm_sampling_mask.tools.demo", "--port",
                            str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith(f"demo: error: port {port} is already in use"), r.stderr
    assert "--port" in err[-1] and "Traceback" not in r.stderr
    assert "starting:" not in r.stdout            # no server was started
    assert demo.port_problem(free_port()) is None


def test_a_server_that_exits_points_to_its_log_and_shows_its_last_lines(tmp_path):
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('loading'); "
             "print('OSError: [Errno 98] Address already in use'); sys.exit(1)"],
            stdout=log, stderr=subprocess.STDOUT)
        with pytest.raises(demo.ServerExited) as raised:
            demo.wait_healthy(f"http://127.0.0.1:{free_port()}", proc, timeout=60,
                              server_log=str(log_path))
    message = str(raised.value)
    assert "exited with code 1" in message and str(log_path) in message
    assert "Address already in use" in message


def test_the_progress_line_is_the_last_line_vllm_logged(tmp_path):
    """While the server starts, the demo shows the last line vLLM's logger wrote,
    without its prefix; a Python warning's source line after it is no news."""
    log = tmp_path / "serve.log"
    log.write_text("")
    assert demo.last_log_line(str(log)) == "starting Python and importing vLLM"
    log.write_text(
        "(APIServer pid=12) INFO 12-01 09:00:01 [api_server.py:10] Starting vLLM API server\n"
        "/x/site-packages/torch/distributed/c10d.py:1: FutureWarning: reduce_op is deprecated\n"
        '  wrapper = lookup(vars(value).get("kernel"))\n')
    assert demo.last_log_line(str(log)) == "Starting vLLM API server"
    log.write_text("a line from no logger\n")
    assert demo.last_log_line(str(log)) == "a line from no logger"
    log.write_text("(EngineCore pid=3) WARNING 12-01 09:00:02 [x.py:1] " + "y" * 200 + "\n")
    assert demo.last_log_line(str(log)) == "y" * 97 + "..."
