"""`choices[].sampling_mask` in `POST /inference/v1/generate`.

What: in `vllm/entrypoints/scale_out/token_in_token_out/serving.py`, swaps
    the response models for subclasses whose choice has
    `sampling_mask: list[list[int]] | None` (pydantic serialises a list field
    by its declared item type, so the response class is swapped too), fills it
    from each final `CompletionOutput`, and checks a request's sampling
    parameters before generation starts (a 400 for streaming requests too,
    instead of an error event after a 200). With the flag on, a non-streaming
    request runs with FINAL_ONLY outputs, so `n > 1` returns every choice
    (upstream's cumulative outputs keep only the children that finished in the
    last step). Streaming chunks are unchanged.
Why: the token-in/token-out endpoint is the RL trainers' way in.
Remove when: upstream returns the mask from this endpoint.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import SamplingMaskRequestError, check_request


def apply(module) -> None:
    from vllm.sampling_params import RequestOutputKind

    class GenerateResponseChoice(module.GenerateResponseChoice):
        sampling_mask: list[list[int]] | None = None

    class GenerateResponse(module.GenerateResponse):
        choices: list[GenerateResponseChoice]

    module.GenerateResponseChoice = GenerateResponseChoice
    module.GenerateResponse = GenerateResponse

    ServingTokens = module.ServingTokens
    original_serve = ServingTokens.serve_tokens
    original_full = ServingTokens.serve_tokens_full_generator

    @functools.wraps(original_serve)
    async def serve_tokens(self, request, raw_request=None):
        params = request.sampling_params
        if mask_enabled(self.engine_client.vllm_config) and params:
            try:
                check_request(params)
            except SamplingMaskRequestError as exc:
                return self.create_error_response(exc)
            if not request.stream:
                # One final output holding every child of n > 1: upstream's
                # cumulative outputs carry only the children that finished last.
                params.output_kind = RequestOutputKind.FINAL_ONLY
        return await original_serve(self, request, raw_request)

    @functools.wraps(original_full)
    async def serve_tokens_full_generator(self, request, result_generator, *args, **kwargs):
        final = {}

        async def recording(gen):
            async for res in gen:
                for completion in res.outputs:
                    final[completion.index] = completion
                yield res

        response = await original_full(self, request, recording(result_generator),
                                       *args, **kwargs)
        if isinstance(response, GenerateResponse):
            for choice in response.choices:
                completion = final.get(choice.index)
                mask = getattr(completion, "sampling_mask", None)
                choice.sampling_mask = None if mask is None else mask.token_ids
        return response

    ServingTokens.serve_tokens = serve_tokens
    ServingTokens.serve_tokens_full_generator = serve_tokens_full_generator
