"""Accumulate masks per request and put them on each `CompletionOutput`.

What: wraps `OutputProcessor.process_outputs` (vllm/v1/engine/output_processor.py)
    to append each engine-core output's supports to its request's
    `accumulator.MaskAccumulator` before upstream handles the output, and
    `RequestState._new_completion_output` to set `sampling_mask` on the
    `CompletionOutput` it builds: all tokens so far for cumulative and final
    outputs, the new tokens only for DELTA outputs, always the same tokens
    as `token_ids`. Stop strings trim text only, never `token_ids`, so they
    need nothing here.
Why: the output processor is where per-step outputs become per-request
    results (n > 1 children each have their own request state).
Remove when: upstream carries the mask to `CompletionOutput`.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.accumulator import MaskAccumulator


def apply(module) -> None:
    from vllm.logger import init_logger
    from vllm.sampling_params import RequestOutputKind

    logger = init_logger(__name__)

    OutputProcessor = module.OutputProcessor
    RequestState = module.RequestState
    original_process = OutputProcessor.process_outputs
    original_completion = RequestState._new_completion_output

    @functools.wraps(original_process)
    def process_outputs(self, engine_core_outputs, *args, **kwargs):
        for out in engine_core_outputs:
            ids = getattr(out, "sampling_mask_ids", None)
            if ids is None:
                continue
            state = self.request_states.get(out.request_id)
            if state is None:
                continue
            acc = getattr(state, "sampling_masks", None)
            if acc is None:
                acc = state.sampling_masks = MaskAccumulator()
            acc.append(ids, out.sampling_mask_counts)
        return original_process(self, engine_core_outputs, *args, **kwargs)

    @functools.wraps(original_completion)
    def _new_completion_output(self, token_ids, *args, **kwargs):
        output = original_completion(self, token_ids, *args, **kwargs)
        acc = getattr(self, "sampling_masks", None)
        if acc is not None:
            n, have = len(output.token_ids), len(acc)
            first, last = (have - n, have) if self.output_kind == RequestOutputKind.DELTA \
                else (0, n)
            if first < 0 or last > have:
                logger.error("sampling mask: request %s has %d masks for %d tokens; "
                             "returning no mask", self.request_id, have, last)
            else:
                output.sampling_mask = acc.mask(first, last)
        return output

    OutputProcessor.process_outputs = process_outputs
    RequestState._new_completion_output = _new_completion_output
