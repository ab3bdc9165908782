"""`/inference/v1/generate` wire format: the `return_sampling_mask` body field
in, `choices[].sampling_mask` out.

What it replaces, in the generate route's protocol module
(`release.module("generate_protocol")`), as the module finishes executing:

- `GenerateRequest`: a subclass declaring `return_sampling_mask`,
  `sampling_mask_format` and `return_sampling_mask_logprobs` (strict: a bad value is a
  400 naming it), and refusing misplaced fields;
- each full response's choice and response class (`release.generate_choices`):
  subclasses declaring `sampling_mask` (lists or packed) and the support-logprob fields.

The `generate_endpoint` patch forwards the field and fills the response.
Why: the token-in/token-out endpoint is the RL trainers' way in.
"""

from __future__ import annotations

from pydantic import model_validator

from vllm_sampling_mask.formats.error_sentences import refuse_misplaced_fields
from vllm_sampling_mask.patches.http._body_fields import BodyField, FormatField, body_field, format_field, logprobs_field
from vllm_sampling_mask.patches.http._protocol import declare_choice_fields
from vllm_sampling_mask.patches.http._refusals import naming_sampling_refusals
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    class GenerateRequest(module.GenerateRequest):
        return_sampling_mask: BodyField = body_field()
        sampling_mask_format: FormatField = format_field()
        return_sampling_mask_logprobs: BodyField = logprobs_field()

        # a misspelled mask field, one inside sampling_params, or a top-level top_k:
        # a 400 naming the right field and place, not silently ignored
        _misplaced = model_validator(mode="before")(classmethod(
            lambda cls, data: refuse_misplaced_fields(cls, data, generate=True)))
        # upstream's own sampling refusals ("top_k must be ...") name sampling_params.top_k
        _named = model_validator(mode="wrap")(classmethod(
            lambda cls, data, handler: naming_sampling_refusals(cls, data, handler, release)))

    # Replaced as the module finishes executing, so the route (`api_router`) parses the
    # subclass and the serving module builds the subclasses. 0.32 declares
    # `sampling_mask: list[list[int]] | None` on its choices itself (lists only): the
    # subclasses widen it to the packed object; the response class too, as pydantic
    # serialises a list field by its declared item type (`model_dump()` leaves a lists
    # mask for `json_response` to write). The stream choices keep upstream's declaration:
    # the stream hand-off writes each chunk's fields into its text, over upstream's null.
    module.GenerateRequest = GenerateRequest
    for response, choice in release.generate_choices.items():

        declare_choice_fields(module, choice, response)
