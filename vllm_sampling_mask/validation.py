"""What the sampling mask requires, checked with messages that name the fix.

Plain module: pure functions over plain values, so the rules are unit-testable
without an engine. The patches call them at engine start-up
(`engine_args`) and for every request (`request_validation`, the generate
endpoint).
"""

from __future__ import annotations

FLAG = "--return-sampling-mask (return_sampling_mask=True)"
# The default --max-sampling-mask-size: the widest support a step may return.
DEFAULT_MAX_SIZE = 4096
# The key in `SamplingParams.extra_args` that says, once the input processor has
# decided, whether a request's outputs carry a mask.
MASK_ARG = "return_sampling_mask"


def wants_mask(sampling_params) -> bool:
    """The decision the input processor wrote on the request's parameters."""
    return (sampling_params.extra_args or {}).get(MASK_ARG) is True


def startup_errors(*, logprobs_mode: str, use_v2_model_runner: bool,
                   speculative: bool, logits_processors, runner_type: str,
                   is_diffusion: bool) -> list[str]:
    """Every reason the engine cannot return sampling masks, as messages."""
    errors = []
    if logprobs_mode != "processed_logprobs":
        errors.append(
            f"{FLAG} requires --logprobs-mode processed_logprobs (got "
            f"{logprobs_mode!r}): returned logprobs must be normalised over the "
            "same support as the mask.")
    if speculative:
        errors.append(
            f"{FLAG} does not support speculative decoding: remove "
            "--speculative-config (the rejection sampler draws from a different "
            "distribution than the mask describes).")
    if logits_processors and use_v2_model_runner:
        errors.append(
            f"{FLAG} supports engine-level custom logits processors on the V1 "
            "model runner only (Model Runner V2 has no such processors): remove "
            "--logits-processors, or set VLLM_USE_V2_MODEL_RUNNER=0.")
    if runner_type != "generate":
        errors.append(
            f"{FLAG} applies only to generative models, not to a "
            f"{runner_type!r} runner: drop the flag for pooling models.")
    if is_diffusion:
        errors.append(f"{FLAG} does not support diffusion models: drop the flag.")
    return errors


def resolve_request(*, engine_on: bool, requested, temperature: float, top_k: int,
                    top_p: float, min_p: float, max_size: int
                    ) -> tuple[bool, tuple[str, str] | None]:
    """(mask, problem): whether a request carries a mask, or (parameter, message).

    `requested` is the request's `return_sampling_mask`: True, False or None.
    With the engine flag on, None means a mask when the distribution is
    truncated (temperature > 0 and any of top_k, top_p < 1, min_p > 0).
    """
    if requested is not None and not isinstance(requested, bool):
        return False, (MASK_ARG, f"return_sampling_mask must be true, false or null, "
                                 f"not {requested!r}.")
    if not engine_on:
        if requested:
            return False, (MASK_ARG, f"return_sampling_mask=true needs an engine started "
                                     f"with {FLAG}: restart the server with it, or drop "
                                     "return_sampling_mask.")
        return False, None
    if requested is False:
        return False, None
    if requested is None:
        truncated = temperature > 0 and (top_k > 0 or top_p < 1 or min_p > 0)
        return truncated, None
    if not temperature > 0:
        return False, ("temperature",
                       f"temperature={temperature} is greedy, which has no truncated "
                       "distribution to replay: return_sampling_mask=true needs "
                       "temperature > 0 (or leave return_sampling_mask unset).")
    if top_k > max_size:
        return False, ("top_k",
                       f"top_k={top_k} makes supports wider than this engine's "
                       f"--max-sampling-mask-size {max_size}: lower top_k, or restart "
                       "the server with a larger --max-sampling-mask-size.")
    return True, None
