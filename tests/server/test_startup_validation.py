"""Start-up validation of --return-sampling-mask, at the LLM API and `vllm serve`."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import ENGINE_KWARGS, native_v1
from vllm import LLM

from vllm_sampling_mask import DEMO_MODEL


class NoOpLogitsProcessor:  # only its presence in the config matters
    pass


@pytest.mark.parametrize("overrides, fix", [
    (dict(logprobs_mode="raw_logprobs"), "--logprobs-mode processed_logprobs"),
    (dict(logprobs_mode="processed_logits"), "--logprobs-mode processed_logprobs"),
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                              "prompt_lookup_max": 3, "rejection_sample_method": "block"}),
     "'block'"),
    # on Model Runner V2 (the suite's default); the V1 runner takes them
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


NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


@pytest.mark.parametrize("overrides, fix", [
    (dict(logprobs_mode="raw_logprobs"), "--logprobs-mode processed_logprobs"),
    # a committed token may lie outside the target's support
    (dict(speculative_config={**NGRAM, "rejection_sample_method": "synthetic",
                              "synthetic_acceptance_rates": [0.5, 0.25]}),
     "rejection_sample_method 'standard'"),
    # V1's rejection sampler does not apply custom processors at draft positions
    (dict(speculative_config=NGRAM, logits_processors=[NoOpLogitsProcessor]),
     "--logits-processors"),
])
def test_v1_runner_refuses_what_it_cannot_mask(overrides, fix):
    with native_v1(), pytest.raises(ValueError, match="return-sampling-mask") as info:
        LLM(**{**ENGINE_KWARGS, **overrides})
    assert fix in str(info.value)


@pytest.mark.parametrize("logprobs_mode, fix", [
    ("raw_logprobs", "--logprobs-mode processed_logprobs"),
])
def test_vllm_serve_refuses_at_start_up_with_the_fix(logprobs_mode, fix):
    exe = os.path.join(os.path.dirname(sys.executable), "vllm")
    r = subprocess.run([exe, "serve", DEMO_MODEL, "--return-sampling-mask",
                        "--logprobs-mode", logprobs_mode, "--port", "0"],
                       env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert fix in r.stderr + r.stdout
    # one line with the fix, no traceback through vLLM's start-up (issue 27, item 6)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    (line,) = [l for l in r.stderr.splitlines() if fix in l]
    # (0.27.1 prefixes the API server process's lines with its name and pid)
    line = re.sub(r"^\(\w+ pid=\d+\) ", "", line)
    assert line.startswith("vllm serve: error: --return-sampling-mask"), line


def test_batch_sharded_sampling_is_refused_where_the_release_has_it():
    """vLLM 0.32's --enable-batch-sharded-sampling: each tensor-parallel rank samples a
    slice of the batch, so one rank's extraction would miss the others' rows."""
    from vllm import EngineArgs

    if "enable_batch_sharded_sampling" not in EngineArgs.__dataclass_fields__:
        pytest.skip("this vLLM release (0.24.0-0.28.0) has no batch-sharded sampling")
    with pytest.raises(ValueError, match="return-sampling-mask") as info:
        LLM(**{**ENGINE_KWARGS, "enable_batch_sharded_sampling": True})
    assert "--enable-batch-sharded-sampling" in str(info.value)
