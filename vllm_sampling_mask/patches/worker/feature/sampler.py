"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares
    `Sampler.sampling_mask` (the runner's `worker.state.SamplingMaskState`, None
    with the flag off; the `runner` patch sets it where upstream builds the
    sampler), and wraps `Sampler.add_request` (the state records the request's
    decision per slot, `validation.wants_mask`), `Sampler.__call__` and
    `Sampler.sample`. Inside the step the runner adapter opened (`state.open`;
    a sampler call outside one, a warm-up, extracts nothing): `__call__` plans
    the step from the input batch it is given (`SamplingMaskState.plan`: the
    batch's slots, their host-side top-k, and the rows that sample nothing this
    step, a partial prefill chunk: the host mirror of upstream's own rule in
    `get_num_sampled_and_rejected`, seq_len < prefill_len, from
    `InputBatch.seq_lens_cpu_upper_bound` against the sampler's
    `req_states.prefill_len.np` of the batch's slots, `discarded_rows`; in the
    profiling run the sampler plans every row); `sample` compacts the support of the logits it
    sampled from (after every processor and top-k/top-p/min-p) for the plan's
    rows into the step (`MaskStep.extract`: sized from host-side top-k, no
    device sync; the rows left out decode as sampled nothing).
    Support logprobs: for the rows that asked, `sample` hands the step's
    capture to the call that holds the temperature-scaled logits: for the
    duration of its own call, the sampler's `sampling_states.apply_min_p`
    (called by `apply_sampling_params` right after the temperature, on the
    float32 copy it edits in place) is shadowed on that instance by one that
    records its input first (the asked rows' largest scaled logprob: [A]
    floats). A step that needs no logits processing (temperature 1, no
    truncation) never calls it: its processed logits are then the scaled ones,
    recorded after `sample`. The extraction gathers the support logprobs from
    the processed logits (log-softmaxed for the asked rows only).
Why: the sampler is the only place where the exact support exists.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.capture import shadowing
from vllm_sampling_mask.worker.state import SamplingMaskState

HOP = "Sampler.sample"


def apply(module, release: Release) -> None:
    module.Sampler.sampling_mask: SamplingMaskState | None = None

    @wraps(module, "Sampler.add_request")
    def add_request(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            self.sampling_mask.requests.add(argument(wrapped, args, kwargs, "req_idx"),
                                            argument(wrapped, args, kwargs, "sampling_params"))

    @wraps(module, "Sampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        state = self.sampling_mask
        step = None if state is None else state.open
        if step is not None and not state.worst_case:
            input_batch = argument(wrapped, args, kwargs, "input_batch")
            slots = input_batch.idx_mapping_np
            step.set_plan("Sampler.__call__", state.plan(
                slots, self.sampling_states.top_k.np[slots],
                discarded_rows(self, input_batch), normalise=True))
        return wrapped(*args, **kwargs)

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        state = self.sampling_mask
        step = None if state is None else state.open
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


def discarded_rows(sampler, input_batch) -> np.ndarray:
    """The requests of the batch whose sampled token upstream discards this step
    (a partial prefill chunk), from host arrays only: upstream's rule (seq_len <
    prefill_len of the request's slot, `get_num_sampled_and_rejected`) on the
    step's host-side sequence lengths (`seq_lens_cpu_upper_bound`) and the
    slots' host-side prefill lengths, the ones the device rule reads. The upper
    bound is exact for every request the rule can discard: under speculative
    decoding it also counts drafts, which only a request past its prefill has.
    Vectorised; no device sync."""
    slots = input_batch.idx_mapping_np
    seq_lens = input_batch.seq_lens_cpu_upper_bound.numpy()[: len(slots)]
    return seq_lens < sampler.req_states.prefill_len.np[slots]
