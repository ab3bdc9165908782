"""The sampling mask through `LLM` on Model Runner V2 (one engine for the module).

The engine: demo model, float32, the mask on, processed logprobs, a 64-token
prefill budget (long prompts are chunked), prefix caching (upstream default),
and a KV cache small enough that the preemption test really preempts.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from conftest import ENGINE_KWARGS, hf_logits, reference_support
from vllm import LLM, SamplingParams

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.training import nucleus_logprobs

PROMPTS = [
    "def main():\n    ",
    "import os\nimport sys\n\n",
    "class Parser:\n    def __init__(self",
    "    for i in range(",
    "# Copyright 2001 Python Software Foundation\n",
    "        return self.",
    "if __name__ == '__main__':\n",
    "    raise ValueError(",
]


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**{**ENGINE_KWARGS, "max_model_len": 256}, max_num_batched_tokens=64,
                 max_num_seqs=8, num_gpu_blocks_override=16, block_size=16,
                 max_logprobs=64, disable_log_stats=False)
    yield engine
    del engine


def prompt_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_alignment(completion, vocab_size):
    """One mask per token, sampled token inside, ids unique, sorted, in range."""
    mask = completion.sampling_mask
    assert isinstance(mask, SamplingMask)
    assert len(mask) == len(completion.token_ids)
    for token, support in zip(completion.token_ids, mask.token_ids):
        assert len(support) >= 1
        assert token in support
        assert support == sorted(set(support))
        assert 0 <= support[0] and support[-1] < vocab_size
    return mask


def test_runs_on_model_runner_v2_in_a_patched_worker_process(llm):
    def probe(worker):
        import os

        from vllm_sampling_mask import patching
        runner = worker.model_runner
        return (type(runner).__module__, os.getpid(), list(patching.APPLIED),
                getattr(runner.sampler, "return_sampling_mask", None))

    (module, pid, applied, enabled), = llm.collective_rpc(probe)
    assert module == "vllm.v1.worker.cpu.model_runner" or module.startswith(
        "vllm.v1.worker.gpu.model_runner")
    assert pid != os.getpid()
    assert {"sampler", "async_output", "interpreter_libdevice"} <= set(applied)
    assert enabled is True


def test_invariants_over_mixed_parameters(llm, tokenizer):
    vocab = len(tokenizer)
    params = [
        SamplingParams(temperature=0.7, top_k=20, max_tokens=32, ignore_eos=True, seed=1),
        SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=32, seed=2),
        SamplingParams(temperature=1.3, top_k=40, min_p=0.05, max_tokens=32, seed=3),
        SamplingParams(temperature=0.9, top_k=30, top_p=0.8, min_p=0.02,
                       repetition_penalty=1.3, max_tokens=32, seed=4),
        SamplingParams(temperature=1.0, top_k=25, presence_penalty=1.0,
                       frequency_penalty=0.5, max_tokens=32, seed=5),
        SamplingParams(temperature=0.8, top_k=10, logit_bias={17: 5.0, 42: -100.0},
                       max_tokens=32, seed=6),
        SamplingParams(temperature=2.0, top_k=5, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.5, top_k=100, top_p=0.95, max_tokens=32, seed=8),
    ]
    outs = llm.generate(PROMPTS, params)
    total = 0
    for out, sp in zip(outs, params):
        c = out.outputs[0]
        mask = check_alignment(c, vocab)
        total += len(mask)
        # The mask is bounded by top_k, except ids tied with the k-th logit.
        assert max(mask.sizes) <= sp.top_k + 2
        if sp.logit_bias:
            assert all(42 not in s for s in mask.token_ids)
    assert total >= 200  # a few hundred tokens


def test_supports_match_an_independent_reference(llm, tokenizer, hf_model):
    cases = [dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_k=50, top_p=0.9),
             dict(temperature=1.2, top_k=40, min_p=0.1),
             dict(temperature=0.6, top_k=64, top_p=0.7, min_p=0.02)]
    params = [SamplingParams(**c, max_tokens=24, seed=10 + i, logprobs=0)
              for i, c in enumerate(cases)]
    outs = llm.generate(PROMPTS[:4], params)
    compared = ambiguous = 0
    for out, case in zip(outs, cases):
        c = out.outputs[0]
        logits = hf_logits(hf_model, out.prompt_token_ids, c.token_ids)
        for t, support in enumerate(c.sampling_mask.token_ids):
            surely_in, surely_out = reference_support(
                logits[t], case["temperature"], case["top_k"],
                case.get("top_p", 1.0), case.get("min_p", 0.0))
            got = set(support)
            assert surely_in <= got, (t, sorted(surely_in - got))
            assert not (got & surely_out), (t, sorted(got & surely_out))
            ambiguous += len(logits[t]) - len(surely_in) - len(surely_out)
            compared += 1
    assert compared == sum(len(o.outputs[0].token_ids) for o in outs)
    assert ambiguous <= compared // 10  # threshold cases are rare, not the rule


def test_replay_fidelity_of_processed_logprobs(llm, hf_model):
    temps = [0.7, 1.0, 1.3]
    params = [SamplingParams(temperature=t, top_k=40, top_p=0.9, max_tokens=24,
                             seed=20 + i, logprobs=0) for i, t in enumerate(temps)]
    outs = llm.generate(PROMPTS[4:7], params)
    for out, temp in zip(outs, temps):
        c = out.outputs[0]
        returned = torch.tensor([lp[tok].logprob for tok, lp in zip(c.token_ids, c.logprobs)])
        logits = hf_logits(hf_model, out.prompt_token_ids, c.token_ids)
        replayed = nucleus_logprobs(logits, torch.tensor(c.token_ids), c.sampling_mask,
                                    temperature=temp)
        assert torch.allclose(replayed, returned, atol=1e-4), (replayed - returned).abs().max()
        # and the full-vocabulary logprob is really different (the bias the mask fixes)
        full = torch.log_softmax(logits / temp, -1).gather(
            1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
        assert (returned - full).min() > 0


def test_stops_max_tokens_and_n(llm, tokenizer):
    vocab = len(tokenizer)
    base = dict(temperature=1.0, top_k=30, seed=7)
    # A seeded request replays its tokens: stopping on its 4th token must cut there.
    free = llm.generate([PROMPTS[2]], SamplingParams(**base, max_tokens=8,
                                                     ignore_eos=True))[0].outputs[0]
    stop_id = free.token_ids[3]
    cut = free.token_ids.index(stop_id) + 1
    params = [
        SamplingParams(**base, max_tokens=5),
        SamplingParams(**base, max_tokens=60, stop=["("]),
        SamplingParams(**base, max_tokens=60, stop_token_ids=[stop_id], ignore_eos=True),
        SamplingParams(**base, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=30, max_tokens=12, n=3),
    ]
    outs = llm.generate(PROMPTS[:5], params)
    assert len(outs[0].outputs[0].token_ids) == 5
    assert len(outs[3].outputs[0].token_ids) == 30
    stopped = outs[2].outputs[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]
    assert stopped.sampling_mask.token_ids == free.sampling_mask.token_ids[:cut]
    assert len(outs[4].outputs) == 3
    for out in outs:
        for c in out.outputs:
            check_alignment(c, vocab)


def test_seeded_requests_replay_exactly_and_prefix_cache_agrees(llm, tokenizer):
    long_prompt = "".join(PROMPTS) * 2   # > 64 tokens: chunked prefill
    assert len(prompt_ids(tokenizer, long_prompt)) > 64
    sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, max_tokens=16, seed=123)
    first = llm.generate([long_prompt], sp)[0].outputs[0]
    again = llm.generate([long_prompt], sp)[0].outputs[0]   # prefix-cache hit
    assert again.token_ids == first.token_ids
    assert again.sampling_mask == first.sampling_mask
    other = llm.generate([long_prompt], SamplingParams(
        temperature=1.0, top_k=40, top_p=0.95, max_tokens=16, seed=124))[0].outputs[0]
    assert other.token_ids != first.token_ids or other.sampling_mask != first.sampling_mask


def _preemptions(llm) -> float:
    return sum(m.value for m in llm.get_metrics()
               if m.name == "vllm:num_preemptions" and hasattr(m, "value"))


def test_preemption_and_recompute_keep_masks_aligned(llm, tokenizer):
    before = _preemptions(llm)
    sp = [SamplingParams(temperature=1.0, top_k=20, max_tokens=40, ignore_eos=True,
                         seed=300 + i) for i in range(6)]
    outs = llm.generate(PROMPTS[:6], sp)   # 6 x ~50 tokens > 16 blocks x 16
    assert _preemptions(llm) > before, "the KV cache was meant to force preemption"
    for out in outs:
        assert len(out.outputs[0].token_ids) == 40
        check_alignment(out.outputs[0], len(tokenizer))
    # A preempted request is recomputed: same seed, same tokens and masks as alone.
    alone = llm.generate([PROMPTS[0]], sp[0])[0].outputs[0]
    assert alone.token_ids == outs[0].outputs[0].token_ids
    assert alone.sampling_mask == outs[0].outputs[0].sampling_mask


def test_sampling_parameters_act_under_mrv2(llm, tokenizer):
    prompt = PROMPTS[0]
    bad = "self"
    bad_id = prompt_ids(tokenizer, " " + bad)
    favoured = prompt_ids(tokenizer, " return")[-1]
    params = [
        SamplingParams(temperature=0.3, top_k=50, top_p=0.9, max_tokens=20, seed=1),
        SamplingParams(temperature=1.9, top_k=50, top_p=0.9, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, min_p=0.2, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=20, seed=1,
                       bad_words=[" " + bad]),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=8, seed=1,
                       logit_bias={favoured: 100.0}),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=8, seed=1,
                       allowed_token_ids=list(range(100, 140))),
    ]
    outs = [o.outputs[0] for o in llm.generate([prompt] * len(params), params)]
    cold, hot, minp, plain, badw, bias, allowed = outs
    assert np.mean(cold.sampling_mask.sizes) < np.mean(hot.sampling_mask.sizes)
    assert np.mean(minp.sampling_mask.sizes) < np.mean(plain.sampling_mask.sizes)
    if len(bad_id) == 1:
        assert all(bad_id[0] not in s for s in badw.sampling_mask.token_ids)
    assert all(t == favoured for t in bias.token_ids)
    assert all(set(s) <= set(range(100, 140)) for s in allowed.sampling_mask.token_ids)


def test_penalties_lower_a_repeated_tokens_logprob(llm):
    """Each penalty lowers a penalised token's logprob relative to an unpenalised one.

    Processed logprobs are renormalised over the support, so a penalised token is
    compared with an unpenalised token `q` of the same step: the normaliser cancels.
    """
    prompt = "x = x + x + x + x + x + x + x"

    def run(**pen):
        sp = SamplingParams(temperature=1.0, top_k=64, max_tokens=2, seed=5, logprobs=64,
                            **pen)
        out = llm.generate([prompt], sp)[0]
        c = out.outputs[0]
        return out.prompt_token_ids, c.token_ids, [
            {k: v.logprob for k, v in lp.items()} for lp in c.logprobs]

    def gap(lp, p, q):
        return lp.get(p, -math.inf) - lp[q]

    prompt_ids, tokens, base = run()
    # repetition_penalty acts on prompt tokens from the first step on
    p = max((t for t in base[0] if t in prompt_ids), key=base[0].get)
    q = max((t for t in base[0] if t not in prompt_ids), key=base[0].get)
    _, _, rep = run(repetition_penalty=2.0)
    assert gap(rep[0], p, q) < gap(base[0], p, q)
    # presence/frequency act on output tokens: the first token, at the second step
    first = tokens[0]
    q = max((t for t in base[1] if t != first), key=base[1].get)
    for pen in (dict(presence_penalty=2.0), dict(frequency_penalty=2.0)):
        _, toks, lp = run(**pen)
        assert toks[0] == first      # the first step has no output to penalise
        if first in base[1]:
            assert gap(lp[1], first, q) < gap(base[1], first, q)
        else:
            assert first not in lp[1]


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(llm):
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["x"], SamplingParams(temperature=0.0, top_k=10))
    with pytest.raises(ValueError, match="top_k"):
        llm.generate(["x"], SamplingParams(temperature=1.0))
    out = llm.generate(["x"], SamplingParams(temperature=1.0, top_k=5, max_tokens=3))
    assert len(out[0].outputs[0].sampling_mask) == 3


def _set_extraction_globals(worker, values):
    """Runs in the worker: set `extraction` module globals, return the old ones."""
    from vllm_sampling_mask import extraction
    old = {k: getattr(extraction, k) for k in values}
    for k, v in values.items():
        setattr(extraction, k, v)
    return old


def test_a_row_the_mask_cannot_describe_ends_only_its_request(llm):
    """Force wide rows with a single wide-row slot in the worker: a tie margin of
    -15 makes the width top_k - 15 < top_k (so every row is unexpectedly wide)
    and one spare slot lets only one row of each step through exactly."""
    params = [SamplingParams(temperature=1.0, top_k=20, max_tokens=6, ignore_eos=True,
                             seed=900 + i) for i in range(3)]
    clean = [o.outputs[0] for o in llm.generate(PROMPTS[:3], params)]
    (old,) = llm.collective_rpc(_set_extraction_globals,
                                args=({"TIE_MARGIN": -15, "SPARE_WIDE_SLOTS": 1},))
    try:
        faulty = [o.outputs[0] for o in llm.generate(PROMPTS[:3], params)]
    finally:
        llm.collective_rpc(_set_extraction_globals, args=(old,))
    ended = [c for c in faulty if c.finish_reason == "error"]
    served = [c for c in faulty if c.finish_reason != "error"]
    assert len(ended) == 2 and len(served) == 1
    for c in ended:
        assert "wide-row slot" in c.sampling_mask_error
        assert c.token_ids == [] or len(c.sampling_mask) == len(c.token_ids)
    (ok,) = served
    want = clean[faulty.index(ok)]
    assert ok.sampling_mask_error is None
    assert ok.token_ids == want.token_ids and ok.sampling_mask == want.sampling_mask
    # The engine goes on serving, exactly as before.
    again = llm.generate(PROMPTS[:3], params)
    assert [o.outputs[0].sampling_mask for o in again] == [c.sampling_mask for c in clean]
