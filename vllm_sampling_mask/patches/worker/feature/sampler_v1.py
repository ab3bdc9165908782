"""Extract the sampling mask in the V1 model runner's sampler.

What it wraps, in `vllm/v1/sample/sampler.py`, beside declaring `Sampler.sampling_mask`
(the runner's state; `runner_v1` sets it):

- `Sampler.sample`: extracts the support of the processed logprobs it returns into the
  open step, or, inside a verify step, hands them to it as the bonus part
  (`rejection_sampler_v1`); with the support-logprob capture of the rows that asked.

Why: the sampler is the only place where the exact support exists.
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

    # Processed logprobs are always materialised in `processed_logprobs` mode (which the
    # flag requires), and in that mode upstream never picks the FlashInfer sampler: the
    # mask costs no change of sampling kernel.
    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        # Outside a step (a warm-up) nothing is extracted.
        step = step_of(self.sampling_mask)
        if step is None:
            return wrapped(*args, **kwargs)
        rows = argument(wrapped, args, kwargs, "logits").shape[0]
        # inside a verify step, this batch is its bonus rows: that part's next piece
        piece = step.piece(HOP, rows) if step.takes(HOP) else None
        # the rows that want a mask less those whose draw the runner discards, their
        # host-side top-k (the memory-profiling run: every row at the widest)
        plan = step.planned(HOP, rows) if piece is None else None
        capture = step.capture if piece is None else piece.capture
        if capture is None:
            scaling = nullcontext()
        else:   # hand the capture to the call that holds the scaled logits
            # `apply_temperature` is a static method upstream calls as
            # `self.apply_temperature`; it divides the logits in place, and min-p and
            # top-k/top-p then edit them in place: the capture records the scaled
            # distribution's largest logprob ([A] floats), shadowed for this call only
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
        else:   # `log_softmax` of what it sampled from, after every processor: the -inf set
            step.extract(HOP, processed_logprobs, sampled)

        return sampled, processed_logprobs
