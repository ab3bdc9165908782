"""`/v1/chat/completions` wire format, as `completion_protocol` is `/v1/completions`'
(the same fields, the same reason).

What: replaces `ChatCompletionRequest`, `ChatCompletionResponseChoice` and
`ChatCompletionResponse` in `vllm/entrypoints/openai/chat_completion/protocol.py` with
subclasses that declare the mask's fields (`_protocol.declare_openai_fields`); the
`openai_chat` patch fills the response fields.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.http._protocol import declare_openai_fields
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    declare_openai_fields(module, "ChatCompletionRequest", "ChatCompletionResponseChoice",
                          "ChatCompletionResponse", release)
