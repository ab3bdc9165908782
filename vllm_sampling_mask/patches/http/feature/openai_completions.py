"""`choices[].sampling_mask` from `POST /v1/completions`, streamed or not.

What it wraps, in `vllm/entrypoints/openai/completion/serving.py`:

- `OpenAIServingCompletion.create_completion`: a completion the mask path ended is an
  HTTP 400 with its message; a stream starts only once its first event is no error;
- `request_output_to_completion_response`: each choice's mask from its final output;
- `completion_stream_generator`: each chunk the supports of exactly its tokens, and a
  mask error as the stream's error event.

The mask covers the generated tokens (`token_ids` with `return_token_ids`), also with
`echo`; the body field reaches the engine through `completion_protocol`.
Why: RL trainers that sample through the OpenAI API.
"""

from __future__ import annotations

from vllm_sampling_mask.config import serving_mask_enabled
from vllm_sampling_mask.patches.http._full_response import batch_finals, fill_masks
from vllm_sampling_mask.patches.http._refusals import create_with_masks
from vllm_sampling_mask.patches.http._stream import StreamMasks
from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:

    @wraps(module, "OpenAIServingCompletion.create_completion")
    async def create_completion(wrapped, self, args, kwargs):
        # upstream answered `sampling_mask_error` with a 500 "Internal server error"
        return await create_with_masks(self, wrapped, args, kwargs, release)

    @wraps(module, "OpenAIServingCompletion.request_output_to_completion_response")
    def request_output_to_completion_response(wrapped, self, args, kwargs):
        # `_full_response.fill_masks`, the three routes' one path; upstream numbers the
        # choices over all prompts in order (`batch_finals`)
        finals = batch_finals(argument(wrapped, args, kwargs, "final_res_batch"))
        return fill_masks(wrapped(*args, **kwargs), finals,
                          argument(wrapped, args, kwargs, "request"))

    @wraps(module, "OpenAIServingCompletion.completion_stream_generator")
    def completion_stream_generator(wrapped, self, args, kwargs):
        if not serving_mask_enabled(self):
            return wrapped(*args, **kwargs)
        request = argument(wrapped, args, kwargs, "request")
        n = request.n or 1   # a chunk's choice index: output.index + prompt index * n

        masks = StreamMasks.of(request, stride=n, indexed=True, choices=n * argument(
            wrapped, args, kwargs, "num_prompts"))
        args, kwargs = with_argument(wrapped, args, kwargs, "result_generator", masks.watch)
        return masks.chunks(wrapped(*args, **kwargs))
