"""SkyRL: its sample-support replay fed the engine's exact support.

SkyRL (0.4.0) replays a per-token support when
`generator.inference_engine.enable_return_sample_support_set` and
`trainer.algorithm.enable_sample_support_replay` are on. Its rollout server
(`VLLMServerActor`, or its `python -m` server) answers `POST /skyrl/v1/generate`
with `return_sample_support: true` by asking vLLM for `logprobs=top_k` processed
logprobs and keeping the finite ids, then overwriting the weakest id when the sampled
one is missing ("repair"). Its trainer reads the result as one `[tokens, top_k]`
int32 array per sample, padded at the end of each row with -1.

This module takes that route over, through vLLM's own `--middleware` option, which
SkyRL passes through from its configuration (`engine_init_kwargs` become the server's
arguments). With it, a request that asks for the support is generated with this
package's `return_sampling_mask` and `logprobs=0`: the engine returns the exact
support each token was drawn from, which becomes the same `[tokens, width]` -1-padded
array, with no repair and without the top_k-wide logprob payload. A request that does
not ask for the support goes to SkyRL's own handler unchanged.

    generator:
      inference_engine:
        enable_return_sample_support_set: true
        engine_init_kwargs:
          return_sampling_mask: true
          middleware: ["vllm_sampling_mask.integrations.skyrl.SampleSupportRoute"]

(`engine_init_kwargs()` below returns that dict.) SkyRL itself sets
`logprobs_mode="processed_logprobs"`, which the mask needs, when capture is on.

Width. SkyRL's trainer needs one width for every sample of a batch (its
`build_sample_support` refuses arrays of different widths), so the width is fixed
per server: the request's `sampling_params.top_k` (SkyRL's own width, and what its
configuration requires to be > 1), or `skyrl_sample_support_width` where set (an
`engine_init_kwargs` entry too; it must be at least the top_k). The exact support can
be wider than top_k: on a CPU host vLLM's top-k keeps every id tied with the k-th
logit (common in bfloat16). Such a completion is never cut: the route answers HTTP
400 naming the widest support, the width, and `skyrl_sample_support_width`; with it
set to that many or more, every row of the run has that width (the trainer scores
over the padded rows as over any others).

The coverage metric. In SkyRL's trainer (`PolicyWorkerBase._forward_backward_micro`,
FSDP backend, `trainer.algorithm.enable_sample_support_replay`), each micro-batch's
status gets `sampling_mask/mass_outside_support` (the trainer's full-softmax
probability outside each loss token's replayed support at the current weights,
`training.support_coverage`, mean over the loss tokens with a support) and
`sampling_mask/support_size` (their mean support size); SkyRL averages them over
micro-batches and data-parallel ranks like its `policy_entropy`. They are computed
without gradient from the temperature-scaled logits the replay's
`score_aligned_sample_support` already receives, `COVERAGE_ROWS` rows at a time (one
`[rows, V]` float32 chunk more; SkyRL's replay itself scores the support's pairs only,
so the full softmax's log-sum-exp is this metric's own pass over the logits).
`VLLM_SAMPLING_MASK_COVERAGE=0` turns it off.

A tied LM head (`patch_fsdp_strategy`, a fix of SkyRL's, not of the mask's): SkyRL's
FSDP2 init moves the model to the meta device before sharding it, which gives a tied
LM head a parameter of its own; the trainer then trains that head while vLLM, which
ties the head to the embedding and skips `lm_head.weight` on a load, keeps sampling
from the embedding. From the first weight sync on the trainer's log-probabilities are
not the engine's (demo model, top-k 8, top-p 0.7: SkyRL's `is_ratio_mean` 1.015 at
step 2 with masks). The patch ties the weights again before sharding, as the
checkpoint has them.

The package's site hook registers the three trainer patches (`patch_model_wrapper`,
`patch_worker`, `patch_fsdp_strategy`) for when SkyRL imports those modules, in every
process of the job.

Importing this module imports neither vLLM nor SkyRL; the route imports them when
it is installed in a server.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

import numpy as np

__all__ = ["ROUTE", "WIDTH_OPTION", "MIDDLEWARE", "SupportWidthError",
           "engine_init_kwargs", "support_width", "support_rows", "SampleSupportRoute",
           "install_route", "COVERAGE_METRICS", "MODEL_WRAPPER", "WORKER",
           "coverage_sums", "replay_coverage", "patch_model_wrapper", "patch_worker",
           "patch_fsdp_strategy"]

ROUTE = "/skyrl/v1/generate"
# The server argument (an `engine_init_kwargs` entry) that fixes the width.
WIDTH_OPTION = "skyrl_sample_support_width"
MIDDLEWARE = f"{__name__}.SampleSupportRoute"
PADDING = -1   # SkyRL's SAMPLE_SUPPORT_PADDING (a seam entry checks it)


class SupportWidthError(ValueError):
    """A support that SkyRL's fixed-width layout cannot hold (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def engine_init_kwargs(width: int | None = None) -> dict[str, Any]:
    """SkyRL's `generator.inference_engine.engine_init_kwargs` entries that turn the
    exact support on (merge them into any you already have)."""
    kwargs: dict[str, Any] = {"return_sampling_mask": True, "middleware": [MIDDLEWARE]}
    if width is not None:
        kwargs[WIDTH_OPTION] = _check_width_option(width)
    return kwargs


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_width_option(width: Any) -> int:
    if not _is_int(width) or width < 1:
        raise SupportWidthError(
            f"{WIDTH_OPTION} must be a positive integer (the support columns of every "
            f"row), got {width!r}", WIDTH_OPTION)
    return width


def support_width(top_k: Any, width_option: Any = None) -> int:
    """The row width of a request's support array, decided before it runs.

    `top_k` is the request's `sampling_params.top_k`; `width_option` the server's
    `skyrl_sample_support_width` (None when unset)."""
    if top_k is None or (_is_int(top_k) and top_k in (0, -1)):
        top_k = None   # no top-k
    elif not (_is_int(top_k) and top_k > 0):
        raise SupportWidthError(
            f"sampling_params.top_k must be an integer (> 0 for a top-k, 0 or -1 for "
            f"none), got {top_k!r}", "sampling_params.top_k")
    if width_option is not None:
        width = _check_width_option(width_option)
        if top_k is not None and top_k > width:
            raise SupportWidthError(
                f"sampling_params.top_k={top_k} is wider than {WIDTH_OPTION}={width}: "
                f"a support can hold top_k ids; raise {WIDTH_OPTION} to at least "
                f"{top_k} or lower top_k", "sampling_params.top_k")
        return int(width)
    if top_k is None:
        raise SupportWidthError(
            "return_sample_support needs a fixed row width for SkyRL's [tokens, top_k] "
            "layout: set sampling_params.top_k > 0, or start the server with "
            f"{WIDTH_OPTION} (generator.inference_engine.engine_init_kwargs."
            f"{WIDTH_OPTION}) for supports without a top-k", "sampling_params.top_k")
    return int(top_k)


def support_rows(ids: np.ndarray, offsets: np.ndarray, width: int) -> np.ndarray:
    """The exact supports (`SamplingMask.ids` / `.offsets`: token t's ids are
    `ids[offsets[t]:offsets[t+1]]`) as SkyRL's `[tokens, width]` int32 array, each
    row's ids first and -1 after them.

    A support wider than `width` raises `SupportWidthError`: never cut."""
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    tokens = len(sizes)
    widest = int(sizes.max(initial=0))
    if widest > width:
        wide = np.flatnonzero(sizes > width)
        raise SupportWidthError(
            f"the engine's support of {len(wide)} token(s) is wider than the row width "
            f"{width} SkyRL's layout has for this server (widest {widest} ids, at "
            f"token {int(wide[0])}; top-k keeps every id tied with the k-th logit). No "
            f"support is cut: start the server with {WIDTH_OPTION} >= {widest} "
            f"(generator.inference_engine.engine_init_kwargs.{WIDTH_OPTION}), or "
            "serve in float32, where ties are rare", WIDTH_OPTION)
    rows = np.full((tokens, width), PADDING, dtype=np.int32)
    if len(ids):
        token_of = np.repeat(np.arange(tokens), sizes)
        column = np.arange(len(ids)) - np.repeat(offsets[:-1], sizes)
        rows[token_of, column] = ids
    return rows


# -- the route, inside SkyRL's server ---------------------------------------------


def _error(message: str, param: str | None = None, status: int = 400):
    from fastapi.responses import JSONResponse

    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return JSONResponse(status_code=status, content={"error": {
        "message": message, "type": kind, "param": param, "code": status}})


def _lora_request(request, body: dict, args):
    """The loaded LoRA adapter `body["model"]` names, as SkyRL's route resolves it
    (None for the base model); raises LookupError for an unknown name."""
    name = body.get("model")
    if not getattr(args, "enable_lora", False) or not name:
        return None
    models = request.app.state.openai_serving_models
    if name in models.lora_requests:
        return models.lora_requests[name]
    if not models.is_base_model(name):
        raise LookupError(f"The model `{name}` does not exist.")
    return None


async def _generate_with_support(request, body: dict):
    import orjson
    from fastapi.responses import Response
    from skyrl.backends.skyrl_train.inference_servers.generate_wire import (
        PackedField, build_logprobs_content, pack_routed_experts, pack_sample_support)
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import SamplingParams
    from vllm.utils import random_uuid

    from vllm_sampling_mask.config import mask_enabled
    from vllm_sampling_mask.frontend.validation import MASK_ARG

    state = request.app.state
    engine = state.engine_client
    args = state.args
    if not mask_enabled(engine.vllm_config):
        return _error(
            "return_sample_support through vllm_sampling_mask needs the engine started "
            "with return_sampling_mask: add return_sampling_mask: true to "
            "generator.inference_engine.engine_init_kwargs (or --return-sampling-mask)",
            "return_sampling_mask")
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list):
        return _error("token_ids must be a list of prompt token ids", "token_ids")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        return _error("sampling_params must be an object", "sampling_params")
    params = dict(params)
    try:
        width = support_width(params.get("top_k"), getattr(args, WIDTH_OPTION, None))
    except SupportWidthError as exc:
        return _error(str(exc), exc.param)
    try:
        lora_request = _lora_request(request, body, args)
    except LookupError as exc:
        return _error(str(exc), "model", status=404)
    # The sampled token's own logprob only: the support comes from the mask.
    params["logprobs"] = 0
    params.pop("flat_logprobs", None)
    extra_args = dict(params.pop("extra_args", None) or {})
    extra_args[MASK_ARG] = True
    try:
        sampling_params = SamplingParams(**params, extra_args=extra_args)
    except (TypeError, ValueError) as exc:
        return _error(f"sampling_params: {exc}", "sampling_params")
    cache_salt = body.get("cache_salt")
    prompt = (TokensPrompt(prompt_token_ids=token_ids) if cache_salt is None else
              TokensPrompt(prompt_token_ids=token_ids, cache_salt=cache_salt))
    final = None
    try:
        async for final in engine.generate(prompt, sampling_params,
                                           request_id=random_uuid(),
                                           lora_request=lora_request):
            pass
    except ValueError as exc:   # the input processor's refusals (VLLMValidationError)
        return _error(str(exc), getattr(exc, "parameter", None))
    if final is None:
        return _error("vLLM returned no output", status=500)
    out = final.outputs[0]
    if getattr(out, "sampling_mask_error", None) is not None:
        return _error(out.sampling_mask_error, "return_sample_support")
    mask = out.sampling_mask
    if mask is None or len(mask) != len(out.token_ids):
        return _error(f"the engine returned no sampling mask for {len(out.token_ids)} "
                      "tokens although the request asked for one", status=500)
    try:
        rows = support_rows(mask.ids, mask.offsets, width)
    except SupportWidthError as exc:
        return _error(str(exc), exc.param)
    token_ids_out = list(out.token_ids)
    content, _ = build_logprobs_content(token_ids_out, out.logprobs)
    routed = getattr(out, "routed_experts", None)
    choice = {
        "token_ids": token_ids_out,
        "finish_reason": out.finish_reason,
        "logprobs": {"content": content},
        PackedField.ROUTED_EXPERTS.value: (None if routed is None
                                           else pack_routed_experts(routed)),
        PackedField.ROLLOUT_SAMPLE_SUPPORT.value: pack_sample_support(rows),
    }
    return Response(content=orjson.dumps({"choices": [choice]}),
                    media_type="application/json")


def install_route(app) -> None:
    """Put this module's `/skyrl/v1/generate` ahead of SkyRL's in `app` (once).

    Requests without `return_sample_support` are handed to SkyRL's own handler."""
    from fastapi.routing import APIRoute
    from starlette.routing import Route

    routes = app.router.routes
    if any(getattr(r, "endpoint", None) is not None
           and getattr(r.endpoint, "_vllm_sampling_mask_skyrl", False) for r in routes):
        return
    theirs = [r for r in routes if isinstance(r, APIRoute) and r.path == ROUTE
              and "POST" in r.methods]
    if not theirs:
        raise RuntimeError(
            f"{MIDDLEWARE}: this server has no POST {ROUTE} route to take over; the "
            "middleware is for SkyRL's rollout server (VLLMServerActor, or "
            "python -m skyrl.backends.skyrl_train.inference_servers.vllm_server_actor)")
    skyrl_generate = theirs[0].endpoint

    async def generate(request):
        try:
            body = await request.json()
        except ValueError:
            return _error("the request body is not JSON")
        if not isinstance(body, dict) or not body.get("return_sample_support"):
            return await skyrl_generate(request)   # Starlette keeps the body read
        return await _generate_with_support(request, body)

    generate._vllm_sampling_mask_skyrl = True
    routes.insert(0, Route(ROUTE, generate, methods=["POST"]))


class SampleSupportRoute:
    """ASGI middleware, loaded by vLLM's `--middleware` (SkyRL:
    `engine_init_kwargs.middleware`): on the server's first event (its lifespan
    start, or else its first request) it installs `install_route` in the app, then
    passes every request on untouched."""

    def __init__(self, app) -> None:
        self.app = app
        self._installed = False

    async def __call__(self, scope, receive, send) -> None:
        if not self._installed and scope.get("type") in ("lifespan", "http"):
            install_route(scope["app"])
            self._installed = True
        await self.app(scope, receive, send)


# -- the coverage metric, in SkyRL's trainer -------------------------------------------

COVERAGE_METRICS = ("sampling_mask/mass_outside_support", "sampling_mask/support_size")
MODEL_WRAPPER = "skyrl.backends.skyrl_train.workers.model_wrapper"
WORKER = "skyrl.backends.skyrl_train.workers.worker"
COVERAGE_ROWS = 256     # logits rows of one chunk of the coverage pass
_MARK = "_vllm_sampling_mask_skyrl"
_sums: contextvars.ContextVar = contextvars.ContextVar("skyrl_coverage", default=None)


@contextlib.contextmanager
def coverage_sums():
    """Collect `[mass outside, support size, tokens]` over the replays inside (a list
    yielded, summed over the loss tokens with a support)."""
    sums = [0.0, 0.0, 0]
    token = _sums.set(sums)
    try:
        yield sums
    finally:
        _sums.reset(token)


def replay_coverage(logits, row_ids, loss_mask, sample_support, chunk_rows=COVERAGE_ROWS):
    """`[mass outside, support size, tokens]` summed over the positions where
    `loss_mask` is set and `row_ids` names a row of `sample_support` (SkyRL's
    `PackedTensor` of `[tokens, width]` rows, -1 padded): the full softmax of
    `logits` `[..., V]` (already temperature-scaled) outside each row's ids. No
    gradient; `chunk_rows` logits rows gathered at a time."""
    import torch

    from vllm_sampling_mask.training import support_coverage

    with torch.no_grad():
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        rows = row_ids.reshape(-1).to(flat.device)
        where = torch.nonzero((rows >= 0) & loss_mask.reshape(-1).to(flat.device).bool())
        where = where.flatten()
        values = sample_support.values.to(flat.device)
        total = torch.zeros(3, dtype=torch.float64, device=flat.device)
        for a in range(0, where.numel(), chunk_rows):
            at = where[a:a + chunk_rows]
            support = values.index_select(0, rows.index_select(0, at)).long()
            keep = support >= 0
            sizes = keep.sum(dim=1)
            offsets = torch.zeros(len(at) + 1, dtype=torch.long, device=flat.device)
            offsets[1:] = sizes.cumsum(0)
            cover = support_coverage(flat.index_select(0, at), (support[keep], offsets),
                                     chunk_rows=chunk_rows)
            total += cover.totals()
        mass, size, count = total.tolist()           # one host sync for the call
    return [mass, size, int(count)]


def patch_model_wrapper(module) -> None:
    """The FSDP `HFModelWrapper.forward`'s replay (`score_aligned_sample_support`, the
    name in its module) also adds each call's coverage to an open `coverage_sums`."""
    original = module.score_aligned_sample_support
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def score_aligned_sample_support(aligned_source, aligned_sampled_ids, aligned_row_ids,
                                     aligned_loss_mask, sample_support, *args, **kwargs):
        scores = original(aligned_source, aligned_sampled_ids, aligned_row_ids,
                          aligned_loss_mask, sample_support, *args, **kwargs)
        sums = _sums.get()
        if sums is not None and kwargs.get("lm_head_weight") is None:
            # FSDP: aligned_source is the unsharded, temperature-scaled logits
            got = replay_coverage(aligned_source, aligned_row_ids, aligned_loss_mask,
                                  sample_support)
            for i, value in enumerate(got):
                sums[i] += value
        return scores

    setattr(score_aligned_sample_support, _MARK, True)
    module.score_aligned_sample_support = score_aligned_sample_support


def patch_worker(module) -> None:
    """`PolicyWorkerBase._forward_backward_micro` (with sample-support replay on)
    puts the micro-batch's two coverage means in the status it returns, unless
    VLLM_SAMPLING_MASK_COVERAGE=0."""
    cls = module.PolicyWorkerBase
    original = cls._forward_backward_micro
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def _forward_backward_micro(self, *args, **kwargs):
        from vllm_sampling_mask.config import coverage_enabled

        if not (self.cfg.algorithm.enable_sample_support_replay and coverage_enabled()):
            return original(self, *args, **kwargs)
        with coverage_sums() as sums:
            status = original(self, *args, **kwargs)
        mass, size, count = sums
        if count and isinstance(status, dict):
            status[COVERAGE_METRICS[0]] = mass / count
            status[COVERAGE_METRICS[1]] = size / count
        return status

    setattr(_forward_backward_micro, _MARK, True)
    cls._forward_backward_micro = _forward_backward_micro


# -- the tied LM head, in SkyRL's FSDP2 init -------------------------------------------


def patch_fsdp_strategy(module) -> None:
    """`apply_fsdp2` (the name `FSDPStrategy._fsdp_init_model` calls, after it moves
    the model to the meta device) ties a model's LM head to its embedding again first,
    where the model's config ties them.

    Why: the move gives each of the two a parameter of its own, so SkyRL trains a head
    that no weight sync delivers (vLLM's tied models skip `lm_head.weight`). Tied
    again before sharding, one FSDP2 step equals an unsharded tied model's (0.0
    difference in weights and logits, tests/integrations/test_skyrl_integration.py).
    Until: SkyRL's `_fsdp_init_model` keeps or restores the tie (its seam entries,
    `trainer.tied_head`, fail when that source changes)."""
    original = module.apply_fsdp2
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def apply_fsdp2(model, *args, **kwargs):
        if getattr(getattr(model, "config", None), "tie_word_embeddings", False) \
                and hasattr(model, "tie_weights"):
            model.tie_weights()
        return original(model, *args, **kwargs)

    setattr(apply_fsdp2, _MARK, True)
    module.apply_fsdp2 = apply_fsdp2
