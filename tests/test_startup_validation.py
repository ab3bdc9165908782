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


def test_llm_rejects_the_v1_runner_and_says_how_to_get_mrv2():
    code = ("from vllm import LLM\nfrom vllm_sampling_mask import DEMO_MODEL\n"
            "try:\n    LLM(DEMO_MODEL, return_sampling_mask=True, "
            "logprobs_mode='processed_logprobs')\n"
            "except ValueError as e:\n    print('REFUSED', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=_clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert "REFUSED" in r.stdout, r.stderr[-2000:]
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in r.stdout and "TRITON_INTERPRET=1" in r.stdout


def test_vllm_serve_refuses_at_start_up_with_the_fix():
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    r = subprocess.run([exe, "serve", DEMO_MODEL, "--return-sampling-mask",
                        "--logprobs-mode", "raw_logprobs", "--port", "0"],
                       env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "--logprobs-mode processed_logprobs" in r.stderr + r.stdout
