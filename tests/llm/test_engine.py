"""The sampling mask through `LLM`, on both of vLLM's model runners.

One engine per runner (the module's tests run on each in turn): V1 natively, and
Model Runner V2 through Triton's interpreter. Demo model, float32, the mask on,
processed logprobs, a 64-token prefill budget (long prompts are chunked), prefix
caching (upstream default), a KV cache small enough (9 blocks of 32: one max_model_len,
plus the null block 0.32 reserves; 0.32 on CPU takes multiples of 32) that the preemption test
really preempts, and --max-sampling-mask-size 128 (so the size limit can trip). The V1 engine also has a custom logits processor
(`ban_ids_processor.BanIdsProcessor`), which V1 applies inside its sampler; Model
Runner V2 has no custom processors.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from conftest import (ENGINE_KWARGS, PROMPTS, assert_supports_match_reference,
                      check_alignment, counter, engine_on, hf_logits, host_env)
from vllm import SamplingParams

from vllm_sampling_mask.training import nucleus_logprobs

RUNNERS = ["v1", "mrv2"]
PREEMPTIONS = "vllm:num_preemptions"


@pytest.fixture(scope="module", params=RUNNERS)
def llm(request):
    kwargs = dict(ENGINE_KWARGS, max_model_len=256, max_num_batched_tokens=64,
                  max_num_seqs=8, num_gpu_blocks_override=9, block_size=32,
                  max_logprobs=64, disable_log_stats=False, max_sampling_mask_size=128)
    if request.param == "v1":
        from vllm_sampling_mask.patches.apply import upstream_release
        release = upstream_release()
        if not release.v1_runner:
            pytest.skip(f"vLLM {release.version} has no V1 model runner")
        from ban_ids_processor import BanIdsProcessor   # (a V1 logits processor)
        kwargs["logits_processors"] = [BanIdsProcessor]
    engine = engine_on(request.param, **kwargs)
    yield engine
    del engine


def prompt_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_runs_on_the_chosen_runner_in_a_patched_worker_process(llm):
    def probe(worker):
        import os

        from vllm.triton_utils import HAS_TRITON

        from vllm_sampling_mask.patches import apply as patching
        runner = worker.model_runner
        return (type(runner).__module__, os.getpid(), list(patching.APPLIED),
                runner.sampler.sampling_mask is runner.sampling_mask is not None,
                os.environ.get("TRITON_INTERPRET"),
                HAS_TRITON)

    (module, pid, applied, enabled, interpret, has_triton), = llm.collective_rpc(probe)
    assert pid != os.getpid() and enabled is True
    if llm.runner == "v1":
        assert module == "vllm.v1.worker.cpu_model_runner"
        # native; on a host from the CUDA wheel (0.33) with Triton's interpreter on, for
        # the cpu_op_* enablers' CPU kernels (conftest's host_env)
        interpreted = host_env().get("TRITON_INTERPRET")
        assert interpret == interpreted and has_triton is (interpreted is not None)
        assert {"sampler_v1", "runner_v1", "cpu_generator_rewind"} <= set(applied)
    else:
        assert module == "vllm.v1.worker.cpu.model_runner" or module.startswith(
            "vllm.v1.worker.gpu.model_runner")
        assert {"sampler", "runner", "async_output", "interpreter_libdevice"} <= set(applied)


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
    assert_supports_match_reference(outs, cases, hf_model)


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


@pytest.mark.parametrize("llm", ["v1"], indirect=True)
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


def _mask_work(worker):
    """Runs in the worker: the runner's mask state counters (`SamplingMaskState`):
    steps extracted, rows extracted, rows left out as their sample is discarded."""
    state = worker.model_runner.sampling_mask
    return state.extractions, state.extracted_rows, state.idle_rows


def _steps_without_masks(worker):
    return worker.model_runner.sampling_mask.steps_without_masks


def test_a_batch_that_wants_no_mask_carries_none_and_a_masked_one_after_it_is_exact(
        llm, tokenizer):
    """A step in which no row wants a mask carries `NO_MASKS` (no copy, decode or
    empty block through the hops; on V1 no extraction either); the requests are
    served as without the flag.
    A batch that mixes masked requests in afterwards extracts again, exactly."""
    base = dict(max_tokens=8, ignore_eos=True, seed=11)
    unasked = [SamplingParams(temperature=1.0, top_k=20, extra_args=_ask(False), **base),
               SamplingParams(temperature=0.0, **base),
               SamplingParams(temperature=1.0, **base)]
    (work,), (without,) = llm.collective_rpc(_mask_work), llm.collective_rpc(
        _steps_without_masks)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS[:3], unasked)]
    assert all(c.sampling_mask is None and len(c.token_ids) == 8 for c in outs)
    assert llm.collective_rpc(_mask_work)[0] == work        # nothing extracted
    assert llm.collective_rpc(_steps_without_masks)[0] - without >= 8
    alone = llm.generate([PROMPTS[1]], unasked[1])[0].outputs[0]
    assert alone.token_ids == outs[1].token_ids               # greedy stays greedy
    mixed = [o.outputs[0] for o in llm.generate(
        PROMPTS[:2], [unasked[0], SamplingParams(temperature=1.0, top_k=20, **base)])]
    assert mixed[0].sampling_mask is None
    check_alignment(mixed[1], len(tokenizer))
    assert llm.collective_rpc(_mask_work)[0][1] - work[1] == 8   # the masked row's tokens


def test_partial_prefill_rows_are_not_extracted(llm, tokenizer, hf_model):
    """Prompts longer than the 64-token budget are prefilled in chunks; the row of a
    partial chunk samples nothing (its draw is discarded), so it is not extracted:
    exactly one row is extracted per generated token, every partial chunk is
    counted as left out, and the masks stay aligned and exact."""
    prompts = [f"# case {i}\n" + "".join(PROMPTS[i:] + PROMPTS[:i]) * 2 for i in range(3)]
    assert min(len(prompt_ids(tokenizer, p)) for p in prompts) > 64
    cases = [dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_k=0, top_p=0.6),
             dict(temperature=1.0, top_k=40, top_p=0.9)]
    params = [SamplingParams(**c, max_tokens=6, ignore_eos=True, seed=500 + i, logprobs=0)
              for i, c in enumerate(cases)]
    (before,) = llm.collective_rpc(_mask_work)
    outs = llm.generate(prompts, params)
    (after,) = llm.collective_rpc(_mask_work)
    steps, rows, idle = (a - b for a, b in zip(after, before))
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == 6 * len(prompts)
    assert rows == tokens, f"{rows} rows extracted for {tokens} tokens"
    assert idle >= len(prompts)          # at least each prompt's first chunk
    assert 0 < steps <= rows
    for out in outs:
        check_alignment(out.outputs[0], len(tokenizer))
    assert_supports_match_reference(outs, cases, hf_model)


def test_preemption_and_recompute_keep_masks_aligned(llm, tokenizer):
    before = counter(llm, PREEMPTIONS)
    sp = [SamplingParams(temperature=1.0, top_k=20, max_tokens=40, ignore_eos=True,
                         seed=300 + i) for i in range(6)]
    outs = llm.generate(PROMPTS[:6], sp)   # 6 x ~50 tokens > 16 blocks x 16
    assert counter(llm, PREEMPTIONS) > before, "the KV cache was meant to force preemption"
    for out in outs:
        assert len(out.outputs[0].token_ids) == 40
        check_alignment(out.outputs[0], len(tokenizer))
    # A preempted request is recomputed: same seed, same tokens and masks as alone.
    alone = llm.generate([PROMPTS[0]], sp[0])[0].outputs[0]
    assert alone.token_ids == outs[0].outputs[0].token_ids
    assert alone.sampling_mask == outs[0].outputs[0].sampling_mask


def test_sampling_parameters_act(llm, tokenizer):
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
    assert len(bad_id) == 1, "the bad word must be one token for this check"
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


def _ask(value):
    return {"return_sampling_mask": value}


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(llm, monkeypatch):
    # refusals name prompt ids as `LLM.generate` takes them in a process that serves
    # no HTTP route; this worker may have imported the server's modules for another
    # test module (pytest-xdist orders modules per worker)
    from vllm_sampling_mask.patches.frontend.fixes.token_id_validation import SERVER_MODULES
    for name in SERVER_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["x"], SamplingParams(temperature=0.0, top_k=10, extra_args=_ask(True)))
    with pytest.raises(ValueError, match="max-sampling-mask-size 128"):
        llm.generate(["x"], SamplingParams(temperature=1.0, top_k=200,
                                           extra_args=_ask(True)))
    with pytest.raises(ValueError, match="return_sampling_mask must be true, false"):
        llm.generate(["x"], SamplingParams(temperature=1.0, top_k=5,
                                           extra_args=_ask("yes")))
    # token ids the model has no row for (upstream let == vocab size through: engine dead)
    with pytest.raises(ValueError, match=r"token id 4096 \(position 1 of 2\).*\[0, 4095\]"):
        llm.generate({"prompt_token_ids": [5, 4096]}, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="prompt_token_ids: token id -1") as refused:
        llm.generate({"prompt_token_ids": [-1, 5]}, SamplingParams(max_tokens=2))
    assert "/inference" not in str(refused.value)   # offline: named as LLM takes them
    with pytest.raises(ValueError, match="stop_token_ids: token id 4096"):
        llm.generate(["x"], SamplingParams(stop_token_ids=[4096], min_tokens=1))
    out = llm.generate(["x"], SamplingParams(temperature=1.0, top_k=5, max_tokens=3))
    assert len(out[0].outputs[0].sampling_mask) == 3


def test_greedy_opted_out_and_masked_requests_share_a_batch(llm, tokenizer):
    """Nothing that asks for no mask is refused or given one; the rest are exact."""
    base = dict(max_tokens=12, ignore_eos=True, seed=5)
    params = [
        SamplingParams(temperature=0.0, **base),                          # greedy
        SamplingParams(temperature=1.0, **base),                          # untruncated
        SamplingParams(temperature=1.0, top_k=20, extra_args=_ask(False), **base),
        SamplingParams(temperature=1.0, top_k=20, **base),                # default
        SamplingParams(temperature=1.0, top_p=0.8, **base),               # top-p only
        SamplingParams(temperature=1.0, min_p=0.1, **base),               # min-p only
        SamplingParams(temperature=1.0, allowed_token_ids=list(range(100, 150)),
                       extra_args=_ask(True), **base),   # explicit: only banned ids cut
    ]
    outs = [o.outputs[0] for o in llm.generate(PROMPTS[:7], params)]
    for c in outs[:3]:
        assert c.sampling_mask is None and len(c.token_ids) == 12
    # the top-p-only request left the switch null: one of its steps may be wider
    # than the engine's 128 ids; it still runs to its end, and then carries no mask
    # but the reason, never a partial one
    top_p_only = outs[4]
    assert top_p_only.finish_reason == "length" and len(top_p_only.token_ids) == 12
    if top_p_only.sampling_mask is None:
        assert "--max-sampling-mask-size 128" in top_p_only.sampling_mask_reason
    for c in outs[3:]:
        if c is not top_p_only or c.sampling_mask is not None:
            check_alignment(c, len(tokenizer))
    alone = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12,
                                                      ignore_eos=True))[0].outputs[0]
    assert outs[0].token_ids == alone.token_ids          # greedy stays greedy
    # explicit true where only allowed_token_ids cuts: exactly the allowed ids
    assert all(s == list(range(100, 150)) for s in outs[6].sampling_mask.token_ids)


def test_top_p_only_and_min_p_only_supports_are_exact(llm, hf_model):
    cases = [dict(temperature=1.0, top_k=0, top_p=0.6), dict(temperature=0.8, top_k=0,
                                                             min_p=0.15)]
    params = [SamplingParams(temperature=c["temperature"], top_p=c.get("top_p", 1.0),
                             min_p=c.get("min_p", 0.0), max_tokens=16, seed=60 + i,
                             logprobs=0) for i, c in enumerate(cases)]
    outs = llm.generate(PROMPTS[:2], params)
    assert_supports_match_reference(outs, cases, hf_model)


def test_a_support_wider_than_the_size_limit_ends_only_its_request(llm, tokenizer):
    """top_p=0.999 alone keeps thousands of ids: wider than the engine's 128. A request
    that asked for its mask ends with the size error; one that left the switch null is
    never failed by the mask path: it runs to its end, without a mask from that
    token on, and `sampling_mask_reason` says why (never a partial mask)."""
    params = [SamplingParams(temperature=1.0, top_p=0.999, max_tokens=8, seed=70,
                             extra_args=_ask(True)),
              SamplingParams(temperature=1.0, top_k=20, max_tokens=8, ignore_eos=True,
                             seed=71),
              SamplingParams(temperature=1.0, top_p=0.999, max_tokens=8, seed=70,
                             ignore_eos=True)]
    wide, fine, unasked = [o.outputs[0] for o in llm.generate(PROMPTS[:2] + PROMPTS[:1],
                                                              params)]
    assert unasked.finish_reason == "length" and len(unasked.token_ids) == 8
    assert unasked.sampling_mask is None and unasked.sampling_mask_error is None
    assert "--max-sampling-mask-size 128" in unasked.sampling_mask_reason
    assert wide.finish_reason == "error"
    assert "--max-sampling-mask-size 128" in wide.sampling_mask_error
    assert len(wide.sampling_mask) == len(wide.token_ids)
    check_alignment(fine, len(tokenizer))
    assert len(fine.token_ids) == 8 and fine.sampling_mask_error is None
    again = llm.generate([PROMPTS[1]], params[1])[0].outputs[0]
    assert again.sampling_mask == fine.sampling_mask


def _set_extraction_settings(worker, values):
    """Runs in the worker: give the runner's mask state (`SamplingMaskState`)
    `ExtractionSettings(**values)`; return the old ones as a dict (the RPC
    carries plain values)."""
    import dataclasses

    from vllm_sampling_mask.worker.extraction import ExtractionSettings

    state = worker.model_runner.sampling_mask
    old, state.settings = state.settings, ExtractionSettings(**values)
    return dataclasses.asdict(old)


def test_a_row_the_mask_cannot_describe_ends_only_its_request(llm):
    """Force wide rows with a single wide-row slot in the worker, which writes the
    block a GPU step writes (`implementation="host"`; a CPU step's host form has
    no width): a tie margin of -15 makes the width top_k - 15 < top_k (so every
    row is unexpectedly wide) and one spare slot lets only one row of each step
    through exactly."""
    params = [SamplingParams(temperature=1.0, top_k=20, max_tokens=6, ignore_eos=True,
                             seed=900 + i, extra_args=_ask(True)) for i in range(3)]
    clean = [o.outputs[0] for o in llm.generate(PROMPTS[:3], params)]
    (old,) = llm.collective_rpc(_set_extraction_settings,
                                args=({"tie_margin": -15, "spare_wide_slots": 1,
                                       "implementation": "host"},))
    try:
        faulty = [o.outputs[0] for o in llm.generate(PROMPTS[:3], params)]
    finally:
        llm.collective_rpc(_set_extraction_settings, args=(old,))
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
