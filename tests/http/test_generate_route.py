"""`/inference/v1/generate` against the shared real `vllm serve` (conftest's
`mask_server`: the stock CLI, patched by the site hook, on the V1 runner natively)."""

from __future__ import annotations

import importlib
import json

import pytest
import requests

from conftest import server_runner, unique_keys

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release


@pytest.fixture(scope="module")
def server(mask_server):
    return mask_server


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(DEMO_MODEL)


def generate(base, token_ids, **sampling):
    body = {"model": DEMO_MODEL, "token_ids": token_ids, "sampling_params": sampling}
    return requests.post(base + "/inference/v1/generate", json=body, timeout=600)


def assert_healthy(base):
    assert requests.get(base + "/health", timeout=30).status_code == 200


def test_start_up_logs_that_masks_are_on_and_the_runner(server, mask_server_log):
    text = mask_server_log.read_text()
    line = next(l for l in text.splitlines() if "Sampling masks on" in l)
    # the shared server's runner: V1, or Model Runner V2 where the release has no V1
    assert ("V1 model runner" if server_runner() == "v1" else "(Model Runner V2)") in line
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


def test_logprobs_keep_the_wire_of_the_release(server, tok):
    """The route's logprobs are the release's own (a client written for it reads them
    unchanged, as prime-rl's renderers read 0.27-0.31's): `"token": "token_id:N"`
    entries (OpenAI chat shape) up to 0.31, `{"token_id": N, ...}` (the protocol's
    `GenerateLogProbs`) from 0.32; the mask does not change them."""
    protocol = importlib.import_module(patching.upstream_release().module("generate_protocol"))

    ids = tok("def main():\n    ", add_special_tokens=False)["input_ids"]
    r = generate(server, ids, temperature=1.0, top_k=20, max_tokens=4, logprobs=1, seed=2)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) == len(choice["sampling_mask"]) == 4
    for token, entry in zip(choice["token_ids"], content):
        if hasattr(protocol, "GenerateLogProbs"):
            assert entry["token_id"] == token
        else:
            assert entry["token"] == f"token_id:{token}"
        assert entry["logprob"] <= 0


def test_stop_token_and_seed_over_http(server, tok):
    """A seeded request replays; stopping on its 4th token cuts tokens and masks there."""
    ids = tok("import os\n", add_special_tokens=False)["input_ids"]
    params = dict(temperature=1.0, top_k=30, max_tokens=12, seed=3, ignore_eos=True)
    a, b = generate(server, ids, **params).json(), generate(server, ids, **params).json()
    ca, cb = a["choices"][0], b["choices"][0]
    assert ca["token_ids"] == cb["token_ids"] and ca["sampling_mask"] == cb["sampling_mask"]
    assert len(ca["sampling_mask"]) == len(ca["token_ids"]) == 12
    stop_id = ca["token_ids"][3]
    cut = ca["token_ids"].index(stop_id) + 1
    stopped = generate(server, ids, **params, stop_token_ids=[stop_id]).json()["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == ca["token_ids"][:cut]
    assert stopped["sampling_mask"] == ca["sampling_mask"][:cut]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field, params, parameter", [
    ("yes", dict(temperature=1.0, top_k=10, max_tokens=4), "return_sampling_mask"),
    (None, dict(temperature=1.0, top_k=10, max_tokens=4,
                extra_args={"return_sampling_mask": "yes"}), "return_sampling_mask"),
    (True, dict(temperature=0.0, max_tokens=4), "temperature"),
    (True, dict(temperature=1.0, top_k=500, max_tokens=4), "top_k"),   # above the limit
])
def test_bad_requests_get_400_and_server_stays_healthy(server, field, params, parameter,
                                                       stream):
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "sampling_params": params,
            "stream": stream, "return_sampling_mask": field}
    r = requests.post(server + "/inference/v1/generate", json=body, timeout=600)
    assert r.status_code == 400, r.text
    assert parameter in r.text
    assert_healthy(server)


def test_the_body_field_reaches_the_engine(server):
    params = dict(temperature=1.0, top_k=10, max_tokens=3, seed=1)
    assert len(generate(server, [5, 6, 7], **params).json()["choices"][0]
               ["sampling_mask"]) == 3
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "sampling_params": params,
            "return_sampling_mask": False}
    r = requests.post(server + "/inference/v1/generate", json=body, timeout=600)
    assert r.status_code == 200 and r.json()["choices"][0]["sampling_mask"] is None
    # greedy, untruncated: served as stock, without a mask
    (choice,) = generate(server, [5, 6, 7], temperature=0.0, max_tokens=3).json()["choices"]
    assert choice["sampling_mask"] is None and len(choice["token_ids"]) == 3


def stream_events(base, body):
    with requests.post(base + "/inference/v1/generate", json={**body, "stream": True},
                       stream=True, timeout=600) as r:
        assert r.status_code == 200, r.text
        events = [line[len(b"data: "):] for line in r.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    return [json.loads(e, object_pairs_hook=unique_keys) for e in events[:-1]]


def test_streamed_chunks_carry_their_tokens_masks_and_join_to_the_full_result(server):
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7],
            "stream_options": {"include_usage": True},
            "sampling_params": dict(temperature=0.8, top_k=20, max_tokens=12, seed=5, n=2,
                                    logprobs=0)}
    full = requests.post(server + "/inference/v1/generate", json=body, timeout=600).json()
    chunks = stream_events(server, body)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            assert len(choice["sampling_mask"]) == len(choice["token_ids"]) >= 1
            assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
            assert all(t in s for t, s in zip(choice["token_ids"], choice["sampling_mask"]))
    for want in full["choices"]:
        streamed = [c for chunk in chunks for c in chunk["choices"]
                    if c["index"] == want["index"]]
        assert [t for c in streamed for t in c["token_ids"]] == want["token_ids"]
        assert [s for c in streamed for s in c["sampling_mask"]] == want["sampling_mask"]
        assert (SamplingMask.from_response(chunks, index=want["index"])
                == SamplingMask.from_response(want))
    # said false: every choice of every chunk null, once (from 0.28 upstream writes
    # its own null, which the hand-off keeps)
    unasked = stream_events(server, {**body, "return_sampling_mask": False})
    assert sum(len(c["token_ids"]) for chunk in unasked for c in chunk["choices"]) == 24
    assert all(c["sampling_mask"] is None for chunk in unasked for c in chunk["choices"])


def test_a_mask_error_is_a_400_or_an_error_event_with_its_message(server):
    """min_p alone: a step's support outgrows the engine's limit of 128 (a request
    that asked for its mask; one that did not is served without it:
    tests/http/)."""
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "return_sampling_mask": True,
            "sampling_params": {"temperature": 1.0, "min_p": 0.005, "max_tokens": 16,
                                "seed": 0}}
    r = requests.post(server + "/inference/v1/generate", json=body, timeout=600)
    assert r.status_code == 400
    assert "--max-sampling-mask-size 128" in r.json()["error"]["message"]
    *chunks, error = stream_events(server, body)
    assert chunks, "the first steps were narrow enough to stream"
    assert error["error"]["code"] == 400
    assert "--max-sampling-mask-size 128" in error["error"]["message"]
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
