"""Extract the sampling mask of a verify step in the V1 runner's rejection sampler.

What: wraps `RejectionSampler.forward` in `vllm/v1/sample/rejection_sampler.py`.
    Inside the step the runner adapter opened (`runner_v1`: a request-level
    plan), a verify step's batch is R requests x (their draft positions + 1)
    rows of target logits, back to back (`metadata.num_draft_tokens`, a host
    list). The adapter takes the step's plan per position (`MaskStep.planned`
    with `request_rows`: each row takes its request's decision) and assembles
    the processed target distribution of every position, in logit-row order,
    for the step's one extraction (`MaskStep.extract`):
    - the bonus positions: the rejection sampler samples them with the plain
      sampler (`self.sampler(...)`); the adapter opens, for that call, a step
      over the bonus rows alone (`plan.part`) whose extraction keeps the
      processed logprobs the sampler adapter (`sampler_v1`) hands it, and whose
      capture records the rows that asked for support logprobs;
    - the draft positions: the logits `apply_sampling_constraints` returns
      (after the rejection sampler's logits processors, temperature, top-k and
      top-p), taken where it calls `apply_top_k_top_p` (a module global,
      shadowed for the duration of the call), whose input is the
      temperature-scaled logits the capture records.
    Each emitted token (accepted draft, recovered, bonus) is drawn at one
    position from a distribution whose support is that position's: an accepted
    draft and a recovered token are drawn within the target's support (a
    recovered token from max(0, p - q), which is zero where p is), and the bonus
    token from the target. Rows after a rejection emit nothing and decode as
    count 0 (`transport.decode`); the scheduler gives each output the rows of
    the tokens it kept.
Why: under speculative decoding the rejection sampler, not the sampler, decides
    a step's tokens; the trainer replays the target distribution at each
    position, so the mask is that distribution's support (its marginal is the
    target's, whatever the draft).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker import plan as plans
from vllm_sampling_mask.worker.capture import merged, part_capture, shadowing

HOP = "V1 RejectionSampler.forward"


def apply(module, release: Release) -> None:
    @wraps(module, "RejectionSampler.forward")
    def forward(wrapped, self, args, kwargs):
        state = self.sampler.sampling_mask   # declared on Sampler by `sampler_v1`
        step = None if state is None else state.open
        if step is None:
            return wrapped(*args, **kwargs)
        metadata = argument(wrapped, args, kwargs, "metadata")
        logits = argument(wrapped, args, kwargs, "logits")
        request_rows = np.asarray(metadata.num_draft_tokens, dtype=np.int64) + 1
        plan = step.planned(HOP, logits.shape[0], normalise=True,
                            request_rows=request_rows)
        bonus_rows = np.cumsum(request_rows) - 1
        is_bonus = np.zeros(plan.batch_rows, dtype=bool)
        is_bonus[bonus_rows] = True
        draft_rows = np.flatnonzero(~is_bonus)
        kept = {}

        def keep(part_plan, processed, capture, hop, sampled=None):
            kept["bonus"] = processed
            kept["bonus capture"] = capture
            return None

        draft_capture = part_capture(step.capture, draft_rows)
        constrain = module.apply_top_k_top_p

        def constrained(scaled_logits, *rest, **named):
            if draft_capture is not None:
                draft_capture.record(scaled_logits)
            kept["draft"] = constrain(scaled_logits, *rest, **named)
            return kept["draft"]

        with state.step(plans.part(plan, bonus_rows), extract=keep), \
                shadowing(module, "apply_top_k_top_p", constrained):
            output = wrapped(*args, **kwargs)
        if plan.n_rows == 0:   # no position to extract (idle rows ride on the mask)
            step.extract(HOP, logits)
            return output
        if "bonus" not in kept:
            raise MissingSamplingMaskError(HOP, "the bonus positions were sampled without "
                                                "handing over their processed logits")
        if "draft" not in kept and len(draft_rows):
            raise MissingSamplingMaskError(HOP, "the draft positions were verified without "
                                                "top-k/top-p processing")
        processed = torch.empty((plan.batch_rows, logits.shape[1]), dtype=torch.float32,
                                device=logits.device)
        processed[metadata.bonus_logits_indices] = kept["bonus"]
        if len(draft_rows):
            processed[metadata.target_logits_indices] = kept["draft"]
        if step.capture is not None:
            step.capture.scaled_top = merged(
                plan.batch_rows, ((bonus_rows, kept["bonus capture"]),
                                  (draft_rows, draft_capture)), HOP, logits.device)
        step.extract(HOP, processed)
        return output
