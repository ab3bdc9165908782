"""The test harness itself: what tests/conftest.py does in each pytest-xdist worker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

CONFTEST = os.path.join(os.path.dirname(__file__), "conftest.py")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or torch.cuda.is_available(),
                    reason="conftest binds workers to cores only on a CPU host with "
                           "two or more cores")
@pytest.mark.parametrize("worker, slot", [("gw0", 0), ("gw1", 1), ("gw2", 0), ("gw5", 1)])
def test_every_worker_id_gets_its_slots_cores(worker, slot):
    """xdist names a worker that replaces a crashed one gw2, gw3, ...: conftest must
    import there too, bound to the cores of the slot it fills. (It once bound such a
    worker to no core, `torch.set_num_threads(0)` raised, every replacement crashed
    at start and one crash ended the run with no test reported.)"""
    cores = sorted(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"}
    env.update(PYTEST_XDIST_WORKER=worker, PYTEST_XDIST_WORKER_COUNT="2")
    probe = ("import os, runpy, torch; runpy.run_path(%r); "
             "print(os.environ['VLLM_CPU_OMP_THREADS_BIND'], torch.get_num_threads())"
             % CONFTEST)
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    mine = cores[slot::2]
    assert r.stdout.split()[-2:] == [",".join(map(str, mine)), str(len(mine))]


@pytest.mark.parametrize("worker, slot", [("gw0", 0), ("gw1", 1), ("gw3", 1)])
def test_every_worker_takes_ray_head_ports_from_its_own_share(monkeypatch, worker, slot):
    """Two workers that each start a Ray head (the framework steps run on two) must not
    pick the same block: a head binds its ports only once it is up."""
    from ray_head import port_block
    monkeypatch.setenv("VLLM_SAMPLING_MASK_TEST_PORTS", "20000-29999")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    base = port_block(60)
    assert 20000 + 5000 * slot <= base and base + 59 <= 24999 + 5000 * slot
