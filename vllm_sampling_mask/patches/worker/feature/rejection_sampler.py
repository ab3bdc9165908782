"""Extract the sampling mask of a verify step in Model Runner V2's rejection sampler.

What it wraps, in `vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`:

- `RejectionSampler.__call__`: plans the open step per position, takes the processed
  logits of every position from the sampler (`sampler`'s `apply_sampling_params`), and
  extracts once the call returned.

Every emitted token (accepted draft, recovered, bonus) lies in its position's processed
target distribution (docs/sampling_mask.md, "Speculative decoding").
Why: under speculative decoding the rejection sampler, not `Sampler.sample`, decides a
step's tokens.
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
        # per request, its draft positions and the bonus position, back to back (host);
        # the runner adapter made a request-level plan in `GPUModelRunner.sample`
        request_rows = np.diff(np.asarray(input_batch.cu_num_logits_np, dtype=np.int64))
        plan = step.planned(HOP, logits.shape[0], normalise=True, request_rows=request_rows)
        # one part, every row: MRv2 processes every position, bonus included, with the
        # sampler's `apply_sampling_params`, in chunks of requests when a step's logits
        # are large; the `sampler` patch hands each chunk to the step, with its capture
        step.in_parts(HOP, {PROCESSING: np.arange(plan.batch_rows)})
        output = wrapped(*args, **kwargs)
        # the chunks in logit-row order, extracted once; positions after a rejection emit
        # nothing and decode as count 0; the runner adapter copies it as for a plain step
        step.extract_parts(HOP)

        return output
