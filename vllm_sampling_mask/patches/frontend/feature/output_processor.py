"""Accumulate masks per request and put them on each `CompletionOutput`.

What it wraps, in `vllm/v1/engine/output_processor.py`, beside declaring
`RequestState.sampling_masks` and `RequestState.sampling_mask_error`:

- `RequestState.from_new_request`: a `MaskAccumulator` for a request that wants a mask;
- `OutputProcessor.process_outputs`: appends each engine-core output's supports to its
  request's accumulator before upstream handles the output;
- `RequestState._new_completion_output`: sets `sampling_mask` (the same tokens as
  `token_ids`) and `sampling_mask_error` on the output it builds.

Why: the output processor is where per-step outputs become per-request results (n > 1
children each have their own request state).
"""

from __future__ import annotations

from vllm_sampling_mask.frontend.accumulator import MaskAccumulator
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps, wraps_method
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.validation import wants_mask, wants_support_logprobs


def apply(module, release: Release) -> None:
    from vllm.sampling_params import RequestOutputKind

    RequestState = module.RequestState
    RequestState.sampling_masks = None
    RequestState.sampling_mask_error = None

    @wraps(module, "RequestState.from_new_request")
    def from_new_request(wrapped, cls, args, kwargs):
        state = wrapped(*args, **kwargs)
        request = argument(wrapped, args, kwargs, "request")
        if request.sampling_params is not None and wants_mask(request.sampling_params):
            state.sampling_masks = MaskAccumulator(
                with_logprobs=wants_support_logprobs(request.sampling_params),
                keep=state.output_kind != RequestOutputKind.DELTA)
        return state

    @wraps(module, "OutputProcessor.process_outputs")
    def process_outputs(wrapped, self, args, kwargs):
        engine_core_outputs = argument(wrapped, args, kwargs, "engine_core_outputs")
        for out in engine_core_outputs:
            state = self.request_states.get(out.request_id)
            if state is None or state.sampling_masks is None:
                continue
            # a request that never asked, whose mask the scheduler dropped: every output
            # reaching that token or a later one has sampling_mask=None and the reason
            if out.sampling_mask_reason is not None:
                state.sampling_masks.stop(out.sampling_mask_reason)
            if out.sampling_mask_error is not None:
                state.sampling_mask_error = out.sampling_mask_error
            elif state.sampling_masks.reason is not None:
                state.sampling_masks.skip(len(out.new_token_ids))
            elif out.new_token_ids:
                if out.sampling_mask_ids is None:
                    raise MissingSamplingMaskError(
                        "OutputProcessor.process_outputs",
                        f"request {out.request_id} got {len(out.new_token_ids)} "
                        "tokens but its EngineCoreOutput has no sampling_mask_ids")
                if state.sampling_masks.with_logprobs and out.sampling_mask_logprobs is None:
                    raise MissingSamplingMaskError(
                        "OutputProcessor.process_outputs",
                        f"request {out.request_id} asked for support logprobs but its "
                        "EngineCoreOutput has no sampling_mask_logprobs")
                # the engine core's bytes, kept by reference: joined when an output reads
                state.sampling_masks.append(out.sampling_mask_ids,

                                            out.sampling_mask_counts,
                                            out.sampling_mask_logprobs,
                                            out.sampling_mask_log_kept)
        return wrapped(*args, **kwargs)

    @wraps_method(module, "RequestState._new_completion_output")   # per token
    def _new_completion_output(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        acc = self.sampling_masks
        if acc is None:
            return output
        output.sampling_mask_error = self.sampling_mask_error
        n = len(output.token_ids)
        try:
            if not acc.keep:     # DELTA: the tokens that arrived last, read once
                mask = acc.newest(n)
            elif n <= len(acc):
                mask = acc.mask(0, n)
            else:
                raise ValueError(f"{len(acc)} supports for {n} tokens")
        except ValueError as exc:   # a bug, reported on this request alone
            output.sampling_mask_error = f"sampling mask: internal error: {exc}"
            return output
        output.sampling_mask = mask
        if mask is None:   # the mask stopped at or before this output's last token
            output.sampling_mask_reason = acc.reason
        return output
