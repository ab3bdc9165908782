"""`choices[].sampling_mask` from `POST /v1/chat/completions`, streamed or not.

What it wraps, in `vllm/entrypoints/openai/chat_completion/serving.py`:

- `OpenAIServingChat.create_chat_completion`: a completion the mask path ended is an
  HTTP 400 with its message; a stream starts only once its first event is no error;
- `chat_completion_full_generator`: each choice's mask from its final output;
- `chat_completion_stream_generator`: each chunk the supports of exactly its tokens, and
  a mask error as the stream's error event.

The body field reaches the engine through `chat_protocol`.
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
        # upstream answered `sampling_mask_error` with a 500 "Internal server error"
        return await create_with_masks(self, wrapped, args, kwargs, release)

    @wraps(module, "OpenAIServingChat.chat_completion_full_generator")
    async def chat_completion_full_generator(wrapped, self, args, kwargs):
        # `_full_response.fill_masks`, the three routes' one path, from the finals
        # recorded from the result generator
        return await full_response_with_masks(wrapped, args, kwargs,
                                              module.ChatCompletionResponse)

    @wraps(module, "OpenAIServingChat.chat_completion_stream_generator")
    def chat_completion_stream_generator(wrapped, self, args, kwargs):
        if not serving_mask_enabled(self):
            return wrapped(*args, **kwargs)
        request = argument(wrapped, args, kwargs, "request")
        # the role chunk (and echo's) come from the first result before its outputs: `[]`
        # there; tokens a parser held back without a chunk go with the choice's next one

        masks = StreamMasks.of(request, choices=request.n or 1, ahead=True)
        args, kwargs = with_argument(wrapped, args, kwargs, "result_generator", masks.watch)
        return masks.chunks(wrapped(*args, **kwargs))
