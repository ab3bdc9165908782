"""The GPU's top-k/top-p kernel meets the mask: an MRv2 engine whose sampler runs
vLLM's Triton `_topk_topp_kernel` (interpreted), as CUDA batches of 8 or more do.

VLLM_SAMPLING_MASK_TRITON_TOPK=1 (read where the worker imports vLLM's top-k/top-p
module) makes the interpreter shim leave upstream's dispatch alone. A recorder
installed in the worker keeps every call's input logits, k, p and output; the test
checks (1) on the engine's own inputs, the kernel keeps exactly what the independent
reference model of the kernel keeps, and (2) every support the engine returned is
one of the rows the kernel left finite, token for token.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import ENGINE_KWARGS
from test_interpreted_topk_topp_kernel import reference_triton_top_k_top_p_mask
from vllm import LLM, SamplingParams

PROMPTS = [f"def function_{i}(self, value):\n    " for i in range(8)]


@pytest.fixture(scope="module")
def llm():
    os.environ["VLLM_SAMPLING_MASK_TRITON_TOPK"] = "1"   # inherited by the worker
    try:
        engine = LLM(**ENGINE_KWARGS, max_num_seqs=8)
    finally:
        del os.environ["VLLM_SAMPLING_MASK_TRITON_TOPK"]
    yield engine
    del engine


def _install_recorder(worker):
    """Runs in the worker: record each call of the sampler's top-k/top-p."""
    import wrapt

    import vllm.v1.worker.gpu.sample.sampler as sampler_module
    calls = []

    def record(wrapped, instance, args, kwargs):
        logits, k, p = args
        inputs = (logits.clone(), None if k is None else k.clone(),
                  None if p is None else p.clone())
        out = wrapped(*args, **kwargs)
        calls.append((*inputs, torch.isfinite(out)))
        return out

    wrapt.wrap_function_wrapper(sampler_module, "apply_top_k_top_p", record)
    sampler_module.RECORDED_TOP_K_TOP_P = calls
    return True


def _take_records(worker):
    """Runs in the worker: the recorded calls, as numpy arrays (they cross the RPC)."""
    import vllm.v1.worker.gpu.sample.sampler as sampler_module
    calls = [{"logits": logits.numpy(), "finite": finite.numpy(),
              "k": None if k is None else k.numpy(), "p": None if p is None else p.numpy()}
             for logits, k, p, finite in sampler_module.RECORDED_TOP_K_TOP_P]
    sampler_module.RECORDED_TOP_K_TOP_P.clear()
    return calls


def test_masks_are_what_the_triton_kernel_kept(llm):
    assert llm.collective_rpc(_install_recorder) == [True]
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=p, max_tokens=10,
                             ignore_eos=True, seed=40 + i)
              for i, (k, p) in enumerate([(20, 1.0), (50, 0.9), (5, 1.0), (40, 0.8),
                                          (100, 0.95), (8, 1.0), (30, 0.7), (64, 0.99)])]
    outs = llm.generate(PROMPTS, params)
    (calls,) = llm.collective_rpc(_take_records)
    assert max(len(c["logits"]) for c in calls) == 8, "a batch of 8 must reach the kernel"
    kept_rows = set()
    for call in calls:
        logits, finite = torch.as_tensor(call["logits"]), torch.as_tensor(call["finite"])
        k, p = (None if call[n] is None else torch.as_tensor(call[n]) for n in ("k", "p"))
        want = reference_triton_top_k_top_p_mask(logits, k, p)
        assert torch.equal(finite, want), \
            f"kernel vs reference: rows {(finite != want).any(1).nonzero().view(-1).tolist()}"
        kept_rows.update(tuple(torch.nonzero(row).view(-1).tolist()) for row in finite)
    tokens = 0
    for out, sp in zip(outs, params):
        c = out.outputs[0]
        assert len(c.sampling_mask) == len(c.token_ids) == 10
        for token, support in zip(c.token_ids, c.sampling_mask.token_ids):
            assert token in support
            assert tuple(support) in kept_rows
            if sp.top_p == 1.0:
                assert len(support) == sp.top_k   # the kernel cuts ties: exactly k
            tokens += 1
    assert tokens == 80
