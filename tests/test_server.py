"""A real `vllm serve` process (the stock CLI, patched by the site hook), on the
V1 runner natively."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.demo import serving


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_log(tmp_path_factory):
    return tmp_path_factory.mktemp("serve") / "vllm-serve.log"


@pytest.fixture(scope="module")
def server(server_log):
    log = server_log
    with serving(free_port(), str(log), extra=["--max-num-seqs", "8"], runner="v1") as base:
        yield base


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(DEMO_MODEL)


def generate(base, token_ids, **sampling):
    body = {"model": DEMO_MODEL, "token_ids": token_ids, "sampling_params": sampling}
    return requests.post(base + "/inference/v1/generate", json=body, timeout=600)


def assert_healthy(base):
    assert requests.get(base + "/health", timeout=30).status_code == 200


def test_start_up_logs_that_masks_are_on_and_the_runner(server, server_log):
    text = server_log.read_text()
    line = next(l for l in text.splitlines() if "Sampling masks on" in l)
    assert "V1 model runner" in line
    assert "TRITON_INTERPRET" not in text


def test_generate_returns_one_mask_per_token(server, tok):
    ids = tok("def main():\n    ", add_special_tokens=False)["input_ids"]
    r = generate(server, ids, temperature=0.8, top_k=20, top_p=0.9, max_tokens=10,
                 logprobs=0, seed=0, n=2)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 2
    for choice in choices:
        mask = choice["sampling_mask"]
        assert len(mask) == len(choice["token_ids"]) == 10
        for token, support in zip(choice["token_ids"], mask):
            assert token in support and 1 <= len(support) <= 22
            assert support == sorted(set(support))
        assert len(choice["logprobs"]["content"]) == 10


def test_stop_token_and_seed_over_http(server, tok):
    ids = tok("import os\n", add_special_tokens=False)["input_ids"]
    newline = tok("\n", add_special_tokens=False)["input_ids"][-1]
    params = dict(temperature=1.0, top_k=30, max_tokens=40, seed=3, stop_token_ids=[newline])
    a, b = generate(server, ids, **params).json(), generate(server, ids, **params).json()
    ca, cb = a["choices"][0], b["choices"][0]
    assert ca["token_ids"] == cb["token_ids"] and ca["sampling_mask"] == cb["sampling_mask"]
    assert len(ca["sampling_mask"]) == len(ca["token_ids"])
    if ca["finish_reason"] == "stop":
        assert ca["token_ids"][-1] == newline


@pytest.mark.parametrize("params, parameter", [
    (dict(temperature=0.0, top_k=10, max_tokens=4), "temperature"),
    (dict(temperature=1.0, max_tokens=4), "top_k"),
    (dict(temperature=1.0, top_k=-1, max_tokens=4, stream=True), "top_k"),
])
def test_bad_requests_get_400_and_server_stays_healthy(server, tok, params, parameter):
    stream = params.pop("stream", False)
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "sampling_params": params,
            "stream": stream}
    r = requests.post(server + "/inference/v1/generate", json=body, timeout=600)
    assert r.status_code == 400, r.text
    assert parameter in r.text
    assert_healthy(server)


def test_streaming_still_works_and_aborted_requests_leave_server_healthy(server, tok):
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "stream": True,
            "sampling_params": {"temperature": 1.0, "top_k": 10, "max_tokens": 200,
                                "ignore_eos": True}}
    with requests.post(server + "/inference/v1/generate", json=body, stream=True,
                       timeout=600) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        assert first.startswith(b"data: ")
        assert "token_ids" in json.loads(first[len(b"data: "):])["choices"][0]
    # the client went away mid-stream: the request is aborted upstream
    r = generate(server, [5, 6, 7], temperature=1.0, top_k=10, max_tokens=3)
    assert r.status_code == 200 and len(r.json()["choices"][0]["sampling_mask"]) == 3
    assert_healthy(server)
