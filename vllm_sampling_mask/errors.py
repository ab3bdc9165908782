"""The errors of the mask path: a bad request, and a hand-off that went missing."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError

from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE, MASK_ARG, resolve_request


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


def check_request(sampling_params, *, engine_on: bool = True,
                  max_size: int = DEFAULT_MAX_SIZE, vocab_size: int | None = None) -> bool:
    """Whether the request carries a mask; SamplingMaskRequestError if it cannot."""
    requested = (sampling_params.extra_args or {}).get(MASK_ARG)
    wants, problem = resolve_request(
        engine_on=engine_on, requested=requested,
        temperature=sampling_params.temperature, top_k=sampling_params.top_k,
        top_p=sampling_params.top_p, min_p=sampling_params.min_p, max_size=max_size,
        vocab_size=vocab_size)
    if problem is not None:
        parameter, message = problem
        value = requested if parameter == MASK_ARG else getattr(sampling_params, parameter)
        raise SamplingMaskRequestError(message, parameter=parameter, value=value)
    return wants
