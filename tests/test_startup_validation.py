"""Start-up validation of --return-sampling-mask, at the LLM API and `vllm serve`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ENGINE_KWARGS
from vllm import LLM

from vllm_sampling_mask import DEMO_MODEL


class NoOpLogitsProcessor:  # only its presence in the config matters
    pass


@pytest.mark.parametrize("overrides, fix", [
    (dict(logprobs_mode="raw_logprobs"), "--logprobs-mode processed_logprobs"),
    (dict(logprobs_mode="processed_logits"), "--logprobs-mode processed_logprobs"),
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                              "prompt_lookup_max": 3}), "--speculative-config"),
    (dict(logits_processors=[NoOpLogitsProcessor]), "--logits-processors"),
    (dict(runner="pooling"), "pooling"),
])
def test_llm_rejects_unsupported_configurations(overrides, fix):
    with pytest.raises(ValueError, match="return-sampling-mask") as info:
        LLM(**{**ENGINE_KWARGS, **overrides})
    assert fix in str(info.value)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET")}
    return {**env, **extra}


V1_SCRIPT = """
import os
from vllm import LLM, SamplingParams
from vllm_sampling_mask import DEMO_MODEL
try:
    LLM(DEMO_MODEL, return_sampling_mask=True, logprobs_mode='processed_logprobs')
except ValueError as e:
    print('REFUSED', e)
# Without the flag the same stock configuration runs on the V1 runner.
llm = LLM(DEMO_MODEL, max_model_len=256, enforce_eager=True)
runner, = llm.collective_rpc(lambda w: type(w.model_runner).__module__)
out = llm.generate(["def main():"], SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
print('V1', runner, len(out.token_ids), out.sampling_mask)
"""


def test_v1_runner_generates_and_is_refused_for_the_mask():
    r = subprocess.run([sys.executable, "-c", V1_SCRIPT], env=_clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert "REFUSED" in r.stdout, r.stderr[-3000:]
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in r.stdout and "TRITON_INTERPRET=1" in r.stdout
    assert "V1 vllm.v1.worker.cpu_model_runner 8 None" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("logprobs_mode, fix", [
    ("raw_logprobs", "--logprobs-mode processed_logprobs"),
    ("processed_logprobs", "VLLM_USE_V2_MODEL_RUNNER=1"),   # V1 runner selected
])
def test_vllm_serve_refuses_at_start_up_with_the_fix(logprobs_mode, fix):
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    r = subprocess.run([exe, "serve", DEMO_MODEL, "--return-sampling-mask",
                        "--logprobs-mode", logprobs_mode, "--port", "0"],
                       env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert fix in r.stderr + r.stdout
