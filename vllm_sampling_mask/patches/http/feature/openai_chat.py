"""`choices[].sampling_mask` from `POST /v1/chat/completions`, streamed or not.

What: in `vllm/entrypoints/openai/chat_completion/serving.py`, wraps
    `OpenAIServingChat.create_chat_completion` to answer a completion the mask
    path ended (`sampling_mask_error`) with HTTP 400 carrying its message
    (upstream: a 500 "Internal server error"), and to start a stream only once
    its first event is not an error (a request the input processor refuses is
    an HTTP 400, streamed or not); `chat_completion_full_generator` to fill
    each choice's `sampling_mask` (declared by the `chat_protocol` patch) from
    its final `CompletionOutput` (`_full_response.fill_masks`, the three routes'
    one path; the finals recorded from its result generator:
    `full_response_with_masks`); `chat_completion_stream_generator` to give
    each chunk the supports of exactly its tokens (`_stream.StreamMasks`: `[]` on
    the role chunk; tokens a parser held back without a chunk go with the
    choice's next chunk) and to end a stream with an error event carrying a
    mask error's message. The body field reaches the engine through
    `ChatCompletionRequest.to_sampling_params` (`chat_protocol`).
Why: RL trainers that sample through the OpenAI chat API.
"""

from __future__ import annotations

from vllm_sampling_mask.config import serving_mask_enabled
from vllm_sampling_mask.patches.http._full_response import full_response_with_masks
from vllm_sampling_mask.patches.http._refusals import create_with_masks
from vllm_sampling_mask.patches.http._stream import StreamMasks
from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:

    @wraps(module, "OpenAIServingChat.create_chat_completion")
    async def create_chat_completion(wrapped, self, args, kwargs):
        return await create_with_masks(self, wrapped, args, kwargs, release)

    @wraps(module, "OpenAIServingChat.chat_completion_full_generator")
    async def chat_completion_full_generator(wrapped, self, args, kwargs):
        return await full_response_with_masks(wrapped, args, kwargs,
                                              module.ChatCompletionResponse)

    @wraps(module, "OpenAIServingChat.chat_completion_stream_generator")
    def chat_completion_stream_generator(wrapped, self, args, kwargs):
        if not serving_mask_enabled(self):
            return wrapped(*args, **kwargs)
        request = argument(wrapped, args, kwargs, "request")
        # the role chunk (and echo's) come from the first result before its outputs
        masks = StreamMasks.of(request, choices=request.n or 1, ahead=True)
        args, kwargs = with_argument(wrapped, args, kwargs, "result_generator", masks.watch)
        return masks.chunks(wrapped(*args, **kwargs))
