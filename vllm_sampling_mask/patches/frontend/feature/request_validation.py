"""Decide, per request, whether it carries a mask; refuse what a mask cannot describe.

What it wraps, in `InputProcessor` (vllm/v1/engine/input_processor.py):

- `_validate_params`: resolves the request's `return_sampling_mask` and
  `return_sampling_mask_logprobs` against the engine; what cannot be served raises
  `errors.SamplingMaskRequestError` naming the parameter (HTTP 400, a ValueError for
  `LLM.generate`);
- `process_inputs`: with the flag on, writes the decisions into the request's own
  `extra_args`, which every later hop reads (`validation.wants_mask`).

Why: every request passes here before the engine core, so a bad request fails alone,
and deciding once here tells the output processor which requests carry a mask.
"""

from __future__ import annotations

from vllm_sampling_mask.config import mask_enabled, mask_settings
from vllm_sampling_mask.errors import SamplingMaskRequestError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.validation import (DEFAULT_MAX_SIZE, LOGPROBS_ARG, MASK_ARG,
                                           OPTIONAL_ARG, resolve_logprobs_request,
                                           resolve_request)


def decide(sampling_params, *, engine_on: bool = True, max_size: int = DEFAULT_MAX_SIZE,
           vocab_size: int | None = None) -> tuple[bool, bool]:
    """(mask, support logprobs) for the request; SamplingMaskRequestError if it
    cannot have what it asked for. (`optional` below: whether the mask was
    decided by default.)"""
    wants, logprobs, _ = decide_all(sampling_params, engine_on=engine_on,
                                    max_size=max_size, vocab_size=vocab_size)
    return wants, logprobs


def decide_all(sampling_params, *, engine_on: bool = True,
               max_size: int = DEFAULT_MAX_SIZE, vocab_size: int | None = None
               ) -> tuple[bool, bool, bool]:
    """(mask, support logprobs, optional): `optional` is True for a mask the
    request did not ask for (its switch null, no support logprobs asked)."""
    extra = sampling_params.extra_args or {}
    asked = extra.get(LOGPROBS_ARG)
    requested, problem = resolve_logprobs_request(
        engine_on=engine_on, requested=asked, requested_mask=extra.get(MASK_ARG))
    if problem is not None:
        parameter, message = problem
        raise SamplingMaskRequestError(message, parameter=parameter, value=asked)
    # a bad value, true on an engine without the flag, true with temperature 0, true with
    # a top_k above --max-sampling-mask-size (and below the vocabulary size: a top_k at or
    # above it is no top-k, whatever the switch)
    wants, problem = resolve_request(
        engine_on=engine_on, requested=requested,
        temperature=sampling_params.temperature, top_k=sampling_params.top_k,
        top_p=sampling_params.top_p, min_p=sampling_params.min_p, max_size=max_size,
        vocab_size=vocab_size)
    if problem is not None:
        parameter, message = problem
        value = requested if parameter == MASK_ARG else getattr(sampling_params, parameter)
        raise SamplingMaskRequestError(message, parameter=parameter, value=value)
    # support logprobs: a bool, refused without the flag and beside
    # `return_sampling_mask=false`; true implies the mask (a null switch becomes true)
    return wants, wants and asked is True, wants and requested is None


def apply(module, release: Release) -> None:
    from vllm.sampling_params import SamplingParams

    def check(self, params) -> tuple[bool, bool, bool]:
        settings = mask_settings(self.vllm_config)
        return decide_all(params, engine_on=settings is not None,
                      max_size=settings.max_size if settings else DEFAULT_MAX_SIZE,
                      vocab_size=self.vllm_config.model_config.get_vocab_size())

    @wraps(module, "InputProcessor._validate_params")
    def _validate_params(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)   # 0.32 returns the watermarking decision
        params = argument(wrapped, args, kwargs, "params")
        if isinstance(params, SamplingParams):
            check(self, params)
        return result

    @wraps(module, "InputProcessor.process_inputs")
    def process_inputs(wrapped, self, args, kwargs):
        request = wrapped(*args, **kwargs)
        params = request.sampling_params
        if params is not None and mask_enabled(self.vllm_config):
            # `params` is the request's own clone: the caller's object is untouched.
            wants, logprobs, optional = check(self, params)
            # A mask decided by default (the switch null) is optional: the mask path never
            # fails such a request (a null switch with a top_k above the limit is served
            # without a mask; the scheduler drops a later step's mask it cannot describe,
            # `validation.mask_is_optional`).
            params.extra_args = {**(params.extra_args or {}), MASK_ARG: wants,

                                 LOGPROBS_ARG: logprobs, OPTIONAL_ARG: optional}
        return request
