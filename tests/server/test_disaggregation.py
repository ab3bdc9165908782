"""Masks under prefill/decode disaggregation: two `vllm serve --return-sampling-mask`
of the demo model (V1 runner natively, Model Runner V2 where the release has no V1
runner), a prefill instance (`kv_producer`) and a decode instance (`kv_consumer`),
joined by vLLM's `ExampleConnector` (it writes each prompt's KV cache to files under a
shared path and reads it back), behind the small routing proxy below (vLLM's example
proxies are not in the wheel).

The proxy sends the client's request to the prefill instance with one token and
`kv_transfer_params` asking it to keep the KV for a remote decode, then the original
request to the decode instance with the `kv_transfer_params` the prefill answered, and
returns the decode instance's answer. The decode instance loads the prompt's KV and
samples every token the client gets, the first included (it samples the first token
again, vLLM #25373); the prefill instance's own token and its mask come back to the
proxy only, which drops them.

Checked: every output token has its mask, aligned, equal to the independent float32
reference, on the completions and generate routes, streamed or not; every one was
extracted on the decode instance, and that instance really loaded the prompt's KV
(its external prefix-cache hits and the connector's log lines); the prefill instance
extracted one mask per request (none when the proxy turns the mask off on that leg),
for the same seeded token; no per-request mask state is left on either instance.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import subprocess
import time
import types

import pytest
import requests

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.tools.demo import DEMO_PROMPTS, server_command, server_env, wait_healthy

from conftest import (CMPL, GEN, assert_supports_match_reference, check_alignment, free_port,
                      host_env, server_runner)

# The KV cache block size of both instances: the connector moves whole blocks, so each
# prompt here is longer than one block (the CPU default, 128, would need long prompts).
BLOCK = 32
# Distinct prompts (the connector keys a prompt's KV by its tokens; a repeated prompt
# would be found on disk by the prefill instance too): rotations of the demo prompts,
# once (55-57 tokens: one whole block goes through the connector) or twice (111-113
# tokens: three blocks).
PROMPTS = ["".join(DEMO_PROMPTS[i:] + DEMO_PROMPTS[:i]) * (1 + i % 2)
           for i in range(len(DEMO_PROMPTS))]
TOKENS = 8
# (route, streamed decode leg, sampling parameters): seeded, truncated by top-k and top-p
CASES = [
    (CMPL, False, dict(temperature=1.0, top_k=20, top_p=0.9, seed=1)),
    (CMPL, True, dict(temperature=0.8, top_k=50, top_p=0.95, seed=2)),
    (GEN, False, dict(temperature=1.0, top_k=30, top_p=0.8, seed=3)),
    (GEN, True, dict(temperature=1.2, top_k=40, top_p=0.9, seed=4)),
]


def connector_args(role: str, store) -> list[str]:
    return ["--block-size", str(BLOCK), "--kv-transfer-config", json.dumps({
        "kv_connector": "ExampleConnector", "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(store)}})]


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    """Both instances, started side by side: a namespace with `prefill` and `decode`
    (base URLs), `decode_log` and `store` (the connector's shared path)."""
    tmp = tmp_path_factory.mktemp("pd")
    store = tmp / "kv"
    store.mkdir()
    ports = [free_port()]
    while len(ports) < 2:
        if (port := free_port()) not in ports:
            ports.append(port)
    env = {**server_env(server_runner()), "VLLM_SAMPLING_MASK_DEBUG_STATE": "1", **host_env()}
    started = []
    with contextlib.ExitStack() as stack:
        for role, port in zip(("kv_producer", "kv_consumer"), ports):
            log_path = tmp / f"{role}.log"
            log = stack.enter_context(open(log_path, "w"))
            proc = subprocess.Popen(server_command(port, extra=connector_args(role, store)),
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(_stop, proc)
            started.append((f"http://127.0.0.1:{port}", proc, str(log_path)))
        for base, proc, log_path in started:
            wait_healthy(base, proc, server_log=log_path)
        yield types.SimpleNamespace(prefill=started[0][0], decode=started[1][0],
                                    decode_log=started[1][2], store=store)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


# The routing proxy.

def prefill_leg(route: str, body: dict, mask: bool | None = None) -> dict:
    """The client's request as the prefill instance gets it: one token, not streamed,
    the KV kept for a remote decode; `mask` sets its `return_sampling_mask`."""
    leg = copy.deepcopy(body)
    leg.pop("stream", None)
    leg.pop("stream_options", None)
    (leg["sampling_params"] if route == GEN else leg)["max_tokens"] = 1
    leg["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    if mask is not None:
        leg["return_sampling_mask"] = mask
    return leg


def disaggregated(pd, route: str, body: dict, prefill_mask: bool | None = None):
    """One request through prefill then decode: (the decode instance's answer, the
    response or for a streamed request the list of its chunks; the prefill
    instance's response, which a client never sees)."""
    r = requests.post(pd.prefill + route, json=prefill_leg(route, body, prefill_mask),
                      timeout=600)
    assert r.status_code == 200, r.text[:300]
    prefilled = r.json()
    leg = dict(body, kv_transfer_params=prefilled.get("kv_transfer_params"))
    with requests.post(pd.decode + route, json=leg, stream=bool(body.get("stream")),
                       timeout=600) as r:
        assert r.status_code == 200, r.text[:300]
        if not body.get("stream"):
            return r.json(), prefilled
        chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: {")]
    return chunks, prefilled


# What the instances report.

def state(base: str) -> dict:
    r = requests.get(base + "/debug/sampling_mask/state", timeout=60)
    assert r.status_code == 200, r.text[:300]
    return r.json()


def extracted_rows(base: str) -> int:
    """Rows the instance's worker extracted a mask for, since it started."""
    return sum(w["sampling_mask_work"]["extracted_rows"]
               for w in state(base)["engine_core"]["workers"])


def no_state_left(base: str) -> None:
    deadline = time.monotonic() + 30
    while (current := state(base))["total"] != 0:
        assert time.monotonic() < deadline, current
        time.sleep(0.25)


def external_hits(base: str) -> float:
    """Prompt tokens the instance's KV connector supplied (`/metrics`)."""
    text = requests.get(base + "/metrics", timeout=60).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:external_prefix_cache_hits_total{"))


def injected(log_path: str) -> list[int]:
    """The token counts of the connector's 'Inject KV cache of N tokens' log lines."""
    with open(log_path, errors="replace") as f:
        return [int(n) for n in re.findall(r"Inject KV cache of (\d+) tokens", f.read())]


def loaded_tokens(prompt_ids) -> int:
    """What ExampleConnector loads of a prompt: its whole blocks, short of the last
    token (which the decode instance computes, to sample the first output token)."""
    return (len(prompt_ids) - 2) // BLOCK * BLOCK


def client_body(route: str, prompt: str, tokenizer, sampling: dict, stream: bool) -> dict:
    if route == GEN:
        body = {"token_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"],
                "sampling_params": {**sampling, "max_tokens": TOKENS}}
    else:
        body = {"prompt": prompt, "max_tokens": TOKENS, "return_token_ids": True, **sampling}
    return {"model": DEMO_MODEL, **body, "stream": stream}


def as_output(route: str, body: dict, answer) -> types.SimpleNamespace:
    """The decode answer as the reference helpers take it (a `RequestOutput` shape)."""
    parts = answer if isinstance(answer, list) else [answer]
    choices = [c for part in parts for c in part.get("choices", [])]
    token_ids = [t for c in choices for t in (c.get("token_ids") or [])]
    if route == GEN:
        prompt_ids = body["token_ids"]
    else:
        prompt_ids = next(c["prompt_token_ids"] for c in choices if c.get("prompt_token_ids"))
    completion = types.SimpleNamespace(token_ids=token_ids,
                                       sampling_mask=SamplingMask.from_response(answer))
    return types.SimpleNamespace(prompt_token_ids=prompt_ids, outputs=[completion])


def test_every_output_token_has_its_mask_from_the_decode_instance(pd, hf_model, tokenizer):
    vocab = hf_model.config.vocab_size
    outs, cases = [], []
    for (route, stream, sampling), prompt in zip(CASES, PROMPTS):
        body = client_body(route, prompt, tokenizer, sampling, stream)
        rows = extracted_rows(pd.prefill), extracted_rows(pd.decode)
        hits, lines = external_hits(pd.decode), len(injected(pd.decode_log))
        answer, prefilled = disaggregated(pd, route, body)
        out = as_output(route, body, answer)
        completion = out.outputs[0]
        assert len(completion.token_ids) == TOKENS
        check_alignment(completion, vocab)          # the first token included
        # every token the client got was sampled, and its mask extracted, on the
        # decode instance; the prefill instance extracted one, for its own token
        assert extracted_rows(pd.decode) - rows[1] == TOKENS
        assert extracted_rows(pd.prefill) - rows[0] == 1
        # the decode instance loaded the prompt's KV through the connector
        want = loaded_tokens(out.prompt_token_ids)
        assert want >= BLOCK
        assert external_hits(pd.decode) - hits == want
        assert injected(pd.decode_log)[lines:] == [want]
        # the prefill instance's token, which the client never sees, is the decode
        # instance's first (the same seed at the same position), with the same mask
        first = prefilled["choices"][0]
        assert first["token_ids"] == completion.token_ids[:1]
        assert first["sampling_mask"] == completion.sampling_mask.token_ids[:1]
        outs.append(out)
        cases.append(sampling)
    assert assert_supports_match_reference(outs, cases, hf_model) == TOKENS * len(CASES)
    # the connector wrote each prompt's KV once, from the prefill instance
    assert len([p for p in pd.store.iterdir() if p.is_dir()]) == len(CASES)
    assert external_hits(pd.prefill) == 0
    no_state_left(pd.prefill)
    no_state_left(pd.decode)


def test_the_prefill_leg_can_go_without_a_mask(pd, hf_model, tokenizer):
    """The prefill instance's mask is of no use to the client: a proxy may send that leg
    `return_sampling_mask: false`; the prefill instance then extracts nothing, and the
    decode instance's answer carries every mask as before."""
    route, stream, sampling = CMPL, False, dict(temperature=1.0, top_k=20, top_p=0.9, seed=5)
    body = client_body(route, PROMPTS[len(CASES)], tokenizer, sampling, stream)
    rows = extracted_rows(pd.prefill), extracted_rows(pd.decode)
    hits = external_hits(pd.decode)
    answer, prefilled = disaggregated(pd, route, body, prefill_mask=False)
    assert prefilled["choices"][0]["sampling_mask"] is None
    assert extracted_rows(pd.prefill) == rows[0]
    assert extracted_rows(pd.decode) - rows[1] == TOKENS
    out = as_output(route, body, answer)
    check_alignment(out.outputs[0], hf_model.config.vocab_size)
    assert external_hits(pd.decode) - hits == loaded_tokens(out.prompt_token_ids)
    assert assert_supports_match_reference([out], [sampling], hf_model) == TOKENS
    no_state_left(pd.prefill)
    no_state_left(pd.decode)
