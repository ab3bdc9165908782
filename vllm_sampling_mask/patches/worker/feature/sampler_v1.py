"""Extract the sampling mask in the V1 model runner's sampler.

What: in `vllm/v1/sample/sampler.py`, declares `Sampler.sampling_mask` (the
    runner's `worker.state.SamplingMaskState`; `runner_v1` sets it where upstream
    builds the sampler; None with the flag off) and wraps `Sampler.sample`.
    Inside the step the runner adapter opened (`state.open`; a sampler call
    outside one, a warm-up, extracts nothing), `sample` takes the step's plan
    for its batch (`MaskStep.planned`: the rows that want a mask less those whose
    draw the runner discards, their host-side top-k; in the memory-profiling run
    every row at the widest) and extracts the support of the processed logprobs
    it returns (`log_softmax` of the logits it sampled from, after every logits
    processor, custom ones included, penalties, temperature, min-p and
    top-k/top-p: the same -inf set) into the step (`MaskStep.extract`). Inside
    a verify step (`rejection_sampler_v1`), whose bonus positions the rejection
    sampler samples through this sampler, it hands those processed logprobs to
    the step as the bonus part instead (`MaskStep.piece` / `hand`: their rows
    of the step's plan, their capture); the step extracts once. For the
    rows that asked for support logprobs it hands the step's capture to the
    call that holds the temperature-scaled logits: for the duration of its own
    call, the sampler's `apply_temperature` (a static method upstream calls as
    `self.apply_temperature`; it divides the logits in place, and the
    argmax-invariant processors, min-p among them, and top-k/top-p then edit
    them in place) is shadowed on the instance by one that records the scaled
    distribution's largest logprob ([A] floats, not the logits). A batch where
    no row asked captures nothing. An all-greedy batch applies no temperature:
    in the memory-profiling run (whose all-greedy verify step samples its bonus
    positions here, every row asking) the capture records the unscaled logits
    upstream returns.
Why: the sampler is the only place where the exact support exists. Processed
    logprobs are always materialised in `processed_logprobs` mode (which the
    flag requires), and in that mode upstream never picks the FlashInfer
    sampler, so the mask costs no change of sampling kernel.
"""

from __future__ import annotations

from contextlib import nullcontext

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.worker.extraction import no_rows
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.capture import shadowing
from vllm_sampling_mask.worker.state import SamplingMaskState
from vllm_sampling_mask.worker.step import step_of

HOP = "V1 Sampler.sample"


def apply(module, release: Release) -> None:
    module.Sampler.sampling_mask: SamplingMaskState | None = None

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        step = step_of(self.sampling_mask)
        if step is None:
            return wrapped(*args, **kwargs)
        rows = argument(wrapped, args, kwargs, "logits").shape[0]
        # inside a verify step, this batch is its bonus rows: that part's next piece
        piece = step.piece(HOP, rows) if step.takes(HOP) else None
        plan = step.planned(HOP, rows) if piece is None else None
        capture = step.capture if piece is None else piece.capture
        if capture is None:
            scaling = nullcontext()
        else:   # hand the capture to the call that holds the scaled logits
            scale = type(self).apply_temperature
            scaling = shadowing(self, "apply_temperature",
                                lambda *a, **k: capture.record(scale(*a, **k)))
        with scaling:
            sampled, processed_logprobs = wrapped(*args, **kwargs)
        if (capture is not None and not capture.recorded and processed_logprobs is not None
                and (piece.plan if plan is None else plan).worst_case
                and argument(wrapped, args, kwargs, "sampling_metadata").all_greedy):
            # the profiling run's all-greedy verify step, whose bonus logits come
            # back unscaled (greedy: no temperature): their capture records them
            capture.record(processed_logprobs)
        if processed_logprobs is None:   # an all-greedy batch
            if (piece.plan if plan is None else plan).n_rows:
                raise MissingSamplingMaskError(
                    HOP, "no processed logprobs were computed for a batch in which "
                    "some request wants a mask")
            if piece is None:
                step.no_mask_rows(HOP, no_rows(rows, sampled.device))
        elif piece is not None:
            step.hand(piece, processed_logprobs)
        else:
            step.extract(HOP, processed_logprobs, sampled)
        return sampled, processed_logprobs
