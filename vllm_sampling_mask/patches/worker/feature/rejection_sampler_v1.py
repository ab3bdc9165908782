"""Extract the sampling mask of a verify step in the V1 runner's rejection sampler.

What: wraps `RejectionSampler.forward` and `apply_top_k_top_p` (the module
    global `apply_sampling_constraints` calls) in
    `vllm/v1/sample/rejection_sampler.py`. Inside the step the runner adapter
    opened (`runner_v1`: a request-level plan), a verify step's batch is R
    requests x (their draft positions + 1) rows of target logits, back to back
    (`metadata.num_draft_tokens`, a host list). `forward` takes the step's plan
    per position (`MaskStep.planned` with `request_rows`: each row takes its
    request's decision) and declares the step's processed logits as two parts
    (`MaskStep.in_parts`), each handed by the hop that holds it:
    - the bonus positions: the rejection sampler samples them with the plain
      sampler (`self.sampler(...)`), whose adapter (`sampler_v1`) hands their
      processed logprobs as its part, with the capture of the rows that asked
      for support logprobs;
    - the draft positions: the logits `apply_sampling_constraints` returns
      (after the rejection sampler's logits processors, temperature, top-k and
      top-p), handed by the wrapper of `apply_top_k_top_p` it ends with (a
      module function: it finds the step open in its context,
      `step.open_step()`), whose input, the temperature-scaled logits, that
      part's capture records.
    Once upstream's call returned, the step puts both parts in logit-row order
    (at the metadata's `bonus_logits_indices` / `target_logits_indices`) and
    extracts once (`MaskStep.extract_parts`). Each emitted token (accepted
    draft, recovered, bonus) is drawn at one position from a distribution whose
    support is that position's: an accepted draft and a recovered token are
    drawn within the target's support (a recovered token from max(0, p - q),
    which is zero where p is), and the bonus token from the target. Rows after
    a rejection emit nothing and decode as count 0 (`transport.decode`); the
    scheduler gives each output the rows of the tokens it kept.
    The memory-profiling run's dummy sampler run ends with an all-greedy verify
    step, in which `apply_sampling_constraints` returns before `apply_top_k_top_p`:
    there (plan `worst_case`, `all_greedy`) the wrapper hands the draft positions'
    raw target logits (`logits[metadata.target_logits_indices]`, their capture
    recorded from the same), so that step extracts every row at the widest, as
    memory sizing needs (the values do not matter). A served all-greedy step
    plans no row (a greedy request wants no mask) and extracts none.
Why: under speculative decoding the rejection sampler, not the sampler, decides
    a step's tokens; the trainer replays the target distribution at each
    position, so the mask is that distribution's support (its marginal is the
    target's, whatever the draft).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.patches.worker.feature.sampler_v1 import HOP as BONUS
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.step import open_step

HOP = "V1 RejectionSampler.forward"
# the hop that hands a verify step its draft positions' processed logits
DRAFTS = "V1 rejection_sampler.apply_top_k_top_p"


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
        is_bonus = np.zeros(plan.batch_rows, dtype=bool)
        is_bonus[np.cumsum(request_rows) - 1] = True
        step.in_parts(HOP, {BONUS: np.flatnonzero(is_bonus),
                            DRAFTS: np.flatnonzero(~is_bonus)},
                      index={BONUS: metadata.bonus_logits_indices,
                             DRAFTS: metadata.target_logits_indices})
        output = wrapped(*args, **kwargs)
        if plan.worst_case and argument(wrapped, args, kwargs, "sampling_metadata").all_greedy:
            # the profiling run's all-greedy pass: upstream processed no draft position
            raw = logits[metadata.target_logits_indices]
            piece = step.piece(DRAFTS, raw.shape[0])
            if piece.capture is not None:
                piece.capture.record(raw)
            step.hand(piece, raw)
        if plan.n_rows == 0:   # no position to extract (idle rows ride on the mask)
            step.extract(HOP, logits)
        else:
            step.extract_parts(HOP)
        return output

    @wraps(module, "apply_top_k_top_p")
    def apply_top_k_top_p(wrapped, _, args, kwargs):
        step = open_step()   # a module function: no sampler to reach the state through
        if step is None or not step.takes(DRAFTS):
            return wrapped(*args, **kwargs)
        scaled_logits = argument(wrapped, args, kwargs, "logits")
        piece = step.piece(DRAFTS, scaled_logits.shape[0])
        if piece.capture is not None:
            piece.capture.record(scaled_logits)
        processed = wrapped(*args, **kwargs)
        step.hand(piece, processed)
        return processed
