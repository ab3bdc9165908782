"""An engine a framework builds itself, with fixed arguments, in its own process.

- `VLLM_SAMPLING_MASK_RETURN=1` turns the mask flag on for an `LLM(...)` that does not
  pass `return_sampling_mask` (TRL's colocate mode builds its `LLM` so): the engine
  returns masks, and without the variable the same call returns none.
- The `cpu_colocated_load_weights` fix: the loaded model's own `load_weights`, called
  one tensor at a time as TRL's colocate sync does, takes new weights on a CPU host
  (stock vLLM raises `'Parameter' object has no attribute 'weight_loader'`). After it,
  the engine's log-probabilities and masks are those of the new weights (checked
  against transformers on the perturbed checkpoint, over the same supports, 1e-5),
  and they were not before.
"""

from __future__ import annotations

import gc

import pytest
import torch

from vllm_sampling_mask import DEMO_MODEL
from vllm_sampling_mask.config import RETURN

pytestmark = pytest.mark.release_tier  # CI runs it on every release

PROMPT = "def main():\n    "
TOKENS = 12


def _params(**kw):
    from vllm import SamplingParams
    return SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=TOKENS,
                          logprobs=0, seed=3, **kw)


def _load_one_at_a_time(weights):
    def load(worker):
        model = worker.model_runner.get_model()
        for name, tensor in weights.items():
            model.load_weights([(name, tensor)])
        return True
    return load


def _reference_logprobs(path, prompt_ids, out, temperature=0.9):
    from transformers import AutoModelForCausalLM

    from vllm_sampling_mask.training import nucleus_logprobs
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([list(prompt_ids) + list(out.token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1]
    return nucleus_logprobs(logits, torch.tensor(out.token_ids), out.sampling_mask, temperature)


@pytest.fixture(scope="module")
def llm(monkeypatch_module):
    from vllm import LLM
    monkeypatch_module.setenv(RETURN, "1")
    engine = LLM(DEMO_MODEL, dtype="float32", enforce_eager=True,
                 kv_cache_memory_bytes=1 << 30, logprobs_mode="processed_logprobs",
                 max_model_len=256, seed=0)
    monkeypatch_module.delenv(RETURN)
    yield engine
    del engine
    gc.collect()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_environment_variable_turns_the_flag_on(llm, monkeypatch):
    out = llm.generate([PROMPT], _params(), use_tqdm=False)[0].outputs[0]
    assert out.sampling_mask is not None and len(out.sampling_mask) == len(out.token_ids)
    from vllm.engine.arg_utils import EngineArgs
    args = dict(model=DEMO_MODEL, dtype="float32", logprobs_mode="processed_logprobs")
    monkeypatch.delenv(RETURN, raising=False)
    assert EngineArgs(**args).create_engine_config().model_config.sampling_mask_settings is None
    monkeypatch.setenv(RETURN, "1")
    assert EngineArgs(**args).create_engine_config().model_config.sampling_mask_settings
    # an explicit argument and the variable agree; the variable never turns it off
    monkeypatch.setenv(RETURN, "0")
    assert EngineArgs(**args, return_sampling_mask=True).create_engine_config() \
        .model_config.sampling_mask_settings


def test_model_load_weights_takes_new_weights_on_cpu(llm, tmp_path):
    from safetensors.torch import load_file

    from vllm_sampling_mask.tools.demo import perturbed_draft
    path = perturbed_draft(str(tmp_path / "perturbed"), noise=0.3)
    new = load_file(f"{path}/model.safetensors")

    request = llm.generate([PROMPT], _params(), use_tqdm=False)[0]
    before = request.outputs[0]
    stale = _reference_logprobs(path, request.prompt_token_ids, before)
    engine_before = torch.tensor([lp[t].logprob for t, lp in zip(before.token_ids,
                                                                 before.logprobs)])
    assert (stale - engine_before).abs().max() > 1e-3     # the perturbation is visible

    assert llm.collective_rpc(_load_one_at_a_time(new)) == [True]
    llm.reset_prefix_cache()
    request = llm.generate([PROMPT], _params(), use_tqdm=False)[0]
    after = request.outputs[0]
    reference = _reference_logprobs(path, request.prompt_token_ids, after)
    engine = torch.tensor([lp[t].logprob for t, lp in zip(after.token_ids, after.logprobs)])
    torch.testing.assert_close(engine, reference, atol=1e-5, rtol=0)
