"""`/v1/completions` wire format: the `return_sampling_mask` body field in,
`choices[].sampling_mask` out.

What it replaces, in `vllm/entrypoints/openai/completion/protocol.py`:

- `CompletionRequest`, `CompletionResponseChoice` and `CompletionResponse`, with
  subclasses declaring the mask's body and response fields
  (`_protocol.declare_openai_fields` says which, and how each is checked); the
  `openai_completions` patch fills the response fields.

Why: the per-request choice must reach the engine from the OpenAI client
(`extra_body={"return_sampling_mask": ...}`), and the mask must come back.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.http._protocol import declare_openai_fields
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    declare_openai_fields(module, "CompletionRequest", "CompletionResponseChoice",
                          "CompletionResponse", release)
