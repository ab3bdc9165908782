"""A `logit_bias` key that is no token id is a 400 naming `logit_bias` (vLLM 0.24).

What: wraps `SamplingParams.from_optional` (vllm/sampling_params.py), which the
    `/v1/completions` and `/v1/chat/completions` requests call to build their
    sampling parameters: before upstream converts the keys of `logit_bias` with
    `int()`, every key it cannot convert is refused with a `VLLMValidationError`
    naming `logit_bias` and the keys, e.g. `logit_bias keys must be token ids
    (integers, as strings in JSON); these are not: ['abc']`. Keys it can convert,
    and every other argument, reach upstream as they came.
Why: 0.24 converts the keys with a bare `int(token)`, so `{"abc": 1}` raised a
    plain `ValueError` ("invalid literal for int() with base 10: 'abc'"), which
    the routes answer 400 with that message and no parameter: the client is not
    told which field is wrong (tests/http/test_bad_input.py).
Upstream: vLLM #46612 (0.27.1 raises `VLLMValidationError(parameter="logit_bias")`
    for these keys).
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
        bad = unconvertible_keys(argument(wrapped, args, kwargs, "logit_bias"))
        if bad:
            raise VLLMValidationError(
                "logit_bias keys must be token ids (integers, as strings in JSON); "
                f"these are not: {bad!r}", parameter="logit_bias")
        return wrapped(*args, **kwargs)
