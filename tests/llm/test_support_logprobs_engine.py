"""Support logprobs (`return_sampling_mask_logprobs`) through `LLM`, on the V1 runner.

One engine for the module: the demo model, float32, V1 natively, the mask on.
Per generated token of a request that asked: the logprobs of its support (in the
mask's order) are normalised (logsumexp 0 within 1e-5), the sampled token's entry
is its processed logprob (the `logprobs` output), and both, and log S, match an
independent float64 reference built from transformers' logits over the returned
support (within 5e-5). Rows that did not ask carry none, in the same batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ENGINE_KWARGS, PROMPTS, check_alignment, hf_logits, native_v1
from vllm import LLM, SamplingParams

ASK = {"return_sampling_mask_logprobs": True}


@pytest.fixture(scope="module")
def llm():
    with native_v1():
        engine = LLM(**dict(ENGINE_KWARGS, max_model_len=256, max_num_seqs=8,
                            max_logprobs=8, max_sampling_mask_size=256))
    yield engine
    del engine


def reference(logits_row: torch.Tensor, temperature: float, support) -> tuple[np.ndarray, float]:
    """(logprobs of `support` under the scaled distribution renormalised over it,
    log S), in float64 from the definitions."""
    x = logits_row.double() / temperature
    kept = x[torch.as_tensor(list(support))]
    log_kept = torch.logsumexp(kept, 0)
    return (kept - log_kept).numpy(), float(log_kept - torch.logsumexp(x, 0))


def check_exact(out, temperature: float, hf_model, sampled_tol: float = 0.0) -> int:
    """`sampled_tol`: 0 on the V1 runner, where the `logprobs` output is read from the
    very tensor the values are gathered from; Model Runner V2 computes its
    `logprobs` output with its own log-softmax kernel (another float32 summation
    order), a few 1e-7 away."""
    c = out.outputs[0]
    mask = check_alignment(c, hf_model.config.vocab_size)
    assert mask.logprobs is not None and mask.log_kept is not None
    assert mask.logprobs.dtype == np.float32 and len(mask.logprobs) == len(mask.ids)
    assert len(mask.log_kept) == len(c.token_ids)
    logits = hf_logits(hf_model, out.prompt_token_ids, c.token_ids)
    for t, token in enumerate(c.token_ids):
        support, values = mask[t], mask.logprobs_of(t)
        assert np.all(np.isfinite(values))
        total = torch.logsumexp(torch.from_numpy(values).double(), 0).item()
        assert abs(total) <= 1e-5, (t, total)
        at = int(np.searchsorted(support, token))
        assert abs(float(values[at]) - c.logprobs[t][token].logprob) <= sampled_tol, (
            t, float(values[at]), c.logprobs[t][token].logprob)
        ref, ref_log_kept = reference(logits[t], temperature, support)
        assert np.abs(values - ref).max() <= 5e-5, (t, np.abs(values - ref).max())
        assert abs(float(mask.log_kept[t]) - ref_log_kept) <= 5e-5, (
            t, float(mask.log_kept[t]), ref_log_kept)
        assert mask.log_kept[t] <= 0
    return len(c.token_ids)


CASES = [dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_k=50, top_p=0.9),
         dict(temperature=1.2, top_k=40, min_p=0.1),
         dict(temperature=0.6, top_k=64, top_p=0.7, min_p=0.02),
         dict(temperature=1.0, top_p=0.8)]


def test_support_logprobs_are_exact_and_match_a_reference(llm, hf_model):
    params = [SamplingParams(**c, max_tokens=16, seed=40 + i, logprobs=0, extra_args=ASK)
              for i, c in enumerate(CASES)]
    outs = llm.generate(PROMPTS[:len(CASES)], params)
    tokens = sum(check_exact(o, c["temperature"], hf_model) for o, c in zip(outs, CASES))
    assert tokens == 16 * len(CASES)
    # a truncated distribution kept less than all of the mass somewhere
    assert min(float(o.outputs[0].sampling_mask.log_kept.min()) for o in outs) < -1e-3


def test_only_the_rows_that_asked_carry_them_in_a_mixed_batch(llm, hf_model):
    asked = SamplingParams(temperature=0.9, top_k=30, max_tokens=12, seed=7, logprobs=0,
                           extra_args=ASK)
    masked = SamplingParams(temperature=0.9, top_k=30, max_tokens=12, seed=7, logprobs=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    unmasked = SamplingParams(temperature=0.9, top_k=30, max_tokens=12, seed=8,
                              extra_args={"return_sampling_mask": False})
    outs = llm.generate(PROMPTS[:4], [asked, masked, greedy, unmasked])
    check_exact(outs[0], 0.9, hf_model)
    assert outs[1].outputs[0].sampling_mask.logprobs is None
    assert outs[1].outputs[0].sampling_mask.log_kept is None
    assert outs[2].outputs[0].sampling_mask is None
    assert outs[3].outputs[0].sampling_mask is None
    # asking changes nothing else: same seed, same prompt -> same tokens and mask ids
    again = llm.generate([PROMPTS[1]], [SamplingParams(
        temperature=0.9, top_k=30, max_tokens=12, seed=7, logprobs=0, extra_args=ASK)])[0]
    assert again.outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert np.array_equal(again.outputs[0].sampling_mask.ids,
                          outs[1].outputs[0].sampling_mask.ids)


def test_asking_implies_the_mask_and_bad_values_fail_alone(llm):
    out = llm.generate([PROMPTS[0]], [SamplingParams(
        temperature=1.0, top_k=10, max_tokens=4, extra_args={
            "return_sampling_mask": None, **ASK})])[0]
    assert out.outputs[0].sampling_mask.logprobs is not None
    for extra, parameter in [({"return_sampling_mask_logprobs": "yes"},
                              "return_sampling_mask_logprobs"),
                             ({"return_sampling_mask": False, **ASK},
                              "return_sampling_mask_logprobs")]:
        with pytest.raises(ValueError, match=parameter):
            llm.generate([PROMPTS[0]], [SamplingParams(temperature=1.0, top_k=10,
                                                       max_tokens=4, extra_args=extra)])
    with pytest.raises(ValueError, match="temperature"):
        llm.generate([PROMPTS[0]], [SamplingParams(temperature=0.0, max_tokens=4,
                                                   extra_args=ASK)])
    # the engine keeps serving
    assert llm.generate([PROMPTS[0]], [SamplingParams(
        temperature=1.0, top_k=10, max_tokens=4, extra_args=ASK)])[0].outputs[0].token_ids


def _set_extraction_settings(worker, values):
    """Runs in the worker: give the runner's mask state other `ExtractionSettings`;
    return the old ones as a dict."""
    import dataclasses

    from vllm_sampling_mask.worker.extraction import ExtractionSettings

    state = worker.model_runner.sampling_mask
    old, state.settings = state.settings, ExtractionSettings(**values)
    return dataclasses.asdict(old)


def test_wide_rows_carry_their_logprobs(llm, hf_model):
    """The worker writes the block a GPU step writes (`implementation="host"`; a
    CPU step's host form has no width), and a tie margin of -15 makes the
    block's width top_k - 15: every row is wider
    than the block and takes a wide-row slot; the ids past the width come from
    its bits, their logprobs from the slot's row. Same tokens, ids and values as
    with the ordinary layout."""
    params = SamplingParams(temperature=1.0, top_k=20, max_tokens=6, seed=3, logprobs=0,
                            ignore_eos=True, extra_args=ASK)
    clean = llm.generate([PROMPTS[2]], [params])[0]
    (old,) = llm.collective_rpc(_set_extraction_settings,
                                args=({"tie_margin": -15, "spare_wide_slots": 1,
                                       "implementation": "host"},))
    try:
        wide = llm.generate([PROMPTS[2]], [params])[0]
    finally:
        llm.collective_rpc(_set_extraction_settings, args=(old,))
    assert wide.outputs[0].sampling_mask_error is None
    check_exact(wide, 1.0, hf_model)
    assert wide.outputs[0].token_ids == clean.outputs[0].token_ids
    assert wide.outputs[0].sampling_mask == clean.outputs[0].sampling_mask
