"""`/inference/v1/generate` wire format: the `return_sampling_mask` body field
in, `choices[].sampling_mask` out.

What: in `vllm/entrypoints/scale_out/token_in_token_out/protocol.py`, replaces
    `GenerateRequest` with a subclass that declares the top-level body field
    `return_sampling_mask: bool | None` (strict: "yes" is a 400 naming it;
    upstream's model ignores unknown fields) and `sampling_mask_format:
    "lists" | "packed" | None` (any other value a 400 naming it), and `GenerateResponseChoice` /
    `GenerateResponse` with subclasses that declare
    `sampling_mask: list[list[int]] | <packed object> | None` (the response class too: pydantic
    serialises a list field by its declared item type). The names are replaced
    as the module finishes executing, so the route (`api_router`) parses the
    subclass and the serving module builds the subclasses. The
    `generate_endpoint` patch forwards the field and fills the response.
Why: the token-in/token-out endpoint is the RL trainers' way in.
Remove when: upstream vLLM PR #49577 (sampling masks upstream, vLLM 0.28)
    declares these fields.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._http import (BodyField, FormatField, LogKeptField,
                                              LogprobsField, MaskField, body_field,
                                              format_field, logprobs_field)


def apply(module) -> None:
    class GenerateRequest(module.GenerateRequest):
        return_sampling_mask: BodyField = body_field()
        sampling_mask_format: FormatField = format_field()
        return_sampling_mask_logprobs: BodyField = logprobs_field()

    class GenerateResponseChoice(module.GenerateResponseChoice):
        sampling_mask: MaskField = None
        sampling_mask_logprobs: LogprobsField = None
        sampling_mask_log_kept: LogKeptField = None

    class GenerateResponse(module.GenerateResponse):
        choices: list[GenerateResponseChoice]

    module.GenerateRequest = GenerateRequest
    module.GenerateResponseChoice = GenerateResponseChoice
    module.GenerateResponse = GenerateResponse
