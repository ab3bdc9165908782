"""Extract the sampling mask of a verify step in Model Runner V2's rejection sampler.

What: wraps `RejectionSampler.__call__` in
    `vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`. Inside the step the
    runner adapter opened and planned (`runner`: a request-level plan, made in
    `GPUModelRunner.sample` from the input batch), a verify step's batch is, per
    request, its draft positions and the bonus position, back to back
    (`input_batch.cu_num_logits_np`, host). The adapter takes the step's plan
    per position (`MaskStep.planned` with `request_rows`) and declares that the
    step takes its processed logits in one part, every row, from the sampler's
    `apply_sampling_params` (`MaskStep.in_parts`): Model Runner V2 processes
    every position, bonus included, with it (logits processors, temperature,
    min-p, top-k/top-p), in chunks of requests when a step's logits are large;
    the `sampler` patch's wrapper of that method hands each chunk to the step,
    with the capture of its rows that asked for support logprobs. Once the call
    returned, the step puts the chunks in logit-row order and extracts once
    (`MaskStep.extract_parts`); the runner adapter copies it as for a plain
    step. Every emitted token (accepted draft, recovered, bonus) lies in its
    position's processed target distribution (docs/sampling_mask.md,
    "Speculative decoding"); positions after a rejection emit nothing and
    decode as count 0.
Why: under speculative decoding the rejection sampler, not `Sampler.sample`,
    decides a step's tokens.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.patches.worker.feature.sampler import PROCESSING
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.step import step_of

HOP = "MRv2 RejectionSampler.__call__"


def apply(module, release: Release) -> None:
    @wraps(module, "RejectionSampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        # the state is declared on Sampler by the `sampler` patch
        step = step_of(self.sampler.sampling_mask)
        if step is None:
            return wrapped(*args, **kwargs)
        logits = argument(wrapped, args, kwargs, "logits")
        input_batch = argument(wrapped, args, kwargs, "input_batch")
        request_rows = np.diff(np.asarray(input_batch.cu_num_logits_np, dtype=np.int64))
        plan = step.planned(HOP, logits.shape[0], normalise=True, request_rows=request_rows)
        step.in_parts(HOP, {PROCESSING: np.arange(plan.batch_rows)})
        output = wrapped(*args, **kwargs)
        step.extract_parts(HOP)
        return output
