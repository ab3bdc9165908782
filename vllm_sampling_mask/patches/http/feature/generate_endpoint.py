"""`choices[].sampling_mask` from `POST /inference/v1/generate`, streamed or not.

What it wraps, in the generate route's serving module (`release.module("generate_serving")`):

- `ServingTokens.serve_tokens`: forwards the body's `return_sampling_mask`; one final
  output for every choice; a refused request is an HTTP 400, streamed or not;
- `ServingTokens.serve_tokens_full_generator`: each choice's mask from its final output;
- `ServingTokens.serve_tokens_stream_generator`: each chunk the supports of its tokens.

A completion the mask path ended is an HTTP 400 (an error event in a stream), never a
choice without its mask. Two n > 1 upstream bugs are fixed here with the flag off too.
Why: the token-in/token-out endpoint is the RL trainers' way in.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from vllm_sampling_mask.config import serving_mask_enabled
from vllm_sampling_mask.errors import SamplingMaskGenerationError
from vllm_sampling_mask.patches.http._body_fields import forward_body_field
from vllm_sampling_mask.patches.http._full_response import full_response_with_masks
from vllm_sampling_mask.patches.http._refusals import answered, error_response_class, open_stream, refusing
from vllm_sampling_mask.patches.http._stream import StreamMasks
from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    import importlib

    from vllm.sampling_params import RequestOutputKind

    protocol = importlib.import_module(release.module("generate_protocol"))

    response_type = getattr(protocol, release.generate_response)
    error_response = error_response_class(release)

    @wraps(module, "ServingTokens.serve_tokens")
    async def serve_tokens(wrapped, self, args, kwargs):
        request = argument(wrapped, args, kwargs, "request")
        # the body field (declared by the `generate_protocol` patch) into `extra_args`
        forward_body_field(request.sampling_params, request.return_sampling_mask,
                           request.return_sampling_mask_logprobs)
        on = serving_mask_enabled(self)
        if not request.stream and (on or (release.generate_n_unstreamed_bug
                                          and request.sampling_params.n > 1)):
            # One final output holding every child of n > 1 (upstream's cumulative
            # outputs keep only the children that finished in the last step: a 200 with
            # fewer than n choices; an upstream bug, fixed with the flag off too).
            request.sampling_params.output_kind = RequestOutputKind.FINAL_ONLY
        result = answered(await refusing(wrapped(*args, **kwargs), "serve_tokens",
                                         release, "sampling_params."),
                          "serve_tokens", error_response, "sampling_params.")
        # With the flag on, a stream starts only once its first event is not an error
        # (a refusal logs one line, `_refusals.answered`).
        if isinstance(result, AsyncGenerator) and (
                on or request.return_sampling_mask is not None
                or request.return_sampling_mask_logprobs is not None):
            return await open_stream(result, error_response)
        return result

    @wraps(module, "ServingTokens.serve_tokens_full_generator")
    async def serve_tokens_full_generator(wrapped, self, args, kwargs):
        # `_full_response.fill_masks`, the three routes' one path, from the finals
        # recorded from the result generator; `sampling_mask_error` is an HTTP 400.
        try:
            return await full_response_with_masks(wrapped, args, kwargs, response_type)
        except SamplingMaskGenerationError as exc:
            return self.create_error_response(exc)

    @wraps(module, "ServingTokens.serve_tokens_stream_generator")
    def serve_tokens_stream_generator(wrapped, self, args, kwargs):
        request = argument(wrapped, args, kwargs, "request")
        # Flag on or off, the first result holds every choice of n > 1
        # (`every_choice_first`); with the flag on, `_stream.StreamMasks` gives each
        # chunk the supports of exactly its tokens.
        n = request.sampling_params.n if release.generate_n_stream_bug else 1

        if not serving_mask_enabled(self):
            if n > 1:
                args, kwargs = with_argument(wrapped, args, kwargs, "result_generator",
                                           lambda results: every_choice_first(results, n))
            return wrapped(*args, **kwargs)
        masks = StreamMasks.of(request, choices=request.sampling_params.n)
        args, kwargs = with_argument(wrapped, args, kwargs, "result_generator",
            lambda results: masks.watch(every_choice_first(results, n) if n > 1
                                        else results))
        return masks.chunks(wrapped(*args, **kwargs))


async def every_choice_first(results, n: int):
    """Re-yield a stream's results, the first one holding all `n` choices: upstream
    sizes its per-choice counters from the first result, and with n > 1 that may
    hold only the children whose first tokens came first ("list index out of
    range"). Leading DELTA results are merged into it (`RequestOutput.add`, which
    joins their masks too)."""
    try:
        first = None
        async for res in results:
            if first is None:
                first = res
            else:
                first.add(res, aggregate=True)
            if first.finished or len({c.index for c in first.outputs}) >= n:
                break
        if first is not None:
            yield first
        async for res in results:
            yield res
    finally:
        await results.aclose()
