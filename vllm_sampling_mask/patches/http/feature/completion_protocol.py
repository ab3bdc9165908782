"""`/v1/completions` wire format: the `return_sampling_mask` body field in,
`choices[].sampling_mask` out.

What: in `vllm/entrypoints/openai/completion/protocol.py`, replaces
    `CompletionRequest` with a subclass that declares the body fields
    `return_sampling_mask: bool | None` and `return_sampling_mask_logprobs: bool |
    None` (strict: "yes" is a 400 naming it) and `sampling_mask_format: "lists" |
    "packed" | None` (any other value a 400 naming it), and whose
    `to_sampling_params` puts the two switches into the request's
    `SamplingParams.extra_args` (other extra args kept; absent leaves them alone),
    where the input processor decides; and `CompletionResponseChoice` / `CompletionResponse` with
    subclasses that declare `sampling_mask` (lists, or the packed object),
    `sampling_mask_logprobs` and `sampling_mask_log_kept` (the response class too:
    pydantic serialises a list field by its declared item type; its
    `model_dump()` leaves a lists mask for the `json_response` patch to write
    from its arrays: `_full_response.WritesMaskLists`); all through
    `_protocol.declare_openai_fields`. The names are replaced as the module finishes
    executing, so the route (`api_router`) parses the subclass and the serving
    module builds the subclasses. The `openai_completions` patch fills the fields.
    On 0.24, whose `check_logprobs` compares `logprobs` or `prompt_logprobs` as sent
    (`Release.logprobs_compared_raw`), the subclass first refuses a value there
    that is no number, naming the field (upstream's comparison raised a
    TypeError, a 400 naming none; vLLM #49144 checks them itself from 0.27).
Why: the per-request choice must reach the engine from the OpenAI client
    (`extra_body={"return_sampling_mask": ...}`), and the mask must reach it back.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.http._protocol import declare_openai_fields
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    declare_openai_fields(module, "CompletionRequest", "CompletionResponseChoice",
                          "CompletionResponse", release)
