"""Sampling masks under speculative decoding, on both runners (on CPU: V1 natively,
Model Runner V2 through Triton's interpreter).

One engine per runner and method: `draft_model` run through the module's tests in
turn, `ngram` through the first only (`EVERY_ENGINE`):
`draft_model` with a draft that is a perturbed copy of the demo model
(`demo.perturbed_draft`: every matrix plus Gaussian noise of 8% of its own
spread, so the draft disagrees
with the target often enough that a step accepts some drafts, rejects others,
recovers and, when all drafts pass, adds a bonus token), and `ngram` (prompt
lookup; its drafts come from the text). Three positions per verify step.

What a mask must be there: each emitted token (accepted draft, recovered, bonus)
gets the support of the processed target distribution at its position, checked
against an independent transformers forward pass over its prefix, whatever kind
of token it is; rejected drafts contribute nothing; masks on or off change no
token, logprob or acceptance. Masks stay exact for a prompt served from the prefix
cache and for requests preempted between verify steps (the KV cache is kept small).
Over HTTP: tests/server/test_speculative_http.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (ENGINE_KWARGS, PROMPTS, assert_supports_match_reference,
                      check_alignment, counter, engine_on, skip_without_v1_runner)
from releases_facts import facts
from test_support_logprobs_engine import check_exact
from vllm import SamplingParams

from vllm_sampling_mask.tools.demo import perturbed_draft
from vllm_sampling_mask.patches.apply import upstream_release

K = 3   # draft positions per verify step
METHODS = ["draft_model", "ngram"]
RUNNERS = ["v1", "mrv2"]   # V1 natively; Model Runner V2 through Triton's interpreter
MASK_OFF = {"return_sampling_mask": False}
MAX_SIZE = 128   # --max-sampling-mask-size, so that a wide support can trip it
KV_BLOCKS = 9    # of 32 tokens: one max_model_len and the null block, so six requests preempt
V1_CANNOT = (f"vLLM {upstream_release().version}'s V1 runner cannot run speculative decoding "
             "on a CPU host, stock vLLM too (releases_facts' v1_cpu_speculation: on 0.24 "
             "\"_sample_recovered_tokens_kernel_impl() got an unexpected keyword argument "
             "'USE_FP64_GUMBEL'\", on 0.30 \"Cannot inspect kernel parameters for function\")")


@pytest.fixture(scope="module")
def draft(tmp_path_factory) -> str:
    return perturbed_draft(str(tmp_path_factory.mktemp("draft") / "model"))


ENGINES = [pytest.param((runner, method), id=f"{runner}-{method}",
                         marks=pytest.mark.mrv2 if runner == "mrv2" else ())
           for runner in RUNNERS for method in METHODS]
# Every test runs on `draft_model` on both runners; `ngram` runs the masks against the
# reference only (EVERY_ENGINE): its proposer is the one thing it adds, in front of
# the same verify step and output path as `draft_model`'s (which drafts decide only
# which tokens are emitted, and each emitted token's mask is the target's support).
EVERY_ENGINE = pytest.mark.parametrize("llm", ENGINES, indirect=True)


@pytest.fixture(scope="module", params=[e for e in ENGINES if e.values[0][1] == "draft_model"])
def llm(request, draft):
    runner, method = request.param
    release = upstream_release()
    if runner == "v1":
        skip_without_v1_runner()
    if runner == "v1" and not facts(release).v1_cpu_speculation:
        pytest.skip(V1_CANNOT)
    if runner == "mrv2" and method not in facts(release).mrv2_speculators:
        pytest.skip(f"vLLM {release.version}'s Model Runner V2 does not run the "
                    f"speculative method {method!r} (upstream refuses it: \"Model Runner V2 "
                    f"does not yet support\"; releases_facts' mrv2_speculators)")
    if method == "draft_model":
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": K}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}
    engine = engine_on(runner, **dict(ENGINE_KWARGS, max_model_len=256, max_num_seqs=8,
                                      max_logprobs=8, disable_log_stats=False,
                                      max_sampling_mask_size=MAX_SIZE,
                                      speculative_config=spec,
                                      num_gpu_blocks_override=KV_BLOCKS, block_size=32))
    engine.method = method
    yield engine
    del engine


def spec_counters(llm) -> np.ndarray:
    """(drafts, draft tokens, accepted, accepted at each position...) so far."""
    found = {m.name: m for m in llm.get_metrics()}
    per_position = found["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    return np.array([found["vllm:spec_decode_num_drafts"].value,
                     found["vllm:spec_decode_num_draft_tokens"].value,
                     found["vllm:spec_decode_num_accepted_tokens"].value, *per_position])


def generate_counting(llm, prompts, params):
    before = spec_counters(llm)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, spec_counters(llm) - before


CASES = [dict(temperature=0.6, top_k=20), dict(temperature=0.8, top_k=40, top_p=0.9),
         dict(temperature=0.5, top_p=0.8), dict(temperature=1.0, top_k=8),
         dict(temperature=0.7, top_k=64, top_p=0.7), dict(temperature=0.4, top_k=30)]


def params_for(cases, seed: int, max_tokens: int = 40, **extra):
    return [SamplingParams(**{"top_k": 0, **c}, max_tokens=max_tokens, seed=seed + i,
                           ignore_eos=True, logprobs=0, **extra)
            for i, c in enumerate(cases)]


@EVERY_ENGINE
def test_every_emitted_token_has_the_target_support_at_its_position(llm, hf_model):
    cases = [{"top_k": 0, **c} for c in CASES]
    outs, counts = generate_counting(llm, PROMPTS[:len(cases)], params_for(cases, 100))
    for out in outs:
        check_alignment(out.outputs[0], hf_model.config.vocab_size)
    compared = assert_supports_match_reference(outs, cases, hf_model)
    assert compared == 40 * len(cases)
    drafts, draft_tokens, accepted = counts[:3]
    assert accepted > 0 and draft_tokens - accepted > 0     # accepted and rejected drafts
    if llm.method == "draft_model":   # every draft has K tokens: all K accepted = a bonus
        bonus = counts[3 + K - 1]
        recovered = drafts - bonus   # a draft with a rejection ends in a recovered token
        assert bonus > 0 and recovered > 0, counts


def test_preempted_requests_keep_exact_masks(llm, hf_model):
    """Six requests outgrow the KV cache, so some are preempted between verify
    steps, their drafts dropped, and recomputed from their prompt and tokens so far.
    Their tokens need not equal the same seeded requests run another time: where a
    preemption falls depends on when each request reached the engine core, and a
    resumed request's first step verifies no drafts, so its seeded draws fall on
    other steps (stock vLLM too). What must hold is the mask of every token."""
    cases = [dict(temperature=1.0, top_k=20)] * 6
    before = counter(llm, "vllm:num_preemptions")
    outs = llm.generate(PROMPTS[:6], params_for(cases, 300), use_tqdm=False)
    assert counter(llm, "vllm:num_preemptions") > before, "the KV cache was meant to force preemption"
    for out in outs:
        check_alignment(out.outputs[0], hf_model.config.vocab_size)
    assert assert_supports_match_reference(outs, cases, hf_model) == 6 * 40


def test_a_prefix_cache_hit_keeps_exact_masks(llm, hf_model):
    """A prompt of three full KV blocks, asked again: the second time its blocks
    come from the prefix cache, and every emitted token's mask is still the
    target's support."""
    prompt = " ".join(PROMPTS) * 2      # 110 tokens: three blocks of 32
    cases = [dict(temperature=0.8, top_k=20)] * 3
    first = llm.generate([prompt], params_for(cases[:1], 700, max_tokens=24),
                         use_tqdm=False)
    hits = counter(llm, "vllm:prefix_cache_hits")
    again = llm.generate([prompt, prompt], params_for(cases[1:], 710, max_tokens=24),
                         use_tqdm=False)
    assert counter(llm, "vllm:prefix_cache_hits") - hits >= 2 * 96
    assert assert_supports_match_reference(first + again, cases, hf_model) == 3 * 24


def assert_masks_changed_nothing(on, off, counts_on, counts_off) -> None:
    """The same seeded requests with masks on and off (the per-request switch):
    masks only where asked, the same tokens and logprobs, the same speculative
    counters, some drafts accepted.

    Logprobs agree to float32 rounding, not bit for bit: each request reaches the
    engine core in a message of its own, so a run's first step prefills one, two or
    all three prompts as they arrive, and a CPU matmul rounds a row differently with
    the batch's row count (9.5e-7 at one first token in a CI run, masks off and on
    alike). What a mask could break (a filter applied twice, a renormalisation)
    moves a logprob by the log of a kept mass, far above 1e-5."""
    for a, b in zip(on, off):
        assert a.outputs[0].sampling_mask is not None and b.outputs[0].sampling_mask is None
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        np.testing.assert_allclose(
            [lp[t].logprob for t, lp in zip(a.outputs[0].token_ids, a.outputs[0].logprobs)],
            [lp[t].logprob for t, lp in zip(b.outputs[0].token_ids, b.outputs[0].logprobs)],
            rtol=0, atol=1e-5)
    assert counts_on.tolist() == counts_off.tolist()
    assert counts_on[2] > 0


def test_masks_on_or_off_change_no_token_logprob_or_acceptance(llm):
    # Three requests fit the small KV cache: no preemption, whose timing (when each
    # request reaches the engine core) would move drafts between steps.
    cases, before = CASES[:3], counter(llm, "vllm:num_preemptions")
    on, counts_on = generate_counting(llm, PROMPTS[:3], params_for(cases, 200, max_tokens=24))
    off, counts_off = generate_counting(llm, PROMPTS[:3], params_for(
        cases, 200, max_tokens=24, extra_args=MASK_OFF))
    assert counter(llm, "vllm:num_preemptions") == before
    assert_masks_changed_nothing(on, off, counts_on, counts_off)


def test_support_logprobs_of_every_emitted_token(llm, hf_model):
    cases = [dict(temperature=0.8, top_k=20), dict(temperature=0.6, top_k=40, top_p=0.9)]
    outs = llm.generate(PROMPTS[:2], params_for(
        cases, 300, max_tokens=24, extra_args={"return_sampling_mask_logprobs": True}),
        use_tqdm=False)
    # (Model Runner V2 computes its `logprobs` output with its own kernel: a few 1e-7 off)
    tol = 0.0 if llm.runner == "v1" else 5e-6
    assert sum(check_exact(o, c["temperature"], hf_model, sampled_tol=tol)
               for o, c in zip(outs, cases)) == 48


def test_n_children_and_stops_keep_one_mask_per_token(llm, tokenizer):
    """n > 1 (each child its own rows) and stop tokens that cut a step's emitted
    tokens short: one mask per kept token."""
    vocab = len(tokenizer)
    # stop on the tokens the request writes after its eighth (run alone, without
    # stops) and not before: seeded, it stops at its ninth token or later, where a
    # verify step emits up to K + 1 tokens at once
    free = SamplingParams(temperature=0.7, top_k=30, max_tokens=24, seed=401)
    ids = llm.generate(PROMPTS[1:2], free, use_tqdm=False)[0].outputs[0].token_ids
    stops = sorted(set(ids[8:]) - set(ids[:8]))
    params = [SamplingParams(temperature=0.7, top_k=30, max_tokens=24, n=3, seed=400),
              SamplingParams(temperature=0.7, top_k=30, max_tokens=24, seed=401,
                             stop_token_ids=stops)]
    outs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert len(outs[0].outputs) == 3
    stopped = outs[1].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] in stops
    for out in outs:
        for completion in out.outputs:
            check_alignment(completion, vocab)


def test_a_support_past_the_size_limit_ends_only_its_request(llm):
    """A verify step whose position is wider than --max-sampling-mask-size: the
    request that asked for its mask ends with the size error, carrying the masks
    of the tokens before that step (none of the step's); a request that left the
    switch null runs to its end and says why it has no mask; the request beside
    them keeps its masks."""
    wide = dict(temperature=1.0, top_p=0.999, max_tokens=16, ignore_eos=True, seed=70)
    asked, unasked, fine = (o.outputs[0] for o in llm.generate(PROMPTS[:3], [
        SamplingParams(**wide, extra_args={"return_sampling_mask": True}),
        SamplingParams(**wide),
        SamplingParams(temperature=0.8, top_k=20, max_tokens=16, ignore_eos=True, seed=71)],
        use_tqdm=False))
    assert asked.finish_reason == "error"
    assert f"--max-sampling-mask-size {MAX_SIZE}" in asked.sampling_mask_error
    assert len(asked.sampling_mask) == len(asked.token_ids) < 16
    assert unasked.finish_reason == "length" and len(unasked.token_ids) == 16
    assert unasked.sampling_mask is None
    assert f"--max-sampling-mask-size {MAX_SIZE}" in unasked.sampling_mask_reason
    check_alignment(fine, 4096)
    assert len(fine.token_ids) == 16


def test_min_p_and_logit_bias_never_reach_a_verify_step(llm):
    """vLLM's V1 rejection sampler applies neither min_p nor logit_bias at draft
    positions; upstream refuses both under speculative decoding, mask or not
    (`SamplingParams._validate_spec_decode`), so no mask has to describe a draw
    that ignored them. The overlay relies on that refusal: this checks it holds."""
    for sampling in (dict(min_p=0.1), dict(logit_bias={5: 1.0})):
        for extra in ({}, MASK_OFF):
            with pytest.raises(Exception, match="min_p and logit_bias"):
                llm.generate(PROMPTS[:1], SamplingParams(
                    temperature=0.8, top_k=20, max_tokens=4, **sampling,
                    extra_args=extra), use_tqdm=False)
    out, = llm.generate(PROMPTS[:1], SamplingParams(temperature=0.8, top_k=20, max_tokens=4),
                        use_tqdm=False)    # the engine keeps serving
    assert len(out.outputs[0].sampling_mask) == 4
