"""A `logit_bias` key that is no token id is a 400 naming `logit_bias` (vLLM 0.24).

What it wraps: `SamplingParams.from_optional` (vllm/sampling_params.py; the OpenAI
routes build their sampling parameters with it):

- before upstream converts the keys of `logit_bias` with `int()`, the keys it cannot
  convert are refused with a `VLLMValidationError` naming `logit_bias` and the keys;
  everything else reaches upstream as it came.

Why: 0.24's bare `int(token)` raised a plain `ValueError`, a 400 naming no parameter.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def unconvertible_keys(logit_bias) -> list:
    """The keys of `logit_bias` that `int()` does not take."""
    bad = []
    for key in logit_bias or {}:
        try:
            int(key)
        except (TypeError, ValueError):
            bad.append(key)
    return bad


def apply(module, release: Release) -> None:
    from vllm.exceptions import VLLMValidationError

    @wraps(module, "SamplingParams.from_optional")
    def from_optional(wrapped, instance, args, kwargs):
        # `{"abc": 1}`: "invalid literal for int() with base 10: 'abc'" upstream
        # (tests/http/test_bad_input.py)
        bad = unconvertible_keys(argument(wrapped, args, kwargs, "logit_bias"))

        if bad:
            raise VLLMValidationError(
                "logit_bias keys must be token ids (integers, as strings in JSON); "
                f"these are not: {bad!r}", parameter="logit_bias")
        return wrapped(*args, **kwargs)
