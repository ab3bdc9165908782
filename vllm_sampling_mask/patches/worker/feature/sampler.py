"""Extract the sampling mask in Model Runner V2's sampler.

What it wraps, in `vllm/v1/worker/gpu/sample/sampler.py`, beside declaring
`Sampler.sampling_mask` (the runner's state; the `runner` patch sets it):

- `Sampler.add_request`: records the request's decision for its slot;
- `Sampler.sample`: extracts the support of the logits it sampled from into the
  open step, with the support-logprob capture of the rows that asked;
- `Sampler.apply_sampling_params`: inside a verify step, hands each call's processed
  logits to the step (`rejection_sampler`).

Why: the sampler is the only place where the exact support exists.
"""

from __future__ import annotations

from contextlib import nullcontext

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.capture import shadowing
from vllm_sampling_mask.worker.state import SamplingMaskState
from vllm_sampling_mask.worker.step import step_of

HOP = "Sampler.sample"
# the hop that hands a verify step its processed logits (`rejection_sampler`)
PROCESSING = "Sampler.apply_sampling_params"


def apply(module, release: Release) -> None:
    module.Sampler.sampling_mask: SamplingMaskState | None = None

    @wraps(module, "Sampler.add_request")
    def add_request(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if self.sampling_mask is not None:   # `validation.wants_mask`, per slot
            self.sampling_mask.requests.add(argument(wrapped, args, kwargs, "req_idx"),
                                            argument(wrapped, args, kwargs, "sampling_params"))

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        # Outside a step (a warm-up) nothing is extracted. Inside, the runner adapter
        # planned it in `GPUModelRunner.sample` (the profiling run plans every row).
        step = step_of(self.sampling_mask)
        if step is None:
            return wrapped(*args, **kwargs)
        slots = argument(wrapped, args, kwargs, "idx_mapping_np")
        step.planned(HOP, len(slots), normalise=True)
        capture = step.capture
        with scaled_into(capture, self.sampling_states):
            sampled, processed_logits = wrapped(*args, **kwargs)
        if capture is not None and not capture.recorded:
            capture.record(processed_logits)   # no logits processing: nothing was scaled
        # after every processor and top-k/top-p/min-p; sized from host-side top-k, no
        # device sync; the rows the plan leaves out decode as sampled nothing
        step.extract(HOP, processed_logits)
        return sampled, processed_logits

    @wraps(module, "Sampler.apply_sampling_params")
    def apply_sampling_params(wrapped, self, args, kwargs):
        # A verify step's rejection sampler processes every position with this, in
        # chunks of requests when a step's logits are large: each call's result is the
        # step's next rows. Anywhere else it is upstream's.
        step = step_of(self.sampling_mask)
        if step is None or not step.takes(PROCESSING):
            return wrapped(*args, **kwargs)
        piece = step.piece(PROCESSING, argument(wrapped, args, kwargs, "logits").shape[0])
        capture = piece.capture
        with scaled_into(capture, self.sampling_states):
            processed = wrapped(*args, **kwargs)
        if capture is not None and not capture.recorded:
            capture.record(processed)   # no logits processing: nothing was scaled
        step.hand(piece, processed)
        return processed


def scaled_into(capture, sampling_states):
    """Inside: `capture` (None: nothing to do) records the temperature-scaled
    logits where the sampler's processing holds them: the input of
    `sampling_states.apply_min_p`, which `Sampler.apply_sampling_params` calls
    right after the temperature (shadowed on that instance for the duration).
    A call that processes nothing never calls it: the caller then records the
    processed logits, which are the scaled ones. What is recorded is the asked rows'
    largest scaled logprob ([A] floats); the extraction gathers the support logprobs
    from the processed logits (log-softmaxed for the asked rows only)."""
    if capture is None:
        return nullcontext()
    min_p = sampling_states.apply_min_p

    def record_then_min_p(logits, *a, **k):
        capture.record(logits)
        return min_p(logits, *a, **k)

    return shadowing(sampling_states, "apply_min_p", record_then_min_p)

