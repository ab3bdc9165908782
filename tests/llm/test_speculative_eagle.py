"""Sampling masks under EAGLE speculative decoding, on both runners (on CPU: V1
natively, Model Runner V2 through Triton's interpreter).

EAGLE drafts with a small head fed the target's hidden states, not with a model of
its own: a different proposer in front of the same verify step as `draft_model`
and `ngram` (tests/llm/test_speculative.py and test_speculative_http.py, which cover
the rest: every kind of emitted token, n > 1, stops, the size limit, preemption,
streaming, aborts). The head is `demo.eagle_head`, built from the demo model's last
layer; its drafts are poor, so verify steps reject most and accept some. Each
emitted token's mask must be the processed target's support at its position,
checked against an independent transformers forward pass, and masks on or off
change no token, logprob or acceptance.

MTP heads (the multi-token-prediction layers DeepSeek-V3, Qwen3-Next, MiMo and
others ship) are not run here: the demo model has none. They go through the same
verify step.
"""

from __future__ import annotations

import pytest
from conftest import (ENGINE_KWARGS, PROMPTS, assert_supports_match_reference,
                      check_alignment, engine_on)
from releases_facts import installed
from test_speculative import (CASES, MASK_OFF, V1_CANNOT, assert_masks_changed_nothing,
                              generate_counting, params_for)

from vllm_sampling_mask.tools.demo import eagle_head

K = 2   # draft positions per verify step


@pytest.fixture(scope="module", params=[
    pytest.param("v1", id="v1-eagle"),
    pytest.param("mrv2", id="mrv2-eagle", marks=pytest.mark.mrv2)])
def llm(request, tmp_path_factory):
    runner = request.param
    if runner == "v1" and not installed().v1_cpu_speculation:
        pytest.skip(V1_CANNOT)
    head = eagle_head(str(tmp_path_factory.mktemp("eagle") / "head"))
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": K}
    engine = engine_on(runner, **dict(ENGINE_KWARGS, max_model_len=256, max_num_seqs=8,
                                      max_logprobs=8, disable_log_stats=False,
                                      speculative_config=spec))
    yield engine
    del engine


def test_every_emitted_token_has_the_target_support_at_its_position(llm, hf_model):
    cases = [{"top_k": 0, **c} for c in CASES]
    outs, counts = generate_counting(llm, PROMPTS[:len(cases)], params_for(cases, 500))
    for out in outs:
        check_alignment(out.outputs[0], hf_model.config.vocab_size)
    assert assert_supports_match_reference(outs, cases, hf_model) == 40 * len(cases)
    drafts, draft_tokens, accepted = counts[:3]
    assert drafts > 0 and accepted > 0 and draft_tokens - accepted > 0, counts


def test_masks_on_or_off_change_no_token_logprob_or_acceptance(llm):
    # Model Runner V2 (through the interpreter: 100 s for six requests of 40 tokens
    # on and off) takes three of 24, where it accepts some drafts; V1 needs the six
    # of 40 to accept any (three or six of 24 accepted none)
    n, tokens = (3, 24) if llm.runner == "mrv2" else (6, 40)
    on, counts_on = generate_counting(llm, PROMPTS[:n], params_for(
        CASES[:n], 600, max_tokens=tokens))
    off, counts_off = generate_counting(llm, PROMPTS[:n], params_for(
        CASES[:n], 600, max_tokens=tokens, extra_args=MASK_OFF))
    assert_masks_changed_nothing(on, off, counts_on, counts_off)
