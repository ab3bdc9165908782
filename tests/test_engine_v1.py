"""The sampling mask through `LLM` on vLLM's V1 model runner, natively on CPU.

One engine for the module: demo model, float32, the mask on, processed logprobs,
a 64-token prefill budget (long prompts are chunked), prefix caching (upstream
default), a KV cache small enough that the preemption test really preempts, and a
custom logits processor (`ban_ids_processor.BanIdsProcessor`), which V1 applies
inside its sampler before the support is taken.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ban_ids_processor import BanIdsProcessor
from conftest import (ENGINE_KWARGS, PROMPTS, check_alignment, hf_logits, native_v1,
                      reference_support)
from vllm import LLM, SamplingParams

from vllm_sampling_mask.training import nucleus_logprobs


@pytest.fixture(scope="module")
def llm():
    with native_v1():
        engine = LLM(**{**ENGINE_KWARGS, "max_model_len": 256}, max_num_batched_tokens=64,
                     max_num_seqs=8, num_gpu_blocks_override=16, block_size=16,
                     max_logprobs=64, disable_log_stats=False,
                     logits_processors=[BanIdsProcessor])
    yield engine
    del engine


def test_runs_natively_on_the_v1_runner_in_a_patched_worker(llm):
    def probe(worker):
        import os

        import triton.runtime.interpreter  # noqa: F401
        from vllm.triton_utils import HAS_TRITON
        runner = worker.model_runner
        return (type(runner).__module__, os.environ.get("TRITON_INTERPRET"), HAS_TRITON,
                runner.sampler.return_sampling_mask)

    (module, interpret, has_triton, enabled), = llm.collective_rpc(probe)
    assert module == "vllm.v1.worker.cpu_model_runner"
    assert interpret is None and has_triton is False   # native, no interpreter
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
        mask = check_alignment(out.outputs[0], vocab)
        total += len(mask)
        assert max(mask.sizes) <= sp.top_k + 2   # ties with the k-th logit only
        if sp.logit_bias:
            assert all(42 not in s for s in mask.token_ids)
    assert total >= 200


def test_supports_match_an_independent_reference(llm, hf_model):
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
    assert ambiguous <= compared // 10


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


def test_custom_logits_processor_shapes_the_mask(llm, tokenizer):
    """V1 applies custom processors inside the sampler: banned ids never appear,
    and the mask still holds the rest of the top-k."""
    banned = list(range(0, 4096, 3))       # a third of the vocabulary
    base = dict(temperature=1.0, top_k=40, max_tokens=16, ignore_eos=True, seed=77)
    plain, ban = llm.generate(PROMPTS[:2], [
        SamplingParams(**base), SamplingParams(**base, extra_args={"ban_ids": banned})])
    banned_set = set(banned)
    ban_mask = check_alignment(ban.outputs[0], len(tokenizer))
    assert all(not (set(s) & banned_set) for s in ban_mask.token_ids)
    assert all(len(s) >= 40 for s in ban_mask.token_ids)
    assert any(set(s) & banned_set for s in plain.outputs[0].sampling_mask.token_ids)


def test_stops_max_tokens_and_n(llm, tokenizer):
    vocab = len(tokenizer)
    base = dict(temperature=1.0, top_k=30, seed=7)
    free = llm.generate([PROMPTS[2]], SamplingParams(**base, max_tokens=8,
                                                     ignore_eos=True))[0].outputs[0]
    stop_id = free.token_ids[3]
    cut = free.token_ids.index(stop_id) + 1
    params = [
        SamplingParams(**base, max_tokens=5),
        SamplingParams(**base, max_tokens=60, stop=["("]),
        SamplingParams(**base, max_tokens=60, stop_token_ids=[stop_id], ignore_eos=True),
        SamplingParams(**base, max_tokens=30, ignore_eos=True),
        # seeded too: V1's CPU sampler honours seeds only when every row is seeded
        SamplingParams(temperature=1.0, top_k=30, max_tokens=12, n=3, seed=8),
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


def test_seeded_chunked_prompts_replay_exactly_and_prefix_cache_agrees(llm, tokenizer):
    """A seeded request whose prompt is chunked (the partial chunk's draw is
    discarded) replays exactly, and so does its prefix-cache hit, which is chunked
    differently: on a CPU host this needs the `cpu_generator_rewind` patch (upstream
    raised "CPU Generator does not use offset" and the engine died)."""
    long_prompt = "".join(PROMPTS) * 2   # > 64 tokens: chunked prefill
    assert len(tokenizer(long_prompt, add_special_tokens=False)["input_ids"]) > 64
    sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, max_tokens=16, seed=123)
    first = llm.generate([long_prompt], sp)[0].outputs[0]
    again = llm.generate([long_prompt], sp)[0].outputs[0]   # prefix-cache hit
    check_alignment(first, len(tokenizer))
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
    outs = llm.generate(PROMPTS[:6], sp)
    assert _preemptions(llm) > before, "the KV cache was meant to force preemption"
    for out in outs:
        assert len(out.outputs[0].token_ids) == 40
        check_alignment(out.outputs[0], len(tokenizer))
    alone = llm.generate([PROMPTS[0]], sp[0])[0].outputs[0]
    assert alone.token_ids == outs[0].outputs[0].token_ids
    assert alone.sampling_mask == outs[0].outputs[0].sampling_mask


def test_sampling_parameters_act(llm, tokenizer):
    params = [
        SamplingParams(temperature=0.3, top_k=50, top_p=0.9, max_tokens=20, seed=1),
        SamplingParams(temperature=1.9, top_k=50, top_p=0.9, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, min_p=0.2, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=20, seed=1),
        SamplingParams(temperature=1.0, top_k=50, max_tokens=8, seed=1,
                       allowed_token_ids=list(range(100, 140))),
    ]
    cold, hot, minp, plain, allowed = [
        o.outputs[0] for o in llm.generate([PROMPTS[0]] * len(params), params)]
    assert np.mean(cold.sampling_mask.sizes) < np.mean(hot.sampling_mask.sizes)
    assert np.mean(minp.sampling_mask.sizes) < np.mean(plain.sampling_mask.sizes)
    assert all(set(s) <= set(range(100, 140)) for s in allowed.sampling_mask.token_ids)


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(llm):
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["x"], SamplingParams(temperature=0.0, top_k=10))
    with pytest.raises(ValueError, match="top_k"):
        llm.generate(["x"], SamplingParams(temperature=1.0))
    out = llm.generate(["x"], SamplingParams(temperature=1.0, top_k=5, max_tokens=3))
    assert len(out[0].outputs[0].sampling_mask) == 3
