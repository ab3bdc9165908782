"""What the sampling mask requires, checked with messages that name the fix.

Plain module: pure functions over plain values, so the rules are unit-testable
without an engine. The patches call them at engine start-up
(`engine_args`) and for every request (`request_validation`, the generate
endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

FLAG = "--return-sampling-mask (return_sampling_mask=True)"
# The default --max-sampling-mask-size: the widest support a step may return.
DEFAULT_MAX_SIZE = 4096


@dataclass(frozen=True)
class EngineMaskSettings:
    """The engine's sampling-mask settings (`--return-sampling-mask` and its size
    limit): the one object the overlay keeps on `ModelConfig`
    (`ModelConfig.sampling_mask_settings`, None with the flag off), pickled with the
    config to the engine-core and worker processes."""

    max_size: int = DEFAULT_MAX_SIZE   # --max-sampling-mask-size
# The key in `SamplingParams.extra_args` that says, once the input processor has
# decided, whether a request's outputs carry a mask.
MASK_ARG = "return_sampling_mask"
# The key in `extra_args` for the support logprobs (per token, the processed logprob
# of every id of the support, and log S): the request's ask, then the decision.
LOGPROBS_ARG = "return_sampling_mask_logprobs"
# The key in `extra_args` the input processor sets to True beside a mask decided by
# default (the request's switch was null): such a request is never failed by the mask
# path; a step its mask cannot describe drops the mask from that token on instead
# (`sampling_mask_reason`), and the request goes on.
OPTIONAL_ARG = "sampling_mask_optional"


def wants_mask(sampling_params) -> bool:
    """The decision the input processor wrote on the request's parameters."""
    return (sampling_params.extra_args or {}).get(MASK_ARG) is True


def mask_is_optional(sampling_params) -> bool:
    """Whether the request's mask was decided by default (switch null), so that a
    step the mask cannot describe drops the mask instead of ending the request."""
    return (sampling_params.extra_args or {}).get(OPTIONAL_ARG) is True


def dropped_reason(problem: str) -> str:
    """The `sampling_mask_reason` of a request whose mask was dropped at a step."""
    return (f"sampling mask dropped from this token on: {problem} (the request left "
            "return_sampling_mask unset, so it was served on without a mask; send "
            "return_sampling_mask=true to have such a request refused or ended instead)")


def wants_support_logprobs(sampling_params) -> bool:
    """The input processor's decision: this request's masks carry support logprobs."""
    extra = sampling_params.extra_args or {}
    return extra.get(MASK_ARG) is True and extra.get(LOGPROBS_ARG) is True


def resolve_logprobs_request(*, engine_on: bool, requested, requested_mask
                             ) -> tuple[object, tuple[str, str] | None]:
    """(mask request, problem) for `return_sampling_mask_logprobs`.

    `requested` is the request's `return_sampling_mask_logprobs` (True, False or
    None); asking for it implies the mask, so the returned mask request is True
    where `requested_mask` was None (unchanged otherwise). Problems: a value that
    is not a bool, an engine without the flag, or `return_sampling_mask=false`
    beside it."""
    if requested is None or requested is False:
        return requested_mask, None
    if requested is not True:
        return requested_mask, (LOGPROBS_ARG, "return_sampling_mask_logprobs must be "
                                              f"true, false or null, not {requested!r}.")
    if not engine_on:
        return requested_mask, (LOGPROBS_ARG, "return_sampling_mask_logprobs=true needs "
                                              f"an engine started with {FLAG}: restart "
                                              "the server with it, or drop "
                                              "return_sampling_mask_logprobs.")
    if requested_mask is False:
        return requested_mask, (LOGPROBS_ARG, "return_sampling_mask_logprobs=true "
                                              "returns the logprobs of the mask's ids, "
                                              "so it needs the mask: drop "
                                              "return_sampling_mask=false.")
    return (True if requested_mask is None else requested_mask), None


def speculation_errors(speculative, *, use_v2_model_runner: bool,
                       logits_processors) -> list[str]:
    """Why masks cannot describe this speculative decoding (`speculative`: the
    --speculative-config, a dict or upstream's config; None: none)."""
    if not speculative:
        return []

    def setting(name, default=None):
        if isinstance(speculative, dict):
            return speculative.get(name, default)
        return getattr(speculative, name, default)

    errors = []
    method = setting("rejection_sample_method", "standard") or "standard"
    if method != "standard":
        errors.append(
            f"{FLAG} needs speculative_config.rejection_sample_method 'standard' (got "
            f"{method!r}): 'synthetic' accepts drafts at a fixed rate, so a committed "
            "token can lie outside the target's support, and 'block' verifies drafts "
            "jointly, not from each position's target distribution.")
    if setting("enable_adaptive_verification", False):
        errors.append(
            f"{FLAG} does not support speculative_config.enable_adaptive_verification "
            "(upstream's own mask refuses it too): set it to false.")
    if logits_processors and not use_v2_model_runner:   # (MRv2: refused below)
        errors.append(
            f"{FLAG} with --speculative-config does not support engine-level custom "
            "logits processors: vLLM's V1 rejection sampler does not apply them at draft "
            "positions, so a draft position's token is not drawn from the distribution "
            "they define. Remove --logits-processors or --speculative-config.")
    return errors


def startup_errors(*, logprobs_mode: str, use_v2_model_runner: bool,
                   speculative, logits_processors, runner_type: str,
                   is_diffusion: bool, batch_sharded_sampling: bool = False,
                   v1_runner: bool = True) -> list[str]:
    """Every reason the engine cannot return sampling masks, as messages
    (`speculative`: the --speculative-config, None or empty for none; `v1_runner`:
    the release still has the V1 model runner, gone from vLLM 0.34)."""
    errors = []
    if logprobs_mode != "processed_logprobs":
        errors.append(
            f"{FLAG} requires --logprobs-mode processed_logprobs (got "
            f"{logprobs_mode!r}): returned logprobs must be normalised over the "
            "same support as the mask.")
    errors += speculation_errors(speculative, use_v2_model_runner=use_v2_model_runner,
                                 logits_processors=logits_processors)
    if logits_processors and use_v2_model_runner:
        errors.append(
            f"{FLAG} supports engine-level custom logits processors on the V1 "
            "model runner only (Model Runner V2 has no such processors): remove "
            "--logits-processors" + (", or set VLLM_USE_V2_MODEL_RUNNER=0." if v1_runner
                                     else " (this vLLM has no V1 model runner)."))
    if runner_type != "generate":
        errors.append(
            f"{FLAG} applies only to generative models, not to a "
            f"{runner_type!r} runner: drop the flag for pooling models.")
    if is_diffusion:
        errors.append(f"{FLAG} does not support diffusion models: drop the flag.")
    if batch_sharded_sampling:
        errors.append(
            f"{FLAG} does not support batch-sharded sampling (each tensor-parallel "
            "rank would sample, and extract, a slice of the batch): remove "
            "--enable-batch-sharded-sampling.")
    return errors


def effective_top_k(top_k: int, vocab_size: int | None) -> int:
    """The top_k that truncates anything: a top_k at or above the vocabulary size
    keeps every id, so it means no top-k (0), like 0 or -1."""
    if top_k <= 0 or (vocab_size is not None and top_k >= vocab_size):
        return 0
    return top_k


def resolve_request(*, engine_on: bool, requested, temperature: float, top_k: int,
                    top_p: float, min_p: float, max_size: int,
                    vocab_size: int | None = None
                    ) -> tuple[bool, tuple[str, str] | None]:
    """(mask, problem): whether a request carries a mask, or (parameter, message).

    `requested` is the request's `return_sampling_mask`: True, False or None.
    With the engine flag on, None means a mask when the distribution is
    truncated (temperature > 0 and any of top_k, top_p < 1, min_p > 0).

    A top_k at or above `vocab_size` (the model's) is no top-k, whatever
    `requested` says: it truncates nothing, and a support it allows can never be
    wider than the vocabulary. So top_k alone is refused up front only where it
    lets a support grow past --max-sampling-mask-size (max_size < top_k <
    vocab_size); with no top-k on a vocabulary wider than the limit, a step
    whose support is wider than the limit ends its request
    (`sampling_mask_error`), as it does for top_k=0. With `requested` None (the
    request never mentioned masks) such a top_k is no refusal: the request is
    served without a mask.
    """
    top_k = effective_top_k(top_k, vocab_size)
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
        # a top_k above the limit is known up front to outgrow it: no mask, no refusal
        return truncated and top_k <= max_size, None
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


# --- Token ids and integers a request carries (crash fixes; flag on or off) ---

# msgspec, which carries every request to the engine core, encodes integers in
# [-2**63, 2**64 - 1]; anything else fails after the request was accepted.
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _is_int(value) -> bool:
    # any integral type (Python or numpy), but not bool
    return hasattr(value, "__index__") and not isinstance(value, bool)


def token_id_problem(parameter: str, ids, vocab_size: int, *, what: str | None = None
                     ) -> tuple[str, str] | None:
    """(parameter, message) for the first id of `ids` that is no token of a model
    with `vocab_size` ids (valid: integers in [0, vocab_size)), else None.

    `what` names the ids in the message (default: the parameter)."""
    what = what or parameter
    last = vocab_size - 1
    for position, token in enumerate(ids):
        if _is_int(token) and 0 <= token <= last:
            continue
        where = f" (position {position} of {len(ids)})" if len(ids) > 1 else ""
        if not _is_int(token):
            return parameter, (f"{what}: {token!r}{where} is not a token id: token ids "
                               f"are integers in [0, {last}].")
        return parameter, (f"{what}: token id {token}{where} is outside this model's "
                           f"vocabulary: token ids must lie in [0, {last}] (vocabulary "
                           f"size {vocab_size}).")
    return None


def logit_bias_problem(logit_bias, vocab_size: int) -> tuple[str, str] | None:
    """Keys must be token ids of the model, values finite numbers."""
    if not logit_bias:
        return None
    problem = token_id_problem("logit_bias", list(logit_bias), vocab_size,
                               what="logit_bias keys")
    if problem is not None:
        return problem
    for token, bias in logit_bias.items():
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not (
                -float("inf") < bias < float("inf")):
            return "logit_bias", (f"logit_bias[{token}] is {bias!r}: a bias must be a "
                                  "finite number (OpenAI clients use -100 to 100).")
    return None


def int64_problem(fields: dict) -> tuple[str, str] | None:
    """(parameter, message) for the first integer in `fields` (a name -> value map;
    lists, tuples and dicts are searched, dict keys too) outside 64 bits."""
    def out_of_range(value):
        if _is_int(value):
            return value if not INT64_MIN <= value <= INT64_MAX else None
        if isinstance(value, dict):
            for item in (*value.keys(), *value.values()):
                found = out_of_range(item)
                if found is not None:
                    return found
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                found = out_of_range(item)
                if found is not None:
                    return found
        return None

    for name, value in fields.items():
        found = out_of_range(value)
        if found is not None:
            return name, (f"{name} holds {found}, which does not fit in a 64-bit integer: "
                          f"integers must lie in [-2**63, 2**63 - 1].")
    return None


def sampling_id_problems(*, vocab_size: int, allowed_token_ids=None, logit_bias=None,
                         stop_token_ids=None) -> list[tuple[str, str]]:
    """Every token-id parameter of a request's sampling parameters, checked against
    the model's vocabulary (upstream checks some against the tokenizer, some not
    at all: an id the model has no row for kills the engine)."""
    problems = [
        token_id_problem("allowed_token_ids", allowed_token_ids or [], vocab_size),
        logit_bias_problem(logit_bias, vocab_size),
        token_id_problem("stop_token_ids", stop_token_ids or [], vocab_size),
    ]
    return [p for p in problems if p is not None]


def bad_words_problem(bad_words, bad_words_token_ids, vocab_size: int
                      ) -> tuple[str, str] | None:
    """The tokenizer's encoding of `bad_words` must stay inside the model's
    vocabulary (a tokenizer may know more ids than the model has rows)."""
    for encoded in bad_words_token_ids or []:
        for token in encoded:
            if not (_is_int(token) and 0 <= token < vocab_size):
                return "bad_words", (
                    f"bad_words {list(bad_words)!r} encode to token id {token}, outside "
                    f"this model's vocabulary [0, {vocab_size - 1}]: drop that word.")
    return None


def blank_bad_word_problem(bad_words) -> tuple[str, str] | None:
    """A bad word of whitespace only: upstream strips each word's leading
    whitespace before encoding it and then indexes the empty encoding (HTTP 500)."""
    for word in bad_words or []:
        if isinstance(word, str) and word and not word.strip():
            return "bad_words", (
                f"bad_words holds {word!r}, which is whitespace only: each bad word is "
                "encoded without its leading whitespace, so it must contain another "
                "character (to ban a whitespace token, give its id a logit_bias of -100).")
    return None
