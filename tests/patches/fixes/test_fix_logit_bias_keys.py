"""The fix `logit_bias_keys`: a `logit_bias` key that is no token id is refused naming
`logit_bias` (0.24; upstream names it itself from 0.27.1). No engine."""

from __future__ import annotations

import pytest

from vllm_sampling_mask.patches import apply as patching

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def test_a_logit_bias_key_that_is_no_token_id_names_logit_bias():
    """What the OpenAI requests' `to_sampling_params` meets: upstream names
    `logit_bias` for a key `int()` does not take (vLLM #46612, 0.27.1 on); on 0.24,
    whose bare `int()` raised a plain ValueError, the `logit_bias_keys` patch does."""
    patching.apply_all()
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    with pytest.raises(VLLMValidationError) as caught:
        SamplingParams.from_optional(logit_bias={"abc": 1.0, "7": 2.0})
    assert caught.value.parameter == "logit_bias" and "'abc'" in str(caught.value)
    # keys int() takes are converted, biases clamped, as upstream does
    assert SamplingParams.from_optional(logit_bias={"7": 200.0}).logit_bias == {7: 100.0}
