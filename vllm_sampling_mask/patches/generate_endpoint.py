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
    last step). A choice whose mask path failed (`sampling_mask_error`) turns
    the response into an HTTP 500 carrying that message, never a choice
    without its mask. Streaming chunks are unchanged.
Why: the token-in/token-out endpoint is the RL trainers' way in.
Remove when: upstream returns the mask from this endpoint (vLLM #49577).
"""

from __future__ import annotations

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import SamplingMaskRequestError, check_request
from vllm_sampling_mask.patches._wrap import wraps


def apply(module) -> None:
    from vllm.entrypoints.openai.engine.protocol import GenerationError
    from vllm.sampling_params import RequestOutputKind

    class GenerateResponseChoice(module.GenerateResponseChoice):
        sampling_mask: list[list[int]] | None = None

    class GenerateResponse(module.GenerateResponse):
        choices: list[GenerateResponseChoice]

    module.GenerateResponseChoice = GenerateResponseChoice
    module.GenerateResponse = GenerateResponse

    @wraps(module, "ServingTokens.serve_tokens")
    async def serve_tokens(wrapped, self, args, kwargs):
        request = args[0] if args else kwargs["request"]
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
        return await wrapped(*args, **kwargs)

    @wraps(module, "ServingTokens.serve_tokens_full_generator")
    async def serve_tokens_full_generator(wrapped, self, args, kwargs):
        final = {}

        async def recording(gen):
            async for res in gen:
                for completion in res.outputs:
                    final[completion.index] = completion
                yield res

        args = list(args)
        if len(args) > 1:
            args[1] = recording(args[1])
        else:
            kwargs["result_generator"] = recording(kwargs["result_generator"])
        response = await wrapped(*args, **kwargs)
        if not isinstance(response, GenerateResponse):
            return response
        for choice in response.choices:
            completion = final[choice.index]
            if completion.sampling_mask_error is not None:
                return self.create_error_response(
                    GenerationError(completion.sampling_mask_error))
            mask = completion.sampling_mask
            choice.sampling_mask = None if mask is None else mask.token_ids
        return response
