"""Hostile input on vLLM's RL routes (dev mode), against one server of the demo model
(the release's runner: V1 natively, Model Runner V2 where the release has no V1 runner;
masks on, float32): bounded to a few seconds of calls.

- Bad input, each on its own: malformed JSON, wrong types, unknown or private
  `collective_rpc` methods, arguments that do not fit, bad checkpoints, bad query
  values, a wrong HTTP method: every answer a 4xx JSON body without a traceback, never
  a 5xx (`collective_rpc_refusals` and `reload_weights_recovery` turn the
  `collective_rpc` ones from 500s into 400s); afterwards the server is healthy and
  not paused.
- A storm while masked streams run: threads pause (keep mode) and resume, send bad
  `collective_rpc` calls and reloads of a truncated checkpoint, reset the prefix
  cache and ask the pause state, all at once; no answer is a 5xx, nothing is left
  paused once the storm's own resumes are in, every stream finishes with all its
  tokens, and every mask agrees with the independent transformers reference of its
  token (`conftest.reference_support`).

The abort and weight-transfer routes' cases here (a `request_ids` that is no list of
strings, unknown body fields, a server without a weight-transfer backend) were 500s
or 200s upstream (`rl_route_bodies`, `abort_request_ids`; tests/http/test_rl_route_bodies.py
has them on every release).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import free_port, hf_logits, host_env, reference_support, server_runner

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import serving
from vllm_sampling_mask.http.rpc_check import rpc_problem

SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95}
PROMPT = [1, 412, 1290, 87, 2043, 615, 33, 1800]
TOKENS = 48


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hostile") / "truncated")
    shutil.copytree(DEMO_MODEL, path)
    file = os.path.join(path, "model.safetensors")
    with open(file, "rb") as f:
        data = f.read()
    with open(file, "wb") as f:
        f.write(data[:len(data) // 2])
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-hostile") / "vllm-serve.log"
    with serving(free_port(), str(log), runner=server_runner(),
                 env={"VLLM_SERVER_DEV_MODE": "1", **host_env()}) as base:
        yield base


def rpc(body) -> tuple:
    return ("POST", "/collective_rpc", {"json": body})


RELOAD = "reload_weights"
BAD_INPUT = [
    ("POST", "/collective_rpc", {"data": "{not json"}),
    ("POST", "/collective_rpc", {"data": b"\xff\xfe\x00"}),
    rpc([1, 2]), rpc({}), rpc({"method": None}), rpc({"method": 5}),
    rpc({"method": ["reload_weights"]}), rpc({"method": ""}),
    rpc({"method": "no_such_method"}), rpc({"method": "__init__"}),
    rpc({"method": "__class__"}), rpc({"method": "_apply_mm_cache"}),
    rpc({"method": "model_runner"}),
    rpc({"method": RELOAD, "kwargs": "x"}), rpc({"method": RELOAD, "kwargs": [1]}),
    rpc({"method": RELOAD, "kwargs": {"bogus": 1}}),
    rpc({"method": RELOAD, "args": 5}), rpc({"method": RELOAD, "args": "abc"}),
    rpc({"method": RELOAD, "args": ["a", "b", "c", "d"]}),
    rpc({"method": RELOAD, "args": [None, "/x"], "kwargs": {"weights_path": "/y"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": 5}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": ["x"]}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": ""}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": "/nonexistent"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": "Qwen/Qwen3-0.6B"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": "/etc/hostname"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": "/proc"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_iterator": "x"}}),
    rpc({"method": RELOAD, "kwargs": {"is_checkpoint_format": "no"}}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": DEMO_MODEL}, "timeout": "soon"}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": DEMO_MODEL}, "timeout": -1}),
    rpc({"method": RELOAD, "kwargs": {"weights_path": DEMO_MODEL}, "timeout": True}),
    rpc({"method": "reset_prefix_cache", "args": [1, 2, 3, 4, 5]}),
    # no --weight-transfer-config on this server (upstream: 500 from the worker)
    rpc({"method": "start_weight_update"}), rpc({"method": "finish_weight_update"}),
    rpc({"method": "update_weights", "kwargs": {"update_info": {}}}),
    rpc({"method": "init_weight_transfer_engine", "kwargs": {"init_info": {}}}),
    ("POST", "/pause", {"params": {"mode": "bogus"}}),
    ("POST", "/pause", {"params": {"clear_cache": "maybe"}}),
    ("POST", "/update_weight_version", {"data": "nope"}),
    ("POST", "/update_weight_version", {"json": {"new_version": 5}}),
    ("POST", "/update_weight_version", {"json": [1]}),
    ("POST", "/update_weights", {"json": {}}),
    ("POST", "/init_weight_transfer_engine", {"data": "x"}),
    ("POST", "/weight_checker", {"json": {"bogus": 1}}),
    ("POST", "/abort_requests", {"data": "x"}),
    ("POST", "/abort_requests", {"json": {"request_ids": 5}}),
    ("POST", "/abort_requests", {"json": {"request_ids": [1, None]}}),
    ("POST", "/start_weight_update", {}),
    ("POST", "/start_weight_update", {"json": {"bogus": 1}}),
    ("POST", "/finish_weight_update", {"json": {}}),
    ("POST", "/update_weights", {"json": {"update_info": {}}}),
    ("POST", "/init_weight_transfer_engine", {"json": {"init_info": {}}}),
    ("POST", "/reset_prefix_cache", {"params": {"reset_running_requests": "maybe"}}),
    ("GET", "/pause", {}), ("GET", "/collective_rpc", {}),
]


def answer(base: str, method: str, path: str, kw: dict) -> requests.Response:
    return requests.request(method, base + path, timeout=120, **kw)


def assert_refused_cleanly(r: requests.Response, what) -> None:
    assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:300])
    assert "Traceback" not in r.text and 'File "' not in r.text, (what, r.text[:300])
    json.loads(r.text)


@pytest.mark.release_tier
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


def test_bad_input_is_refused_with_a_4xx_and_the_server_serves_on(server):
    for case in BAD_INPUT:
        assert_refused_cleanly(answer(server, *case), case)
    assert requests.get(server + "/health", timeout=60).status_code == 200
    assert requests.get(server + "/is_paused", timeout=60).json() == {"is_paused": False}
    r = requests.post(server + "/collective_rpc", timeout=600,
                      json={"method": RELOAD, "kwargs": {"weights_path": DEMO_MODEL}})
    assert (r.status_code, r.json()) == (200, {"results": [None]})


class Rollout:
    """One streamed /inference/v1/generate request read on a thread."""

    def __init__(self, base: str, seed: int) -> None:
        self.ids: list[int] = []
        self.masks: list[list[int]] = []
        self.error = None
        body = {"model": DEMO_MODEL, "token_ids": PROMPT, "stream": True,
                "sampling_params": {**SAMPLING, "seed": seed, "max_tokens": TOKENS,
                                    "ignore_eos": True}}
        self._thread = threading.Thread(target=self._read, args=(base, body), daemon=True)
        self._thread.start()

    def _read(self, base, body) -> None:
        try:
            with requests.post(base + "/inference/v1/generate", json=body, stream=True,
                               timeout=600) as r:
                assert r.status_code == 200, r.text[:300]
                for line in r.iter_lines(decode_unicode=True):
                    if line.startswith("data: {"):
                        for choice in json.loads(line[len("data: "):])["choices"]:
                            self.ids += choice.get("token_ids") or []
                            self.masks += choice.get("sampling_mask") or []
        except Exception as exc:   # reported by the test
            self.error = exc

    def join(self) -> None:
        self._thread.join(600)
        assert self.error is None, self.error


def test_a_storm_of_rl_calls_while_masked_streams_run(server, truncated, hf_model):
    streams = [Rollout(server, seed) for seed in (21, 22, 23)]
    rng = random.Random(0)
    bad = [case for case in BAD_INPUT if case[1] == "/collective_rpc"]
    statuses: list[tuple] = []

    def pause_resume():
        r = requests.post(server + "/pause", params={"mode": "keep", "clear_cache": "false"},
                          timeout=120)
        statuses.append(("pause", r.status_code, r.text[:200]))
        time.sleep(0.05)
        r = requests.post(server + "/resume", timeout=120)
        statuses.append(("resume", r.status_code, r.text[:200]))

    def failed_reload():
        r = requests.post(server + "/collective_rpc", timeout=600,
                          json={"method": RELOAD, "kwargs": {"weights_path": truncated}})
        statuses.append(("reload", r.status_code, r.text[:200]))
        assert r.status_code == 400, r.text[:300]

    def bad_call():
        case = rng.choice(bad)
        r = answer(server, *case)
        statuses.append((case, r.status_code, r.text[:200]))

    def other():
        path = rng.choice(["/reset_prefix_cache", "/is_paused"])
        method = "GET" if path == "/is_paused" else "POST"
        r = requests.request(method, server + path, timeout=120)
        statuses.append((path, r.status_code, r.text[:200]))

    actions = [pause_resume] * 12 + [failed_reload] * 6 + [bad_call] * 24 + [other] * 8
    rng.shuffle(actions)
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(action) for action in actions]:
            future.result()
    assert not [s for s in statuses if s[1] >= 500], [s for s in statuses if s[1] >= 500]
    assert requests.get(server + "/is_paused", timeout=60).json() == {"is_paused": False}
    for stream in streams:
        stream.join()
        assert len(stream.ids) == TOKENS and len(stream.masks) == TOKENS
        rows = hf_logits(hf_model, PROMPT, stream.ids)
        for token, support, row in zip(stream.ids, stream.masks, rows):
            surely_in, surely_out = reference_support(row, **SAMPLING)
            assert token in support
            assert surely_in <= set(support) and not (set(support) & surely_out)
    assert requests.get(server + "/health", timeout=60).status_code == 200
