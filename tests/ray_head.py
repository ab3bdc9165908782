"""A Ray head of a test's own, for the framework tests whose rollout servers are Ray
actors (SkyRL's, verl's): on the loopback address, every port inside the test's block,
stopped with its process group at the end."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time

HEAD_PORTS = 8           # the head's own ports: base .. base + 7
WORKER_PORTS = (20, 49)  # its workers' ports: base + 20 .. base + 49


# Every process of a head's cluster on loopback: Ray resolves "127.0.0.1" in an address to
# the host's own interface address unless its cluster switch is off
# (`ray._private.services.get_node_ip_address`), and vLLM's engines in its actors pick
# that address for their rendezvous unless VLLM_HOST_IP names one.
# Ray reads its switch once, at import: import this module before `ray`.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "VLLM_HOST_IP": "127.0.0.1"}
os.environ.update(LOOPBACK_ENV)     # this process and every process it starts

_handed_out: list[range] = []   # blocks this process gave out (a head binds its ports late)


def port_block(size: int) -> int:
    """The first port of `size` consecutive free loopback ports, inside
    VLLM_SAMPLING_MASK_TEST_PORTS when set, and outside every block this process
    handed out before. Under pytest-xdist each worker searches its own share of the
    span (its slot: the worker's id modulo the count), so that two workers never pick
    the same block before either head has bound it."""
    span = os.environ.get("VLLM_SAMPLING_MASK_TEST_PORTS", "20000-29999")
    first, last = (int(p) for p in span.split("-"))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and count > 1:
        share = (last + 1 - first) // count
        first += int(worker.removeprefix("gw")) % count * share
        last = first + share - 1
    for base in range(first, last + 2 - size, size):
        if any(base < r.stop and r.start < base + size for r in _handed_out):
            continue
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        _handed_out.append(range(base, base + size))
        return base
    raise RuntimeError(f"no {size} free consecutive ports in {span}")


@contextlib.contextmanager
def ray_head(ray, *, size: int = 60, num_cpus: int = 2, num_gpus: int = 0,
             env: dict | None = None,
             prefix: str = "ray-head-", runtime_env: dict | None = None):
    """Start a head on 127.0.0.1 with `num_cpus` and `num_gpus` logical GPUs (none by
    default; logical ones let GPU bundles and `num_gpus=1` actors schedule), every
    process on loopback (`LOOPBACK_ENV`, set in this process too), connect `ray` to it,
    and yield the first port of its block (ports past base + 49 are free for the test's
    servers); on exit disconnect and stop the head's process group."""
    from ray._private import ray_constants
    if ray_constants.ENABLE_RAY_CLUSTER:
        raise RuntimeError("ray was imported before tests/ray_head.py: its drivers would "
                           "look for the head at the host's interface address; import "
                           "ray_head first (or set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0)")
    base = port_block(size)
    env = {**(os.environ if env is None else env), **LOOPBACK_ENV}
    temp = tempfile.mkdtemp(prefix=prefix)
    # a loopback head without Ray's token authentication, which a token file left in
    # ~/.ray (any `ray.init()` of a local cluster writes one) would turn on for the
    # head but not for this process's `ray.init(address=...)` (InvalidAuthToken)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    lo, hi = WORKER_PORTS
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={base}",
         f"--node-manager-port={base + 1}", f"--object-manager-port={base + 2}",
         f"--dashboard-agent-listen-port={base + 3}", f"--dashboard-agent-grpc-port={base + 4}",
         f"--runtime-env-agent-port={base + 5}", f"--metrics-export-port={base + 6}",
         f"--ray-client-server-port={base + 7}", f"--min-worker-port={base + lo}",
         f"--max-worker-port={base + hi}", "--include-dashboard=false",
         f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", f"--temp-dir={temp}",
         "--disable-usage-stats"],
        stdout=open(os.path.join(temp, "head.log"), "w"), stderr=subprocess.STDOUT,
        start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                ray.init(address=f"127.0.0.1:{base}", logging_level="WARNING",
                         runtime_env=runtime_env)
                break
            except Exception:   # noqa: BLE001 - the head is still coming up
                if time.monotonic() > deadline or head.poll() is not None:
                    raise
                time.sleep(1)
        yield base
    finally:
        try:
            ray.shutdown()
        finally:
            os.killpg(head.pid, 15)
            head.wait(120)
