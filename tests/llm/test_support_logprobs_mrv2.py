"""Support logprobs on Model Runner V2 (Triton's interpreter on CPU): the same
exactness as on the V1 runner (`test_support_logprobs_engine.check_exact`; the
sampled entry against MRv2's own `logprobs` kernel within 5e-6, its float32
log-softmax summing in another order), with
min-p (its input is where the scaled logits are captured) and a step that needs
no logits processing at all (temperature 1, untruncated: log S is 0)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ENGINE_KWARGS, PROMPTS
from test_support_logprobs_engine import ASK, check_exact
from vllm import LLM, SamplingParams

pytestmark = pytest.mark.mrv2


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**dict(ENGINE_KWARGS, max_model_len=128, max_num_seqs=4, max_logprobs=8))
    yield engine
    del engine


def test_mrv2_support_logprobs_are_exact(llm, hf_model):
    cases = [dict(temperature=0.8, top_k=20), dict(temperature=1.2, top_k=40, min_p=0.1),
             dict(temperature=0.7, top_p=0.8)]
    params = [SamplingParams(**c, max_tokens=6, seed=50 + i, logprobs=0, extra_args=ASK)
              for i, c in enumerate(cases)]
    plain = SamplingParams(temperature=0.8, top_k=20, max_tokens=6, seed=50, logprobs=0)
    outs = llm.generate(PROMPTS[:4], params + [plain])
    for out, case in zip(outs, cases):
        check_exact(out, case["temperature"], hf_model, sampled_tol=5e-6)
    assert outs[3].outputs[0].sampling_mask.logprobs is None
    untruncated = llm.generate([PROMPTS[1]], [SamplingParams(
        temperature=1.0, max_tokens=3, seed=5, logprobs=0, extra_args={
            "return_sampling_mask": True, **ASK})])[0]
    check_exact(untruncated, 1.0, hf_model, sampled_tol=5e-6)
    assert np.abs(untruncated.outputs[0].sampling_mask.log_kept).max() <= 1e-6
