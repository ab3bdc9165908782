"""Check every token id and integer a request carries before it reaches the engine;
answer the input processor's plain ValueErrors as client errors.

What it wraps, in `InputProcessor` (vllm/v1/engine/input_processor.py), the seam every
route passes (`LLM.generate` and the HTTP routes):

- `_validate_params`: sampling ids in the vocabulary, 64-bit integers, no blank bad word;
- `_validate_model_input`: prompt ids in [0, vocab size);
- `process_inputs`: bad words' encodings in the vocabulary; its plain ValueErrors as 400s.

A violation raises `errors.RequestInputError` (HTTP 400 naming the parameter; a ValueError
from `LLM.generate`), whether or not the sampling-mask flag is on.
Why: upstream lets ids through that the model has no row for, and the engine dies.
"""

from __future__ import annotations

from vllm_sampling_mask.errors import RequestInputError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.validation import (
    bad_words_problem,
    blank_bad_word_problem,
    int64_problem,
    sampling_id_problems,
    token_id_problem,
)

PROMPT = "prompt token ids (token_ids on /inference/v1/generate, prompt on /v1/completions)"
# The same ids as `LLM.generate` takes them (a process that serves no HTTP route).
PROMPT_OFFLINE = "prompt_token_ids"
# Modules only a process serving the HTTP routes imports (0.27.1, 0.32.0).
SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.app")


def prompt_words() -> str:
    """How the prompt ids are named in a refusal: by the HTTP routes' fields in the
    API server, as `prompt_token_ids` for `LLM.generate`."""
    import sys
    return PROMPT if any(name in sys.modules for name in SERVER_MODULES) else PROMPT_OFFLINE


def apply(module, release: Release) -> None:
    import vllm.exceptions
    from vllm.sampling_params import SamplingParams

    # the release's class of client errors (0.24: `VLLMValidationError`, a ValueError)
    client_error = getattr(vllm.exceptions, release.client_error)

    module.RequestInputError = RequestInputError  # where upstream code may look for it

    def refuse(problem):
        if problem is not None:
            parameter, message = problem
            raise RequestInputError(message, parameter=parameter)

    # Before upstream's checks. `stop_token_ids` are never range-checked upstream (with
    # `min_tokens` they index the logits: id == vocab size kills the engine, a negative
    # one masks another token); `allowed_token_ids` are checked against len(tokenizer),
    # not the model, and not at all without a tokenizer; an integer beyond 64 bits
    # (`top_k=1e20`) fails in msgspec after the request was accepted (HTTP 500); a
    # whitespace-only bad word has an empty encoding that upstream indexes (IndexError).
    @wraps(module, "InputProcessor._validate_params")
    def _validate_params(wrapped, self, args, kwargs):
        params = argument(wrapped, args, kwargs, "params")
        if isinstance(params, SamplingParams):
            vocab_size = self.model_config.get_vocab_size()
            for problem in sampling_id_problems(
                    vocab_size=vocab_size, allowed_token_ids=params.allowed_token_ids,
                    logit_bias=params.logit_bias, stop_token_ids=params.stop_token_ids):
                refuse(problem)
            refuse(int64_problem({name: getattr(params, name)
                                  for name in params.__struct_fields__}))
            refuse(blank_bad_word_problem(params.bad_words))
        return wrapped(*args, **kwargs)

    # Before upstream's checks, which compare with `tokenizer.max_token_id` (the HF wrapper
    # sets it to the vocabulary size, one past the last id) and never check negatives.
    @wraps(module, "InputProcessor._validate_model_input")
    def _validate_model_input(wrapped, self, args, kwargs):
        prompt_input = argument(wrapped, args, kwargs, "prompt_input")
        if prompt_input["type"] != "embeds":
            limit = self.model_config.get_vocab_size()
            tokenizer = self.tokenizer
            if prompt_input["type"] == "multimodal" and tokenizer is not None:
                # placeholder ids of some multimodal tokenizers lie past the model's
                # text vocabulary; upstream admits them, so does this check
                limit = max(limit, tokenizer.max_token_id + 1)
            refuse(token_id_problem("prompt_token_ids", prompt_input["prompt_token_ids"],
                                    limit, what=prompt_words()))
        return wrapped(*args, **kwargs)

    # After upstream. `AsyncLLM.generate` wraps a plain ValueError from the input processor
    # (an invalid regex or JSON schema in `structured_outputs` / `response_format`) in an
    # `EngineGenerateError()`: HTTP 500, empty message. It is re-raised as a client error;
    # 0.32 raises a client error there itself naming no parameter: re-raised naming
    # `structured_outputs`. Then the tokenizer's bad-word encodings must be in the vocabulary.
    @wraps(module, "InputProcessor.process_inputs")
    def process_inputs(wrapped, self, args, kwargs):

        try:
            request = wrapped(*args, **kwargs)
        except (ValueError, client_error) as exc:
            structured = _raised_in(exc, "_validate_structured_outputs")
            if isinstance(exc, client_error) and not (
                    structured and getattr(exc, "parameter", None) is None):
                raise   # a client error already, naming its parameter
            parameter = "structured_outputs" if structured else None
            prefix = f"{parameter}: " if parameter else ""
            raise RequestInputError(f"{prefix}{exc or type(exc).__name__}",
                                    parameter=parameter) from exc
        params = request.sampling_params
        if params is not None and params.bad_words_token_ids:
            refuse(bad_words_problem(params.bad_words, params.bad_words_token_ids,
                                     self.model_config.get_vocab_size()))
        return request


def _raised_in(exc: BaseException, function: str) -> bool:
    """Whether `function` is on the traceback of `exc`."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False
