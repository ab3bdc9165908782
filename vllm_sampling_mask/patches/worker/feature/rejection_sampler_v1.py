"""Extract the sampling mask of a verify step in the V1 runner's rejection sampler.

What it wraps, in `vllm/v1/sample/rejection_sampler.py`:

- `RejectionSampler.forward`: plans the step per position, declares its processed
  logits as two parts (bonus and draft positions), and extracts once they are handed;
- `apply_top_k_top_p` (what `apply_sampling_constraints` ends with): hands the draft
  positions' processed logits.

Why: under speculative decoding the rejection sampler, not the sampler, decides a
step's tokens; the trainer replays the target distribution at each position, so the
mask is that distribution's support (its marginal is the target's, whatever the
draft).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.patches.worker.feature.sampler_v1 import HOP as BONUS
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.step import open_step, step_of

HOP = "V1 RejectionSampler.forward"
# the hop that hands a verify step its draft positions' processed logits
DRAFTS = "V1 rejection_sampler.apply_top_k_top_p"


def apply(module, release: Release) -> None:
    @wraps(module, "RejectionSampler.forward")
    def forward(wrapped, self, args, kwargs):
        step = step_of(self.sampler.sampling_mask)   # declared on Sampler by `sampler_v1`
        if step is None:
            return wrapped(*args, **kwargs)
        # A verify step's batch is R requests x (their draft positions + 1) rows of
        # target logits, back to back; each row takes its request's decision (the
        # runner adapter planned the step per request).
        metadata = argument(wrapped, args, kwargs, "metadata")
        logits = argument(wrapped, args, kwargs, "logits")
        request_rows = np.asarray(metadata.num_draft_tokens, dtype=np.int64) + 1
        plan = step.planned(HOP, logits.shape[0], normalise=True,
                            request_rows=request_rows)
        is_bonus = np.zeros(plan.batch_rows, dtype=bool)
        is_bonus[np.cumsum(request_rows) - 1] = True
        # The bonus positions are sampled by the plain sampler, whose adapter
        # (`sampler_v1`) hands their processed logprobs; the draft positions' logits
        # are handed by the `apply_top_k_top_p` wrapper below. Every emitted token
        # (accepted draft, recovered, bonus) is drawn within its position's target
        # support (a recovered one from max(0, p - q), zero where p is); rows after a
        # rejection emit nothing and decode as count 0.
        step.in_parts(HOP, {BONUS: np.flatnonzero(is_bonus),
                            DRAFTS: np.flatnonzero(~is_bonus)},
                      index={BONUS: metadata.bonus_logits_indices,
                             DRAFTS: metadata.target_logits_indices})
        output = wrapped(*args, **kwargs)
        if plan.worst_case and argument(wrapped, args, kwargs, "sampling_metadata").all_greedy:
            # The profiling run's all-greedy verify step: `apply_sampling_constraints`
            # returned before `apply_top_k_top_p`, so the draft positions' raw target
            # logits stand in (memory sizing needs every row at the widest, not the
            # values). A served all-greedy step plans no row and extracts none.
            raw = logits[metadata.target_logits_indices]
            piece = step.piece(DRAFTS, raw.shape[0])
            if piece.capture is not None:
                piece.capture.record(raw)
            step.hand(piece, raw)
        if plan.n_rows == 0:   # no position to extract (idle rows ride on the mask)
            step.extract(HOP, logits)
        else:   # both parts, put in logit-row order, extracted once
            step.extract_parts(HOP)
        return output

    @wraps(module, "apply_top_k_top_p")
    def apply_top_k_top_p(wrapped, _, args, kwargs):
        step = open_step()   # a module function: no sampler to reach the state through
        if step is None or not step.takes(DRAFTS):
            return wrapped(*args, **kwargs)
        # its input is the temperature-scaled logits (the capture's), its output the
        # draft positions' processed logits (after logits processors, temperature,
        # top-k and top-p)
        scaled_logits = argument(wrapped, args, kwargs, "logits")
        piece = step.piece(DRAFTS, scaled_logits.shape[0])
        if piece.capture is not None:
            piece.capture.record(scaled_logits)
        processed = wrapped(*args, **kwargs)
        step.hand(piece, processed)
        return processed
