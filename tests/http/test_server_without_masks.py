"""A `vllm serve` WITHOUT --return-sampling-mask, with the overlay installed: the
fork's crash fixes hold there too, requests asking for a mask are refused with the
fix named, and everything else is served as stock (no mask)."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import free_port, host_env, server_runner

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.tools.demo import serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "vllm-serve-no-masks.log"
    with serving(free_port(), str(log), extra=["--max-num-seqs", "8"],
                 runner=server_runner(), env=host_env(), mask=False) as base:
        yield base


def generate(base, body, stream=False):
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], **body, "stream": stream}
    return requests.post(base + "/inference/v1/generate", json=body, timeout=300,
                         stream=stream)


def events(response):
    lines = [l[len(b"data: "):] for l in response.iter_lines() if l]
    assert lines[-1] == b"[DONE]"
    return [json.loads(l) for l in lines[:-1]]


def test_a_prompt_id_equal_to_the_vocabulary_size_is_a_400_and_the_engine_lives(server):
    r = generate(server, {"token_ids": [5, 4096], "sampling_params": {"max_tokens": 2}})
    assert r.status_code == 400 and "outside this model's vocabulary" in r.text, r.text
    assert requests.get(server + "/health", timeout=30).status_code == 200
    ok = generate(server, {"token_ids": [5, 4095], "sampling_params": {"max_tokens": 2}})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["token_ids"]) == 2


def test_asking_for_a_mask_names_the_flag(server):
    r = generate(server, {"return_sampling_mask": True,
                          "sampling_params": {"temperature": 1.0, "top_k": 5}})
    assert r.status_code == 400 and "--return-sampling-mask" in r.text, r.text


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
def test_asking_for_support_logprobs_names_the_flag(server, stream):
    r = generate(server, {"return_sampling_mask_logprobs": True,
                          "sampling_params": {"temperature": 1.0, "top_k": 5}}, stream)
    assert r.status_code == 400, r.text
    assert "return_sampling_mask_logprobs" in r.text and "--return-sampling-mask" in r.text
    r = requests.post(server + "/v1/completions", json={
        "model": DEMO_MODEL, "prompt": "hi", "max_tokens": 2,
        "return_sampling_mask_logprobs": True}, timeout=300)
    assert r.status_code == 400 and "--return-sampling-mask" in r.text, r.text


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("where", ["no-flag", "asked-off"])
def test_n_choices_come_back_streamed_or_not(request, where, n):
    """Upstream 0.27.1 answered n > 1 with fewer choices (non-streamed) or a 500
    "list index out of range" (streamed); the fork's fix holds with masks off: on
    this module's server, and on conftest's shared one for requests that ask for no
    mask (the release tier runs those, with no server of its own to start)."""
    if where == "no-flag":
        server, off = request.getfixturevalue("server"), {}
    else:
        server, off = request.getfixturevalue("mask_server"), {"return_sampling_mask": False}
    params = {"temperature": 1.0, "top_k": 50, "n": n, "max_tokens": 16, "seed": 3}
    for _ in range(3):      # the streamed failure depended on which child came first
        full = generate(server, {"sampling_params": params, **off})
        assert full.status_code == 200, full.text
        choices = full.json()["choices"]
        assert sorted(c["index"] for c in choices) == list(range(n))
        assert all(len(c["token_ids"]) == 16 and c.get("sampling_mask") is None
                   for c in choices)
        with generate(server, {"sampling_params": params, **off}, stream=True) as r:
            assert r.status_code == 200, r.text
            chunks = events(r)
        tokens = {}
        for chunk in chunks:
            for c in chunk["choices"]:
                tokens.setdefault(c["index"], []).extend(c["token_ids"])
        assert sorted(tokens) == list(range(n))
        assert all(len(t) == 16 for t in tokens.values())
