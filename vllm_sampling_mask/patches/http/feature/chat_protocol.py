"""`/v1/chat/completions` wire format, as `completion_protocol` is `/v1/completions'`
(the same fields, the same reason).

What it replaces, in `vllm/entrypoints/openai/chat_completion/protocol.py`:

- `ChatCompletionRequest`, `ChatCompletionResponseChoice` and `ChatCompletionResponse`,
  with subclasses declaring the mask's fields (`_protocol.declare_openai_fields`); the
  `openai_chat` patch fills the response fields.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.http._protocol import declare_openai_fields
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    declare_openai_fields(module, "ChatCompletionRequest", "ChatCompletionResponseChoice",
                          "ChatCompletionResponse", release)
