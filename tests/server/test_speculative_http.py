"""Sampling masks under speculative decoding over HTTP: one `vllm serve` with n-gram
speculation on the release's runner (V1 natively, Model Runner V2 where the release has no
V1 runner), vLLM's RL routes on (tests/llm/test_speculative.py runs the
engines in process). A streamed chunk carries the masks of every token a verify step
emitted, in lists and packed; a request paused in keep mode between verify steps keeps
exact masks; a request aborted by the engine or dropped by its client ends with the
masks it got and leaves no state behind.
"""

from __future__ import annotations

import json
import time
import types

import pytest
import requests
from conftest import assert_supports_match_reference, free_port, host_env, server_runner
from releases_facts import facts
from rl_http import TOKENS, Stream, body, no_state_left, post
from test_speculative import K, V1_CANNOT

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.patches.apply import upstream_release


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    release, runner = upstream_release(), server_runner()
    if runner == "v1" and not facts(release).v1_cpu_speculation:
        pytest.skip(V1_CANNOT)
    if runner == "mrv2" and "ngram" not in facts(release).mrv2_speculators:
        pytest.skip(f"vLLM {release.version}'s Model Runner V2 does not run n-gram "
                    "speculation (releases_facts' mrv2_speculators)")
    from vllm_sampling_mask.tools.demo import serving
    spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1}
    log = tmp_path_factory.mktemp("serve-spec") / "vllm-serve.log"
    with serving(free_port(), str(log), extra=["--speculative-config", json.dumps(spec)],
                 runner=runner, env={"VLLM_SERVER_DEV_MODE": "1",   # /pause, /resume
                                     "VLLM_SAMPLING_MASK_DEBUG_STATE": "1",
                                     **host_env()}) as base:
        yield base


def completion(base, stream: bool, fmt: str = "lists") -> list[tuple[list[int], SamplingMask]]:
    """(token ids, masks) of each response part (every streamed chunk, or the one
    response) of one seeded /v1/completions request."""
    body = {"model": DEMO_MODEL, "prompt": "the cat sat on the mat. the cat sat on the",
            "max_tokens": 48, "temperature": 0.7, "top_k": 30, "seed": 7, "ignore_eos": True,
            "return_token_ids": True, "stream": stream, "sampling_mask_format": fmt}
    r = requests.post(base + "/v1/completions", json=body, timeout=300, stream=stream)
    assert r.status_code == 200, r.text[:500]
    parts = ([json.loads(line[len("data: "):]) for line in r.iter_lines(decode_unicode=True)
              if line.startswith("data: {")] if stream else [r.json()])
    return [(c["token_ids"], SamplingMask.from_response(p))
            for p in parts for c in p["choices"] if c.get("token_ids")]


@pytest.mark.parametrize("fmt", ["lists", "packed"])
def test_streamed_chunks_carry_one_mask_per_token_of_a_multi_token_step(spec_server, fmt):
    full = completion(spec_server, stream=False, fmt=fmt)
    chunks = completion(spec_server, stream=True, fmt=fmt)
    (tokens, mask), = full
    assert len(tokens) == len(mask) == 48
    for token, support in zip(tokens, mask.token_ids):
        assert token in support
    assert [t for ids, _ in chunks for t in ids] == tokens
    assert [s for _, m in chunks for s in m.token_ids] == mask.token_ids
    for ids, m in chunks:
        assert len(m) == len(ids)
    assert max(len(ids) for ids, _ in chunks) > 1   # a verify step emitted several


def test_keep_pause_between_verify_steps_keeps_exact_masks(spec_server, hf_model):
    """A keep-mode pause freezes a speculating request between verify steps. After
    the resume its tokens may go another way than the same seeded request run
    without a pause (its first step after it verifies no drafts, so the seeded
    draws fall on other steps; stock vLLM too), but up to the pause they are the
    same, and every token's mask is the target's support at its position."""
    r = requests.post(spec_server + "/v1/completions", json=dict(body(21), stream=False),
                      timeout=300)
    assert r.status_code == 200, r.text[:300]
    (unpaused,) = r.json()["choices"]
    prompt = unpaused["prompt_token_ids"]
    stream = Stream(spec_server, seed=21)
    stream.wait_for_tokens(8)
    post(spec_server, "/pause", mode="keep")
    frozen = stream.tokens()
    time.sleep(1.0)
    assert stream.tokens() == frozen < TOKENS
    post(spec_server, "/resume")
    ids, masks, finish = stream.join()
    assert finish == "length" and len(ids) == TOKENS
    assert ids[:frozen] == unpaused["token_ids"][:frozen]
    assert masks[:frozen] == SamplingMask.from_response(unpaused).token_ids[:frozen]
    paused = types.SimpleNamespace(prompt_token_ids=prompt, outputs=[types.SimpleNamespace(
        token_ids=ids, sampling_mask=SamplingMask(token_ids=masks))])
    case = {k: body(21)[k] for k in ("temperature", "top_k", "top_p")}
    assert_supports_match_reference([paused], [case], hf_model)
    assert max(len(chunk) for _, chunk, _, _ in stream.chunks) > 1   # it speculated
    no_state_left(spec_server)


def test_aborts_end_a_speculating_request_with_the_masks_it_got(spec_server):
    stream = Stream(spec_server, seed=22)          # the engine aborts it (pause, abort)
    stream.wait_for_tokens(8)
    post(spec_server, "/pause", mode="abort")
    ids, masks, finish = stream.join()              # asserts one mask per token, each holding it
    post(spec_server, "/resume")
    assert finish == "abort" and 8 <= len(ids) < TOKENS
    no_state_left(spec_server)
    # The client goes away mid-stream: the server drops the request and its masks.
    with requests.post(spec_server + "/v1/completions", json=body(23), stream=True,
                       timeout=300) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data: {"):
                choice, = json.loads(line[len("data: "):])["choices"]
                got += len(choice.get("token_ids") or [])
            if got >= 8:
                break
    no_state_left(spec_server)
    ids, masks, finish = Stream(spec_server, seed=23).join()   # and it serves on
    assert finish == "length" and len(ids) == len(masks) == TOKENS
