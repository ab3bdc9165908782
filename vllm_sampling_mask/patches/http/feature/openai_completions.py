"""`choices[].sampling_mask` from `POST /v1/completions`, streamed or not.

What: in `vllm/entrypoints/openai/completion/serving.py`, wraps
    `OpenAIServingCompletion.create_completion` to answer a completion the mask
    path ended (`sampling_mask_error`) with HTTP 400 carrying its message
    (upstream: a 500 "Internal server error"), and to start a stream only once
    its first event is not an error (a request the input processor refuses is
    an HTTP 400, streamed or not); `request_output_to_completion_response` to
    fill each choice's `sampling_mask` (declared by the `completion_protocol`
    patch) from its final `CompletionOutput` (`_full_response.fill_masks`, the
    three routes' one path; the finals come from its `final_res_batch`, whose
    choices upstream numbers over all prompts in order: `batch_finals`);
    `completion_stream_generator` to give each chunk the supports of exactly its
    tokens (`_stream.StreamMasks`; a chunk's choice index is `output.index +
    prompt index * n`, as upstream's) and to end a stream with an error event
    carrying a mask error's message. The body field reaches the engine through
    `CompletionRequest.to_sampling_params` (`completion_protocol`). The mask
    covers the generated tokens (what `return_token_ids` returns as
    `token_ids`), also with `echo`.
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
        return await create_with_masks(self, wrapped, args, kwargs, release)

    @wraps(module, "OpenAIServingCompletion.request_output_to_completion_response")
    def request_output_to_completion_response(wrapped, self, args, kwargs):
        finals = batch_finals(argument(wrapped, args, kwargs, "final_res_batch"))
        return fill_masks(wrapped(*args, **kwargs), finals,
                          argument(wrapped, args, kwargs, "request"))

    @wraps(module, "OpenAIServingCompletion.completion_stream_generator")
    def completion_stream_generator(wrapped, self, args, kwargs):
        if not serving_mask_enabled(self):
            return wrapped(*args, **kwargs)
        request = argument(wrapped, args, kwargs, "request")
        n = request.n or 1
        masks = StreamMasks.of(request, stride=n, indexed=True, choices=n * argument(
            wrapped, args, kwargs, "num_prompts"))
        args, kwargs = with_argument(wrapped, args, kwargs, "result_generator", masks.watch)
        return masks.chunks(wrapped(*args, **kwargs))
