"""The errors of the mask path: a bad request, and a hand-off that went missing."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError

from vllm_sampling_mask.validation import request_error


class SamplingMaskRequestError(VLLMValidationError, ValueError):
    """A 400 at the HTTP server; a ValueError from `LLM.generate`."""


class MissingSamplingMaskError(RuntimeError):
    """With the engine flag on, a hop of the mask's path found no mask.

    Raised, never papered over with `sampling_mask=None`: it means a producer
    upstream of `hop` stopped writing its declared field (an upstream change
    the seam contract tests should also catch).
    """

    def __init__(self, hop: str, detail: str) -> None:
        super().__init__(
            f"sampling mask missing at {hop}: {detail}. The engine was started with "
            "return_sampling_mask, so every hop must carry a mask; this is a bug in "
            "vllm_sampling_mask or an upstream change it does not know about.")
        self.hop = hop


def check_request(sampling_params) -> None:
    """Raise SamplingMaskRequestError if the mask cannot describe this request."""
    problem = request_error(sampling_params.temperature, sampling_params.top_k)
    if problem is not None:
        parameter, message = problem
        raise SamplingMaskRequestError(
            message, parameter=parameter, value=getattr(sampling_params, parameter))
