"""What the sampling mask requires, checked with messages that name the fix.

Plain module: pure functions over plain values, so the rules are unit-testable
without an engine. The patches call them at engine start-up
(`engine_args`) and for every request (`request_validation`, the generate
endpoint).
"""

from __future__ import annotations

FLAG = "--return-sampling-mask (return_sampling_mask=True)"
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


def request_error(temperature: float, top_k: int) -> tuple[str, str] | None:
    """(parameter, message) for a request the mask cannot describe, else None."""
    if not temperature > 0:
        return ("temperature",
                f"temperature={temperature} is greedy, which has no truncated "
                "distribution to replay: with the sampling mask on, every request "
                "needs temperature > 0.")
    if top_k is None or top_k <= 0:
        return ("top_k",
                f"top_k={top_k} leaves the support unbounded (top-p alone can "
                "return vocabulary-sized masks): with the sampling mask on, every "
                "request needs top_k > 0, e.g. top_k=50.")
    return None
