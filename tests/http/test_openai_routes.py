"""`/v1/completions` and `/v1/chat/completions` with sampling masks, through the
official `openai` client, against the shared real `vllm serve` (conftest's
`mask_server`) (the stock CLI, patched by
the site hook) on the V1 runner natively: demo model (its chat template is
`demo_model/chat_template.jinja`), mask on, `--max-sampling-mask-size 128` so the
size limit can trip. The generate endpoint's own tests are in test_server.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import openai
import pytest
import requests
import torch

from conftest import SERVER_MAX_MASK_SIZE

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.training import nucleus_logprobs, pack_masks

pytestmark = pytest.mark.release_tier  # CI runs it on every release

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESSAGES = [{"role": "user", "content": "Write a function that reverses a list."}]
PROMPT = "import os\nimport "
LIMIT = SERVER_MAX_MASK_SIZE


@pytest.fixture(scope="module")
def server(mask_server):
    return mask_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="EMPTY", max_retries=0)


def assert_healthy(base):
    assert requests.get(base + "/health", timeout=30).status_code == 200


def create(client, route, stream=False, **kw):
    """One request on `route` ("completions" or "chat"); `top_k` and the other
    vLLM fields go through `extra_body`, as a user of the client sends them."""
    extra = {k: kw.pop(k) for k in list(kw)
             if k in ("top_k", "min_p", "return_sampling_mask", "return_token_ids")}
    if stream:
        kw.update(stream=True, stream_options={"include_usage": True})
    if route == "completions":
        return client.completions.create(model=DEMO_MODEL, prompt=PROMPT,
                                         extra_body=extra, **kw)
    if "logprobs" in kw:
        kw.update(logprobs=True, top_logprobs=kw.pop("logprobs"))
    return client.chat.completions.create(model=DEMO_MODEL, messages=MESSAGES,
                                          extra_body=extra, **kw)


def field(choice, name):
    """A vLLM field of a client object (the client declares none of them)."""
    return choice.model_dump().get(name)


def logprob_count(route, choice) -> int:
    logprobs = choice.logprobs
    return len(logprobs.tokens if route == "completions" else logprobs.content)


SEEDED = dict(temperature=0.8, top_k=20, max_tokens=16, seed=1, n=2, stop=["\n"],
              logprobs=1, return_token_ids=True)
ROUTES = ["completions", "chat"]


@pytest.mark.parametrize("route", ROUTES)
def test_masks_align_with_tokens_and_logprobs_for_n2_and_a_stop_string(client, route):
    r = create(client, route, **SEEDED)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for choice in r.choices:
        mask = choice.sampling_mask
        assert len(mask) == len(choice.token_ids) == logprob_count(route, choice) >= 1
        for token, support in zip(choice.token_ids, mask):
            assert token in support and support == sorted(set(support))
            assert 1 <= len(support) <= 20 + 16     # top_k, plus the tie margin at most
    # the stop string trims the text, never the tokens: one support per token
    assert any(c.finish_reason == "stop" and c.stop_reason == "\n" for c in r.choices)


@pytest.mark.parametrize("route", ROUTES)
def test_streamed_chunks_carry_their_tokens_masks_and_join_to_the_full_result(
        client, route):
    full = create(client, route, **SEEDED)
    chunks = list(create(client, route, stream=True, **SEEDED))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None   # the usage chunk
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            tokens = field(choice, "token_ids") or []   # chat's role chunk has none
            assert len(choice.sampling_mask) == len(tokens)
            assert all(t in s for t, s in zip(tokens, choice.sampling_mask))
    for want in full.choices:
        streamed = [c for chunk in chunks for c in chunk.choices if c.index == want.index]
        assert [t for c in streamed for t in field(c, "token_ids") or []] == want.token_ids
        joined = SamplingMask.from_response(chunks, index=want.index)
        assert joined == SamplingMask.from_response(want)
        assert joined.token_ids == want.sampling_mask


def test_several_prompts_with_n2_each_choice_gets_its_own_prompts_mask(client):
    """Completions numbers the choices of all prompts in order (prompt by prompt,
    n each): every full choice's mask is that choice's, the one its stream carries
    under the same index, and the two prompts' masks differ."""
    request = dict(model=DEMO_MODEL, prompt=[PROMPT, "def main():\n"], n=2, seed=1,
                   temperature=0.8, max_tokens=8,
                   extra_body={"top_k": 20, "return_token_ids": True})
    full = client.completions.create(**request)
    chunks = list(client.completions.create(stream=True, **request))
    assert [c.index for c in full.choices] == [0, 1, 2, 3]
    for want in full.choices:
        assert len(want.sampling_mask) == len(want.token_ids) >= 1
        assert all(t in s for t, s in zip(want.token_ids, want.sampling_mask))
        streamed = [c for chunk in chunks for c in chunk.choices if c.index == want.index]
        assert [t for c in streamed for t in field(c, "token_ids") or []] == want.token_ids
        assert SamplingMask.from_response(chunks, index=want.index).token_ids == \
            want.sampling_mask
    assert full.choices[0].sampling_mask[0] != full.choices[2].sampling_mask[0]


@pytest.mark.parametrize("route", ROUTES)
def test_the_per_request_field_reaches_the_engine(client, route):
    base = dict(temperature=0.8, top_k=20, max_tokens=4, seed=2)
    default = create(client, route, **base)    # null: a mask, the distribution is truncated
    assert len(default.choices[0].sampling_mask) == 4
    assert create(client, route, **base, return_sampling_mask=False
                  ).choices[0].sampling_mask is None
    for chunk in create(client, route, stream=True, **base, return_sampling_mask=False):
        assert all(c.sampling_mask is None for c in chunk.choices)
    # null with an untruncated distribution: served as stock, no mask
    untruncated = create(client, route, temperature=1.0, max_tokens=4, seed=2)
    assert untruncated.choices[0].sampling_mask is None
    # true reaches the engine's checks: greedy is refused, naming the parameter
    with pytest.raises(openai.BadRequestError) as e:
        create(client, route, temperature=0.0, max_tokens=4, return_sampling_mask=True)
    assert e.value.status_code == 400 and "temperature" in str(e.value)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("value, parameter", [("yes", "return_sampling_mask"),
                                              (1, "return_sampling_mask"),
                                              (True, "temperature")])
def test_bad_requests_get_400_naming_the_parameter_streamed_or_not(
        client, server, route, stream, value, parameter):
    with pytest.raises(openai.BadRequestError) as e:
        create(client, route, stream=stream, temperature=0.0, max_tokens=4,
               return_sampling_mask=value)
    assert e.value.status_code == 400 and parameter in str(e.value)
    assert_healthy(server)


MASK_TOO_WIDE = dict(temperature=1.0, min_p=0.005, max_tokens=16, seed=0)
# wide from the first step on (the demo model keeps hundreds of ids at this min_p and
# temperature, whatever the sampled path): the size limit trips on every release
MASK_WIDE_AT_ONCE = dict(temperature=1.5, min_p=0.002, max_tokens=16, seed=0)


@pytest.mark.parametrize("route", ROUTES)
def test_a_mask_error_is_a_400_with_its_message_and_the_server_goes_on(
        client, server, route):
    """min_p alone: some step's support outgrows the engine's limit of 128. A request
    that asked for its mask gets the 400; one that left the switch unset is served,
    its mask null with the reason (never failed by the mask path)."""
    with pytest.raises(openai.BadRequestError) as e:
        create(client, route, return_sampling_mask=True, **MASK_WIDE_AT_ONCE)
    assert f"--max-sampling-mask-size {LIMIT}" in str(e.value)
    assert_healthy(server)
    choice = create(client, route, **MASK_WIDE_AT_ONCE).choices[0]
    assert choice.sampling_mask is None
    assert f"--max-sampling-mask-size {LIMIT}" in field(choice, "sampling_mask_reason")
    with pytest.raises(ValueError, match=f"--max-sampling-mask-size {LIMIT}"):
        SamplingMask.from_response(choice)
    assert len(create(client, route, temperature=0.8, top_k=20, max_tokens=4
                      ).choices[0].sampling_mask) == 4


def test_a_mask_error_mid_stream_is_an_error_event_with_its_message(client, server):
    body = {"model": DEMO_MODEL, "prompt": "def main():\n", "stream": True,
            "return_token_ids": True, "return_sampling_mask": True, **MASK_TOO_WIDE}
    with requests.post(server + "/v1/completions", json=body, stream=True,
                       timeout=600) as r:
        assert r.status_code == 200
        events = [line[len(b"data: "):] for line in r.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    *chunks, error = [json.loads(e) for e in events[:-1]]
    assert chunks    # the first steps were narrow enough: they streamed, with their masks
    for chunk in chunks:
        (choice,) = chunk["choices"]
        assert len(choice["sampling_mask"]) == len(choice["token_ids"]) >= 1
    assert error["error"]["code"] == 400
    assert f"--max-sampling-mask-size {LIMIT}" in error["error"]["message"]
    # the `openai` client raises it, with the message, after the chunks before it
    stream = client.completions.create(
        model=DEMO_MODEL, prompt="def main():\n", stream=True, temperature=1.0,
        max_tokens=16, seed=0, extra_body={"min_p": 0.005, "return_sampling_mask": True})
    received = []
    with pytest.raises(openai.APIError, match=f"--max-sampling-mask-size {LIMIT}"):
        for chunk in stream:
            received.append(chunk)
    # the same tokens before the error (a loaded server may coalesce tokens into
    # fewer chunks, so compare what they carry, not how many there are)
    assert ("".join(c.choices[0].text for c in received)
            == "".join(chunk["choices"][0]["text"] for chunk in chunks))
    assert_healthy(server)
    # the switch unset: the same stream runs to its end; the chunks before the wide
    # step keep their masks, that chunk and every later one carry null and the reason
    body.pop("return_sampling_mask")
    with requests.post(server + "/v1/completions", json=body, stream=True,
                       timeout=600) as r:
        assert r.status_code == 200
        events = [line[len(b"data: "):] for line in r.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    served = [c for e in events[:-1] for c in json.loads(e).get("choices", [])]
    assert all("error" not in json.loads(e) for e in events[:-1])
    assert served[-1]["finish_reason"] in ("length", "stop"), served[-1]
    kept = [c for c in served if c.get("sampling_mask") is not None]
    assert served[:len(kept)] == kept                               # a prefix
    # the tokens masked are those streamed before the wide step (a chunk that
    # reaches it carries null, so coalesced chunks may mask fewer of them)
    masked = [t for c in kept for t in c["token_ids"]]
    before = [t for chunk in chunks for t in chunk["choices"][0]["token_ids"]]
    assert masked == before[:len(masked)]
    assert all(c["sampling_mask"] is None and f"--max-sampling-mask-size {LIMIT}"
               in c["sampling_mask_reason"] for c in served[len(kept):])


def test_from_response_and_pack_masks_feed_the_trainer(client, server):
    r = create(client, "completions", **SEEDED)
    masks = [SamplingMask.from_response(r, index=i) for i in range(2)]
    for choice, mask in zip(r.choices, masks):
        assert mask == SamplingMask.from_response(choice)                 # client object
        assert mask == SamplingMask.from_response(choice.model_dump())    # plain JSON
        assert mask.token_ids == choice.sampling_mask
    # the generate endpoint's JSON, streamed or not, gives the same type
    body = {"model": DEMO_MODEL, "token_ids": [5, 6, 7],
            "sampling_params": dict(temperature=1.0, top_k=10, max_tokens=5, seed=4)}
    full = requests.post(server + "/inference/v1/generate", json=body, timeout=600).json()
    assert len(SamplingMask.from_response(full)) == 5
    # packed for one call of the op: the two completions' rows one after the other
    tokens = [t for c in r.choices for t in c.token_ids]
    ids, offsets = pack_masks(masks)
    assert offsets.tolist() == np.concatenate([[0], np.cumsum(
        [s for m in masks for s in m.sizes])]).tolist()
    logits = torch.randn(len(tokens), 4096, requires_grad=True)
    out = nucleus_logprobs(logits, torch.tensor(tokens), (ids, offsets))
    assert out.shape == (len(tokens),) and bool((out <= 0).all())


def test_from_response_refuses_what_is_not_a_mask():
    with pytest.raises(ValueError, match="null"):
        SamplingMask.from_response({"index": 0, "sampling_mask": None})
    with pytest.raises(ValueError, match="no 'sampling_mask' field"):
        SamplingMask.from_response({"index": 0, "token_ids": [1]})
    with pytest.raises(ValueError, match="2 supports for 1 token_ids"):
        SamplingMask.from_response({"index": 0, "token_ids": [1],
                                    "sampling_mask": [[1], [2]]})
    two = {"choices": [{"index": 0, "sampling_mask": [[1]]},
                       {"index": 1, "sampling_mask": [[2, 3]]}]}
    with pytest.raises(ValueError, match="pass index="):
        SamplingMask.from_response(two)
    assert SamplingMask.from_response(two, index=1).token_ids == [[2, 3]]
    with pytest.raises(TypeError, match="SamplingMask"):
        pack_masks([[[1, 2]]])


def test_readme_chat_example_runs_as_printed(server, tmp_path):
    """README's `openai` chat example, against this server (the README's port
    replaced); it asks for what the README's `vllm serve` line also serves."""
    with open(os.path.join(ROOT, "README.md")) as f:
        (example,) = re.findall(r"```py\n(.*?)```", f.read(), flags=re.S)
    assert "localhost:8000" in example
    script = tmp_path / "chat_example.py"
    script.write_text(example.replace("localhost:8000", server.split("//")[1]))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    printed = [eval(line) for line in r.stdout.splitlines() if line.startswith("[")]
    tokens, masks = printed[-2:]
    assert len(tokens) == len(masks) >= 1
    assert all(t in m for t, m in zip(tokens, masks))
