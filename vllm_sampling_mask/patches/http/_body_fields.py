"""The mask's body fields on the three HTTP routes (`/inference/v1/generate`,
`/v1/completions`, `/v1/chat/completions`) and the response fields they fill.

- `return_sampling_mask` (strict bool): declared on the request, forwarded into
  the request's own `SamplingParams.extra_args` (where the input processor decides);
- `return_sampling_mask_logprobs` (strict bool; into
  `extra_args["return_sampling_mask_logprobs"]`): per token, the processed logprob of
  every support id and log S, written as `choices[].sampling_mask_logprobs` and
  `choices[].sampling_mask_log_kept` in lists format, inside the packed object in
  packed format;
- `sampling_mask_format` ("lists", the default, or "packed": the compact encoding of
  `vllm_sampling_mask.formats.packed_wire`): how `choices[].sampling_mask` is written, full
  responses and stream chunks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool

from vllm_sampling_mask.frontend.validation import LOGPROBS_ARG, MASK_ARG


# The request body field `return_sampling_mask` (top level; the `openai` client sends
# it through `extra_body`). Strict: "yes" or 1 is a 400 naming it, never a coerced True.
BodyField = StrictBool | None


def body_field():
    return Field(default=None, description=(
        "Return, for every generated token, the ids the sampler could draw it from "
        "(`choices[].sampling_mask`). true: a mask (refused unless the server runs "
        "with --return-sampling-mask and temperature > 0); false: none; null: a mask "
        "when the server's flag is on and the distribution is truncated."))


def logprobs_field():
    return Field(default=None, description=(
        "Return, with the mask, the processed logprob of every id of each token's "
        "support (`choices[].sampling_mask_logprobs`, aligned with the mask) and log S, "
        "the log of the probability mass the support kept under the temperature-scaled "
        "distribution (`choices[].sampling_mask_log_kept`); inside the packed object "
        "with sampling_mask_format \"packed\". Implies return_sampling_mask; needs a "
        "server started with --return-sampling-mask."))


# The response choice fields of the support logprobs (lists format).
LogprobsField = list[list[float]] | None


LogKeptField = list[float] | None


# The response choice field that says why `sampling_mask` is null from some token on
# (a request that never asked for a mask, which the mask path never fails).
ReasonField = str | None


# The request body field `sampling_mask_format` (top level, like the one above).
FORMAT_ARG = "sampling_mask_format"


FormatField = Literal["lists", "packed"] | None


def format_field():
    return Field(default=None, description=(
        "How `choices[].sampling_mask` is written: \"lists\" (default) one JSON list "
        "of ids per token; \"packed\" one object {format, tokens, data} with the "
        "supports Rice-coded in base85 (docs/sampling_mask.md, Packed wire)."))


# The response choice field: one list of ids per generated token, the packed
# object (`packed_wire.encode_packed`), or null.
MaskField = list[list[int]] | dict[str, str | int] | None


def forward_body_field(params, value, logprobs=None):
    """Put the body fields into `params.extra_args[MASK_ARG]` (and
    `[LOGPROBS_ARG]`), keeping the other extra args; absent (null) leaves them as
    they are. Returns `params`."""
    if value is not None:
        params.extra_args = {**(params.extra_args or {}), MASK_ARG: value}
    if logprobs is not None:
        params.extra_args = {**(params.extra_args or {}), LOGPROBS_ARG: logprobs}
    return params


def asks_logprobs(request) -> bool:
    """Whether the request asked for support logprobs (the body field)."""
    return getattr(request, LOGPROBS_ARG, None) is True


def packed_format(request) -> bool:
    """Whether the request asked for the packed wire (`sampling_mask_format`)."""
    return request.sampling_mask_format == "packed"
