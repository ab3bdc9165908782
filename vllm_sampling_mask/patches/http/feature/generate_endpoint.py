"""`choices[].sampling_mask` from `POST /inference/v1/generate`, streamed or not.

What: in the generate route's serving module (`release.module("generate_serving")`:
    `vllm/entrypoints/scale_out/token_in_token_out/serving.py`, on 0.24
    `vllm/entrypoints/serve/disagg/serving.py`), wraps
    `ServingTokens.serve_tokens` to put the `return_sampling_mask` body field
    (declared by the `generate_protocol` patch) into the request's
    `SamplingParams.extra_args`, to run a non-streaming request with
    FINAL_ONLY outputs when the engine flag is on or n > 1 (so `n > 1` returns
    every choice: upstream's cumulative outputs keep only the children that
    finished in the last step, a 200 with fewer than n choices), and, with the
    flag on, to start a stream only once its first event is not an error (a
    request the input processor refuses is an HTTP 400, streamed or not; a
    refusal logs one line, `_refusals.answered`);
    `serve_tokens_full_generator` to fill each choice's `sampling_mask` from
    its final `CompletionOutput` (`_full_response.fill_masks`, the three routes'
    one path; the finals recorded from its result generator:
    `full_response_with_masks`); `serve_tokens_stream_generator` to give each
    chunk the supports of exactly its tokens (`_stream.StreamMasks`, flag on),
    and, flag on or off, the first result it reads holding every choice of an
    n > 1 request (upstream sizes its per-choice counters from it, and failed
    with HTTP 500 "list index out of range" when some children's first tokens
    came later). The two n > 1 fixes hold with the flag off too: they are
    upstream bugs, found by the soak run against a server without masks. A
    completion the mask path ended (`sampling_mask_error`) is an HTTP 400
    carrying that message, or an error event in a stream; never a choice
    without its mask.
Why: the token-in/token-out endpoint is the RL trainers' way in.
Upstream: the mask, vLLM #49577. The two n > 1 fixes (upstream bugs, kept in
    this module because they change the same three wrappers): no issue or PR
    known; would file "/inference/v1/generate: n > 1 returns fewer than n
    choices without streaming, and a stream fails with 'list index out of
    range' when some children's first tokens come later".
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
        forward_body_field(request.sampling_params, request.return_sampling_mask,
                           request.return_sampling_mask_logprobs)
        on = serving_mask_enabled(self)
        if not request.stream and (on or (release.generate_n_unstreamed_bug
                                          and request.sampling_params.n > 1)):
            # One final output holding every child of n > 1.
            request.sampling_params.output_kind = RequestOutputKind.FINAL_ONLY
        result = answered(await refusing(wrapped(*args, **kwargs), "serve_tokens",
                                         release, "sampling_params."),
                          "serve_tokens", error_response, "sampling_params.")
        if isinstance(result, AsyncGenerator) and (
                on or request.return_sampling_mask is not None
                or request.return_sampling_mask_logprobs is not None):
            return await open_stream(result, error_response)
        return result

    @wraps(module, "ServingTokens.serve_tokens_full_generator")
    async def serve_tokens_full_generator(wrapped, self, args, kwargs):
        try:
            return await full_response_with_masks(wrapped, args, kwargs, response_type)
        except SamplingMaskGenerationError as exc:
            return self.create_error_response(exc)

    @wraps(module, "ServingTokens.serve_tokens_stream_generator")
    def serve_tokens_stream_generator(wrapped, self, args, kwargs):
        request = argument(wrapped, args, kwargs, "request")
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
