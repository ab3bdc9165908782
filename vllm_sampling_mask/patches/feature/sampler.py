"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares
    `Sampler.sampling_mask` (the runner's `state.SamplingMaskState`, None with
    the flag off; the `runner` patch sets it where upstream builds the
    sampler) and the dataclass field `SamplerOutput.sampling_mask` (None), and
    wraps `Sampler.add_request` (the state records the request's decision per
    slot, `validation.wants_mask`), `Sampler.sample` and `Sampler.__call__`.
    With a state, `__call__` first stages the batch rows that sample nothing
    this step (`state.stage_discarded`: a partial prefill chunk, the host
    mirror of upstream's own rule in `get_num_sampled_and_rejected`,
    seq_len < prefill_len, from the step's host arrays:
    `InputBatch.seq_lens_cpu_upper_bound` against the sampler's
    `req_states.prefill_len.np` of the batch's slots; exact without
    speculative decoding, which the flag refuses); `sample` compacts the
    support of the logits it sampled from (after every processor and
    top-k/top-p/min-p) for the rows that want a mask, less those
    (`state.extract`, sized from their host-side top-k: no device sync; the
    rows left out decode as sampled nothing), and hands it to `__call__`
    (`state.mask.put`), which puts it on the `SamplerOutput` it returns
    (`state.mask.take`: a mask of no rows when none wants one;
    MissingSamplingMaskError when `sample` extracted none).
    Support logprobs: for the rows that asked (`state.asked[slots]`), `sample`
    runs upstream inside a capture, and the wrapped
    `SamplingStates.apply_min_p` (called by `apply_sampling_params` right
    after the temperature, on the float32 copy it edits in place) hands its
    input, the temperature-scaled logits, to `state.capture_scaled` first (the
    asked rows' largest scaled logprob: [A] floats). A step that needs no logits
    processing (temperature 1, no truncation) never calls it: its processed
    logits are then the scaled ones, captured after `sample`. The extraction
    gathers the support logprobs from the processed logits (log-softmaxed for
    the asked rows only).
Why: the sampler is the only place where the exact support exists.
Remove when: upstream's sampler mask (vLLM #49577 since 0.28, GPU compaction #54901
    since 0.30) takes per-request decisions, top-p/min-p-only rows and support
    logprobs; from 0.28 this extraction replaces upstream's (its flag is kept off).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.extraction import DeviceMask
from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.state import SamplingMaskState, capturing_state


def apply(module, release: Release) -> None:
    from vllm.v1.worker.gpu.sample import states

    module.Sampler.sampling_mask: SamplingMaskState | None = None
    add_field(module.SamplerOutput, "sampling_mask", DeviceMask | None, None)

    @wraps(states, "SamplingStates.apply_min_p")
    def apply_min_p(wrapped, self, args, kwargs):
        state = capturing_state()
        if state is not None:   # before min-p: the temperature-scaled logits
            state.capture_scaled(argument(wrapped, args, kwargs, "logits"))
        return wrapped(*args, **kwargs)

    @wraps(module, "Sampler.add_request")
    def add_request(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            self.sampling_mask.add_request(argument(wrapped, args, kwargs, "req_idx"),
                                           argument(wrapped, args, kwargs, "sampling_params"))

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        state = self.sampling_mask
        if state is None:
            return wrapped(*args, **kwargs)
        slots = argument(wrapped, args, kwargs, "idx_mapping_np")
        if state.worst_case:   # the profiling run: every row
            asked, discarded = np.ones(len(slots), bool), None
        else:
            discarded = state.take_discarded("Sampler.sample", len(slots))
            asked = state.asked[slots] & ~discarded   # a discarded row records nothing
        with state.capturing(asked):
            sampled, processed_logits = wrapped(*args, **kwargs)
            if state.capture_pending:   # no logits processing: nothing was scaled
                state.capture_scaled(processed_logits)
        state.mask.put(state.extract(processed_logits, self.sampling_states.top_k.np[slots],
                                     state.wants[slots], asked, discarded=discarded,
                                     normalise=True))
        return sampled, processed_logits

    @wraps(module, "Sampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        state = self.sampling_mask
        if state is None:
            return wrapped(*args, **kwargs)
        if not state.worst_case:
            state.stage_discarded(_discarded(self, argument(wrapped, args, kwargs,
                                                            "input_batch")))
        output = wrapped(*args, **kwargs)
        output.sampling_mask = state.mask.take("Sampler.__call__")
        return output


def _discarded(sampler, input_batch) -> np.ndarray:
    """The batch rows whose sampled token upstream discards this step (a partial
    prefill chunk), from host arrays only: upstream's rule (seq_len <
    prefill_len of the row's slot, `get_num_sampled_and_rejected`) on the step's
    host-side sequence lengths (`seq_lens_cpu_upper_bound`, exact without
    speculative decoding) and the slots' host-side prefill lengths, the ones the
    device rule reads. Vectorised; no device sync."""
    slots = input_batch.idx_mapping_np
    seq_lens = input_batch.seq_lens_cpu_upper_bound.numpy()[: len(slots)]
    return seq_lens < sampler.req_states.prefill_len.np[slots]
