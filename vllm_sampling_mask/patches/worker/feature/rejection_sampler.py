"""Extract the sampling mask of a verify step in Model Runner V2's rejection sampler.

What: wraps `RejectionSampler.__call__` in
    `vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`. Inside the step the
    runner adapter opened (`runner`), a verify step's batch is, per request, its
    draft positions and the bonus position, back to back
    (`input_batch.cu_num_logits_np`, host). The adapter plans the step from the
    input batch as the sampler adapter does (`sampler`: the slots' decisions,
    host-side top-k, partial prefills), takes that plan per position
    (`MaskStep.planned` with `request_rows`) and collects the processed target
    logits of every position: Model Runner V2 processes all of them, bonus
    included, with the sampler's own `apply_sampling_params` (logits
    processors, temperature, min-p, top-k/top-p), in chunks of requests when a
    step's logits are large; that method is shadowed on the sampler for the
    duration of the call to keep each chunk's result, and, for the rows that
    asked for support logprobs, to record the temperature-scaled logits where
    it calls `sampling_states.apply_min_p` (the sampler adapter's capture, per
    chunk). The chunks, in logit-row order, are the step's one extraction
    (`MaskStep.extract`); the runner adapter copies it as for a plain step.
    Every emitted token (accepted draft, recovered, bonus) lies in its
    position's processed target distribution (docs/sampling_mask.md,
    "Speculative decoding"); positions after a rejection emit nothing and
    decode as count 0.
Why: under speculative decoding the rejection sampler, not `Sampler.sample`,
    decides a step's tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.patches.worker.feature.sampler import discarded_rows, scaled_into
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.capture import merged, part_capture, shadowing

HOP = "MRv2 RejectionSampler.__call__"


def apply(module, release: Release) -> None:
    @wraps(module, "RejectionSampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        sampler = self.sampler
        state = sampler.sampling_mask   # declared on Sampler by the `sampler` patch
        step = None if state is None else state.open
        if step is None:
            return wrapped(*args, **kwargs)
        logits = argument(wrapped, args, kwargs, "logits")
        input_batch = argument(wrapped, args, kwargs, "input_batch")
        if not state.worst_case:
            slots = input_batch.idx_mapping_np
            step.set_plan(HOP, state.plan(slots, sampler.sampling_states.top_k.np[slots],
                                          discarded_rows(sampler, input_batch),
                                          normalise=True))
        request_rows = np.diff(np.asarray(input_batch.cu_num_logits_np, dtype=np.int64))
        plan = step.planned(HOP, logits.shape[0], normalise=True, request_rows=request_rows)
        chunks, parts = [], []
        process = sampler.apply_sampling_params
        states = sampler.sampling_states

        def processing(chunk_logits, *rest, **named):
            first = sum(c.shape[0] for c in chunks)
            rows = np.arange(first, first + chunk_logits.shape[0])
            capture = part_capture(step.capture, rows)
            with scaled_into(capture, states):
                processed = process(chunk_logits, *rest, **named)
            if capture is not None and not capture.recorded:
                capture.record(processed)   # no logits processing: nothing was scaled
            chunks.append(processed)
            parts.append((rows, capture))
            return processed

        with shadowing(sampler, "apply_sampling_params", processing):
            output = wrapped(*args, **kwargs)
        if sum(c.shape[0] for c in chunks) != plan.batch_rows:
            raise MissingSamplingMaskError(
                HOP, f"the verify step processed {sum(c.shape[0] for c in chunks)} of its "
                f"{plan.batch_rows} logit rows through apply_sampling_params")
        processed = (chunks[0] if len(chunks) == 1
                     else torch.cat([c.to(torch.float32) for c in chunks]))
        if step.capture is not None:
            step.capture.scaled_top = merged(plan.batch_rows, parts, HOP, logits.device)
        step.extract(HOP, processed)
        return output
