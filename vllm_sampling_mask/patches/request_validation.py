"""Reject, per request, sampling parameters the mask cannot describe.

What: wraps `InputProcessor._validate_params` (vllm/v1/engine/input_processor.py):
    when the engine flag is on, a generation request needs temperature > 0 and
    top_k > 0, else `errors.SamplingMaskRequestError` (a VLLMValidationError,
    so HTTP 400, and a ValueError for `LLM.generate`) naming the parameter.
Why: every request entering the engine, from `LLM` or the server, passes here
    before it reaches the engine core, so a bad request fails alone and the
    engine keeps serving.
Remove when: upstream validates sampling-mask requests.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import check_request


def apply(module) -> None:
    from vllm.sampling_params import SamplingParams

    InputProcessor = module.InputProcessor
    original = InputProcessor._validate_params

    @functools.wraps(original)
    def _validate_params(self, params, *args, **kwargs):
        original(self, params, *args, **kwargs)
        if isinstance(params, SamplingParams) and mask_enabled(self.vllm_config):
            check_request(params)

    InputProcessor._validate_params = _validate_params
