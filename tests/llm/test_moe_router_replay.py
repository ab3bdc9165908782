"""Sampling masks beside router replay on a tiny random Qwen3-MoE (V1 runner).

`scripts/make_tiny_moe.py` builds the model (2 layers, 4 experts, top-2, the demo
tokenizer). The module's engine asks for both the mask and vLLM's router replay
(`enable_return_routed_experts=True`), runs natively on the V1 runner, and checks:

* masks: one per token, the sampled token inside, equal on a seeded replay, and
  equal to the support computed from the transformers model's own float32 logits;
* routed experts, where the engine returns them: `CompletionOutput.routed_experts`
  is a [prompt_len - routed_experts_prompt_start + num_generated - 1, num_layers,
  top_k] array; row i holds the experts that routed the token at position
  prompt_start + i (every prompt token, then every generated token but the last,
  which never went through the model); the k ids of a row are in no set order.
  They match the transformers router's top-k, a seeded replay, a stopped replay's
  prefix, and a later prompt start.

vLLM 0.27.1 refuses router replay on a CPU host: the CPU MoE backend is
"monolithic" and has no capture hook, so the worker raises (gpu_model_runner.py,
`_bind_routed_experts_capturer`) "--enable-return-routed-experts is not supported
with monolithic MoE kernel NoneType; routed expert IDs would be silently
all-zero." vLLM 0.32 refuses it on the V1 runner anywhere, at configuration ("AuxOutput
Connector requires Model Runner V2"). The fixture checks that the refusal is the
expected one (`REFUSAL`), then serves the same model without router replay: the mask
tests run, `test_router_replay_on_this_platform` asserts the refusal, and the
routed-experts tests are `gpu` tests (deselected where CUDA is absent). The
combination is therefore untested on this CPU-only CI.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import tempfile

import numpy as np
import pytest
import torch
from conftest import assert_supports_match_reference, check_alignment, native_v1
from vllm import LLM, SamplingParams

from releases_facts import installed  # noqa: E402

if not torch.cuda.is_available() and not installed().cpu_moe_runs:
    pytest.skip("vLLM 0.24.0 runs no MoE model on a CPU host (stock too): its CPU "
                "fused-MoE torch path builds SiluAndMul, a CustomOp, at forward time "
                "(cpu_fused_moe.py's _CPU_MOE_ACT_FN), which fails \"Current vLLM config "
                "is not set\" (releases_facts: cpu_moe_runs)", allow_module_level=True)

CPU_REFUSAL = ("--enable-return-routed-experts is not supported with monolithic MoE "
               "kernel")
V1_REFUSAL = "AuxOutput Connector requires Model Runner V2"


def expected_refusal() -> str | None:
    """Why this release refuses router replay on the V1 runner here, or None: the
    release's own refusal at configuration where its source has it (0.32), else
    the CPU backend's (0.27.1)."""
    from vllm_sampling_mask.tools.seam_report import installed_vllm_dir

    if any(V1_REFUSAL in f.read_text("utf-8", "replace")
           for f in pathlib.Path(installed_vllm_dir()).rglob("config/*.py")):
        return V1_REFUSAL
    return None if torch.cuda.is_available() else CPU_REFUSAL
PROMPTS = ["def main():\n    ", "import os\nimport sys\n\n", "    for i in range(",
           "class Parser:\n    def __init__(self"]


def _load_builder():
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_moe.py"
    spec = importlib.util.spec_from_file_location("make_tiny_moe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


moe = _load_builder()


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return moe.make_tiny_moe(str(tmp_path_factory.mktemp("tiny-moe")), seed=0)


def _engine(model, routed):
    with native_v1():
        return LLM(model=model, dtype="float32", max_model_len=256, enforce_eager=True,
                   kv_cache_memory_bytes=1 << 30, seed=0, return_sampling_mask=True,
                   logprobs_mode="processed_logprobs", max_logprobs=64,
                   enable_return_routed_experts=routed)


def _start_with_router_replay(model):
    """(engine, None), or (None, the engine processes' log) when start-up fails.

    The engine processes log to the inherited stdout and stderr, so the log is
    taken at the file-descriptor level."""
    with tempfile.TemporaryFile() as log:
        saved = [os.dup(1), os.dup(2)]
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            return _engine(model, routed=True), None
        except (RuntimeError, ValueError) as exc:   # 0.32: a config ValidationError
            log.seek(0)
            return None, log.read().decode(errors="replace") + str(exc)
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


@pytest.fixture(scope="module")
def engine(moe_model):
    llm, failure = _start_with_router_replay(moe_model)
    refusal = None
    if llm is None:
        # the one failure expected (0.27.1: a CPU host's MoE backend cannot capture
        # routing; 0.32: no router replay on the V1 runner)
        assert expected_refusal() and expected_refusal() in failure, failure[-4000:]
        refusal = failure
        llm = _engine(moe_model, routed=False)
    yield llm, refusal
    del llm


@pytest.fixture(scope="module")
def llm(engine):
    return engine[0]


@pytest.fixture
def routed(engine):
    """The engine, for the `gpu` tests that need routed experts back."""
    llm, refusal = engine
    assert refusal is None, refusal[-2000:]
    return llm


def test_router_replay_on_this_platform(engine):
    """0.27.1: router replay starts on CUDA, a CPU host refuses it for this reason;
    0.32 refuses it on the V1 runner."""
    _, refusal = engine
    if expected_refusal() is None:
        assert refusal is None
    else:
        assert refusal is not None and expected_refusal() in refusal


@pytest.fixture(scope="module")
def hf_moe(moe_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).eval()


def _params(**kw):
    return SamplingParams(**{**dict(temperature=1.0, top_k=20, max_tokens=8), **kw})


def _rows(routed_experts):
    """Routing as sets: the k ids of a row come in no set order."""
    return np.sort(np.asarray(routed_experts, dtype=np.int64), axis=-1)


def check_routing(out, completion, prompt_start=0):
    """The documented layout: one row per token that went through the model."""
    re = completion.routed_experts
    assert isinstance(re, np.ndarray)
    rows = len(out.prompt_token_ids) - prompt_start + len(completion.token_ids) - 1
    assert re.shape == (rows, moe.NUM_LAYERS, moe.TOP_K)
    assert re.min() >= 0 and re.max() < moe.NUM_EXPERTS
    sorted_rows = _rows(re)
    assert (np.diff(sorted_rows, axis=-1) > 0).all()   # k distinct experts per row
    return sorted_rows


def test_engine_is_the_v1_runner_with_fused_moe_layers(llm):
    def probe(worker):
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        runner = worker.model_runner
        moe_layers = [m for m in runner.model.modules() if isinstance(m, MoERunner)]
        return (type(runner).__module__, len(moe_layers),
                runner.sampler.sampling_mask is runner.sampling_mask is not None)

    (module, n_moe, enabled), = llm.collective_rpc(probe)
    expected = "cpu_model_runner" if not torch.cuda.is_available() else "gpu_model_runner"
    assert module == f"vllm.v1.worker.{expected}"
    assert n_moe == moe.NUM_LAYERS and enabled is True


def test_masks_and_routing_for_mixed_requests(engine, tokenizer):
    llm, refusal = engine
    vocab = len(tokenizer)
    free = llm.generate([PROMPTS[2]], _params(max_tokens=12, seed=7, ignore_eos=True))[0]
    stop_id = free.outputs[0].token_ids[4]
    cut = free.outputs[0].token_ids.index(stop_id) + 1
    params = [_params(seed=1), _params(seed=2, n=2, top_p=0.9),
              _params(seed=7, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_id]),
              _params(seed=4, min_p=0.05, max_tokens=16, ignore_eos=True)]
    outs = llm.generate(PROMPTS[:2] + PROMPTS[2:4], params)
    assert [len(o.outputs) for o in outs] == [1, 2, 1, 1]
    for out in outs:
        for c in out.outputs:
            check_alignment(c, vocab)
            assert (c.routed_experts is None) == (refusal is not None)
    stopped = outs[2].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    assert stopped.token_ids == free.outputs[0].token_ids[:cut]
    assert stopped.sampling_mask.token_ids == free.outputs[0].sampling_mask.token_ids[:cut]
    if refusal:
        return
    p = len(free.prompt_token_ids)
    full = check_routing(free, free.outputs[0])
    assert np.array_equal(check_routing(outs[2], stopped), full[:p + cut - 1])
    first, second = (check_routing(outs[1], c) for c in outs[1].outputs)
    prompt_rows = len(outs[1].prompt_token_ids)
    assert np.array_equal(first[:prompt_rows], second[:prompt_rows])   # one prompt
    for out in (outs[0], outs[3]):
        check_routing(out, out.outputs[0])


def test_seeded_replay_is_identical(llm):
    params = [_params(seed=11, max_tokens=16, ignore_eos=True),
              _params(seed=12, top_p=0.8, n=2, max_tokens=10)]
    a = llm.generate(PROMPTS[:2], params)
    b = llm.generate(PROMPTS[:2], params)
    for x, y in zip(a, b):
        for cx, cy in zip(x.outputs, y.outputs):
            assert cx.token_ids == cy.token_ids
            assert cx.sampling_mask == cy.sampling_mask
            if cx.routed_experts is not None:
                assert np.array_equal(_rows(cx.routed_experts), _rows(cy.routed_experts))


def test_masks_match_the_transformers_model(llm, hf_moe):
    cases = [dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_k=50, top_p=0.9),
             dict(temperature=1.2, top_k=40, min_p=0.1)]
    params = [SamplingParams(**c, max_tokens=16, ignore_eos=True, seed=30 + i)
              for i, c in enumerate(cases)]
    outs = llm.generate(PROMPTS[:3], params)
    assert assert_supports_match_reference(outs, cases, hf_moe) == 48


@pytest.mark.gpu
def test_routed_experts_match_the_transformers_router(routed, hf_moe):
    outs = routed.generate(PROMPTS, [_params(seed=40 + i, max_tokens=12, ignore_eos=True)
                                     for i in range(len(PROMPTS))])
    for out in outs:
        c = out.outputs[0]
        got = check_routing(out, c)
        seq = list(out.prompt_token_ids) + list(c.token_ids[:-1])
        with torch.no_grad():
            router_logits = hf_moe(input_ids=torch.tensor([seq]),
                                   output_router_logits=True).router_logits
        assert len(router_logits) == moe.NUM_LAYERS
        for layer, logits in enumerate(router_logits):
            want = logits.view(len(seq), -1).topk(moe.TOP_K, dim=-1).indices
            assert np.array_equal(got[:, layer], _rows(want.numpy())), layer


@pytest.mark.gpu
def test_routed_experts_prompt_start_drops_leading_rows(routed):
    sp = dict(seed=50, max_tokens=8, ignore_eos=True)
    full, late = routed.generate(PROMPTS[3:4] * 2, [
        _params(**sp), _params(**sp, routed_experts_prompt_start=3)])
    assert late.outputs[0].token_ids == full.outputs[0].token_ids
    assert late.outputs[0].sampling_mask == full.outputs[0].sampling_mask
    assert np.array_equal(check_routing(late, late.outputs[0], prompt_start=3),
                          check_routing(full, full.outputs[0])[3:])
