"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares
    `Sampler.sampling_mask` (the runner's `worker.state.SamplingMaskState`, None
    with the flag off; the `runner` patch sets it where upstream builds the
    sampler), and wraps `Sampler.add_request` (the state records the request's
    decision per slot, `validation.wants_mask`), `Sampler.sample` and
    `Sampler.apply_sampling_params`. Inside the step the runner adapter opened
    and planned (`state.open`, planned in `GPUModelRunner.sample`; a sampler
    call outside one, a warm-up, extracts nothing; in the profiling run the
    sampler plans every row): `sample` takes the step's plan for its batch
    (`MaskStep.planned`) and compacts the support of the logits it sampled from
    (after every processor and top-k/top-p/min-p) for the plan's rows into the
    step (`MaskStep.extract`: sized from host-side top-k, no device sync; the
    rows left out decode as sampled nothing). `apply_sampling_params`, inside
    a verify step that takes its processed logits from it (`MaskStep.takes`:
    the rejection sampler processes every position with it, in chunks of
    requests when a step's logits are large; `rejection_sampler`), hands each
    call's result to the step as its next rows (`MaskStep.piece` / `hand`);
    anywhere else it is upstream's.
    Support logprobs: for the rows that asked, `sample` (or, in a verify step,
    `apply_sampling_params` per chunk) hands the capture to the call that holds
    the temperature-scaled logits: for the duration of its own call, the
    sampler's `sampling_states.apply_min_p` (called by `apply_sampling_params`
    right after the temperature, on the float32 copy it edits in place) is
    shadowed on that instance by one that records its input first (the asked
    rows' largest scaled logprob: [A] floats). A step that needs no logits
    processing (temperature 1, no truncation) never calls it: its processed
    logits are then the scaled ones, recorded after the call. The extraction
    gathers the support logprobs from the processed logits (log-softmaxed for
    the asked rows only).
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
        if self.sampling_mask is not None:
            self.sampling_mask.requests.add(argument(wrapped, args, kwargs, "req_idx"),
                                            argument(wrapped, args, kwargs, "sampling_params"))

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
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
        step.extract(HOP, processed_logits)
        return sampled, processed_logits

    @wraps(module, "Sampler.apply_sampling_params")
    def apply_sampling_params(wrapped, self, args, kwargs):
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
    processed logits, which are the scaled ones."""
    if capture is None:
        return nullcontext()
    min_p = sampling_states.apply_min_p

    def record_then_min_p(logits, *a, **k):
        capture.record(logits)
        return min_p(logits, *a, **k)

    return shadowing(sampling_states, "apply_min_p", record_then_min_p)

