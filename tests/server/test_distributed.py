"""Masks in vLLM's distributed modes, each a real `vllm serve` of the demo model on
this CPU host (V1 runner natively, Model Runner V2 where the release has no V1 runner):
tensor parallel 2, data parallel 2 (two engine cores), two API server processes. The
same checks as the single-process server tests: supports against the independent
float32 reference, the sampled token's processed logprob against the trainer-side
replay, masks equal to the single-worker server on the same seeded requests, the
per-request switch, the size limit, streaming, `n > 1` and an abort.

One server at a time (module-scoped, parametrised fixture); each takes about a
minute to start on 2 cores. Pipeline parallelism and the Ray executor are not
here: vLLM 0.27.1's CPU build fails a pipeline-parallel request with an assertion
in the worker (`sync_and_gather_intermediate_tensors`, stock vLLM too) and
refuses Ray at start-up ("current platform cpu does not support ray");
docs/distributed.md quotes both.
"""

from __future__ import annotations

import json
import time
import types

import pytest
import requests
import torch

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.training import nucleus_logprobs

from conftest import (SERVER_MAX_MASK_SIZE, SERVER_MAX_NUM_SEQS, assert_supports_match_reference,
                      free_port, hf_logits, host_env, server_runner)

# vLLM's CPU workers bind their OpenMP threads to NUMA nodes; a 2-core host has one
# node, so two workers need their cores named (one per worker here), and two data
# parallel ranks their memory node (0.34 gives rank i the i-th visible node, and a
# rank without one fails in its CPU worker: both share node 0 here).
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
MEMORY_NODES = {"data_parallel_2": {"CPU_VISIBLE_MEMORY_NODES": "0,0"}}
MODES = {
    "tensor_parallel_2": ["--tensor-parallel-size", "2"],
    "data_parallel_2": ["--data-parallel-size", "2"],
    "api_servers_2": ["--api-server-count", "2"],
}
# The shared single-worker server's limits, so the two answer the same contract.
EXTRA = ["--max-num-seqs", str(SERVER_MAX_NUM_SEQS),
         "--max-sampling-mask-size", str(SERVER_MAX_MASK_SIZE)]
CASES = [dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_k=50, top_p=0.9),
         dict(temperature=1.2, top_k=40, min_p=0.1)]


@pytest.fixture(scope="module", params=list(MODES))
def mode(request, tmp_path_factory):
    """(name, base URL, log path) of one distributed server, started once per mode."""
    from vllm_sampling_mask.tools.demo import serving
    log = tmp_path_factory.mktemp(request.param) / "vllm-serve.log"
    env = {**BIND, **MEMORY_NODES.get(request.param, {}), "VLLM_SAMPLING_MASK_DEBUG_STATE": "1",
           **host_env()}
    with serving(free_port(), str(log), extra=[*MODES[request.param], *EXTRA],
                 runner=server_runner(), env=env) as base:
        yield request.param, base, log


def ranks(mode_name):
    """The engine cores to address: each data-parallel rank by vLLM's own header."""
    if mode_name == "data_parallel_2":
        return [{"X-data-parallel-rank": "0"}, {"X-data-parallel-rank": "1"}]
    return [{}]


def generate(base, token_ids, headers=None, **body):
    body = {"model": DEMO_MODEL, "token_ids": token_ids, **body}
    return requests.post(base + "/inference/v1/generate", json=body, headers=headers or {},
                         timeout=600)


def seeded_outputs(base, tokenizer, headers=None):
    """The CASES on three prompts, seeded, as (prompt ids, choice) pairs."""
    from vllm_sampling_mask.tools.demo import DEMO_PROMPTS
    outs = []
    for i, case in enumerate(CASES):
        ids = tokenizer(DEMO_PROMPTS[i], add_special_tokens=False)["input_ids"]
        r = generate(base, ids, headers, sampling_params=dict(
            **case, max_tokens=12, seed=40 + i, logprobs=0, ignore_eos=True))
        assert r.status_code == 200, r.text
        outs.append((ids, r.json()["choices"][0]))
    return outs


def as_request_output(ids, choice):
    """An HTTP choice in the shape `conftest.assert_supports_match_reference` reads."""
    completion = types.SimpleNamespace(token_ids=choice["token_ids"],
                                       sampling_mask=SamplingMask.from_response(choice))
    return types.SimpleNamespace(prompt_token_ids=ids, outputs=[completion])


def test_supports_and_logprobs_match_the_reference_and_the_single_worker_server(
        mode, mask_server, tokenizer, hf_model):
    name, base, _ = mode
    single = seeded_outputs(mask_server, tokenizer)
    for headers in ranks(name):
        outs = seeded_outputs(base, tokenizer, headers)
        assert_supports_match_reference([as_request_output(*o) for o in outs], CASES,
                                        hf_model)
        for (ids, choice), case, (_, alone) in zip(outs, CASES, single):
            tokens = choice["token_ids"]
            assert len(choice["sampling_mask"]) == len(tokens) == 12
            returned = torch.tensor([e["logprob"] for e in choice["logprobs"]["content"]])
            replayed = nucleus_logprobs(hf_logits(hf_model, ids, tokens), torch.tensor(tokens),
                                        SamplingMask.from_response(choice),
                                        temperature=case["temperature"])
            assert torch.allclose(replayed, returned, atol=1e-4)
            # Same seeds, same float32 model: the same draw as one worker, token by
            # token, while the tokens agree (a reduction order may move a near-tie).
            agree = 0
            while agree < len(tokens) and tokens[agree] == alone["token_ids"][agree]:
                agree += 1
            assert agree >= 4, (name, tokens, alone["token_ids"])
            assert choice["sampling_mask"][:agree] == alone["sampling_mask"][:agree]


def test_switch_size_limit_n2_streaming_and_abort(mode):
    name, base, _ = mode
    for headers in ranks(name):
        params = dict(temperature=1.0, top_k=10, max_tokens=3, seed=1)
        off = generate(base, [5, 6, 7], headers, sampling_params=params,
                       return_sampling_mask=False)
        assert off.status_code == 200 and off.json()["choices"][0]["sampling_mask"] is None
        # min_p alone: a support outgrows the engine's limit (wide from the first
        # step on at this temperature, whatever the sampled path): a 400 naming it for
        # a request that asked for its mask; with the switch unset, served without one
        wide = dict(temperature=1.5, min_p=0.002, max_tokens=16, seed=0)
        r = generate(base, [5, 6, 7], headers, sampling_params=wide,
                     return_sampling_mask=True)
        assert r.status_code == 400
        assert f"--max-sampling-mask-size {SERVER_MAX_MASK_SIZE}" in r.json()["error"]["message"]
        r = generate(base, [5, 6, 7], headers, sampling_params=wide)
        assert r.status_code == 200, r.text
        (choice,) = r.json()["choices"]
        assert choice["sampling_mask"] is None
        assert f"--max-sampling-mask-size {SERVER_MAX_MASK_SIZE}" in choice["sampling_mask_reason"]
        # n = 2, streamed: every chunk's tokens carry their masks
        body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7], "stream": True,
                "sampling_params": dict(temperature=0.8, top_k=20, max_tokens=8, seed=5, n=2)}
        with requests.post(base + "/inference/v1/generate", json=body, headers=headers,
                           stream=True, timeout=600) as s:
            assert s.status_code == 200, s.text
            events = [line[6:] for line in s.iter_lines() if line]
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        for index in (0, 1):
            mask = SamplingMask.from_response(chunks, index=index)
            tokens = [t for c in chunks for ch in c["choices"] if ch["index"] == index
                      for t in ch["token_ids"]]
            assert len(mask) == len(tokens) == 8
            assert all(t in s for t, s in zip(tokens, mask.token_ids))
        # a client that goes away mid-stream: aborted, and the engine goes on
        body["sampling_params"] = dict(temperature=1.0, top_k=10, max_tokens=200, n=1,
                                       ignore_eos=True)
        with requests.post(base + "/inference/v1/generate", json=body, headers=headers,
                           stream=True, timeout=600) as s:
            next(line for line in s.iter_lines() if line)
        again = generate(base, [5, 6, 7], headers, sampling_params=params)
        assert again.status_code == 200 and len(again.json()["choices"][0]["sampling_mask"]) == 3
    assert requests.get(base + "/health", timeout=30).status_code == 200


def test_every_process_serves_masks(mode):
    """Data parallel: both engine cores answered (by their header, above) and hold no
    request afterwards. Two API servers: connections reach both processes, and
    every answer, from either, carries masks. Tensor parallel: only the output rank
    did mask work."""
    name, base, _ = mode
    for _ in range(16):   # a new connection each: the kernel spreads them over the servers
        r = generate(base, [5, 6, 7], sampling_params=dict(temperature=1.0, top_k=10,
                                                            max_tokens=2),
                     headers={"Connection": "close"})
        assert r.status_code == 200 and len(r.json()["choices"][0]["sampling_mask"]) == 2
    if name == "api_servers_2":
        # which process answers each new connection: the state route says its pid.
        # The servers share one listening socket, and which one the kernel wakes for
        # a connection is not random: an idle machine can hand a run of them to the
        # same process. Both must answer within 100 connections.
        servers = set()
        for attempt in range(100):
            servers.add(requests.get(base + "/debug/sampling_mask/state", timeout=60,
                                     headers={"Connection": "close"}
                                     ).json()["api_server"]["process"])
            if len(servers) == 2:
                break
            time.sleep(0.05 * (attempt % 4))
        assert len(servers) == 2, servers
    state = requests.get(base + "/debug/sampling_mask/state", timeout=60)
    assert state.status_code == 200, state.text
    state = state.json()
    assert state["total"] == 0, state          # nothing left behind in any process
    workers = state["engine_core"]["workers"]
    assert len(workers) == (2 if name == "tensor_parallel_2" else 1)
    # The output rank extracted every masked step; under tensor parallelism the
    # other rank, whose output the executor drops, has no mask state and did no work.
    assert workers[0]["sampling_mask_work"]["extractions"] > 0
    assert all(w["sampling_mask_work"] is None for w in workers[1:])
