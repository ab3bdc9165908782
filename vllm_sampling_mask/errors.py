"""The request error raised when a request cannot carry a sampling mask."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError

from vllm_sampling_mask.validation import request_error


class SamplingMaskRequestError(VLLMValidationError, ValueError):
    """A 400 at the HTTP server; a ValueError from `LLM.generate`."""


def check_request(sampling_params) -> None:
    """Raise SamplingMaskRequestError if the mask cannot describe this request."""
    problem = request_error(sampling_params.temperature, sampling_params.top_k)
    if problem is not None:
        parameter, message = problem
        raise SamplingMaskRequestError(
            message, parameter=parameter, value=getattr(sampling_params, parameter))
