"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares
    `Sampler.sampling_mask` (the runner's `state.SamplingMaskState`, None with
    the flag off; the `runner` patch sets it where upstream builds the
    sampler) and the dataclass field `SamplerOutput.sampling_mask` (None), and
    wraps `Sampler.add_request` (the state records the request's decision per
    slot, `validation.wants_mask`), `Sampler.sample` and `Sampler.__call__`.
    With a state, `sample` compacts the support of the logits it sampled from
    (after every processor and top-k/top-p/min-p) for the rows that want a
    mask (`state.extract`, sized from their host-side top-k: no device sync)
    and hands it to `__call__` (`state.mask.put`), which puts it on the
    `SamplerOutput` it returns (`state.mask.take`: a mask of no rows when none wants
    one; MissingSamplingMaskError when `sample` extracted none).
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
Remove when: upstream returns the support from its sampler (vLLM #49577,
    in 0.28, with GPU compaction in #54901).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.extraction import DeviceMask
from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.state import SamplingMaskState, capturing_state


def apply(module) -> None:
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
        asked = np.ones(len(slots), bool) if state.worst_case else state.asked[slots]
        with state.capturing(asked):
            sampled, processed_logits = wrapped(*args, **kwargs)
            if state.capture_pending:   # no logits processing: nothing was scaled
                state.capture_scaled(processed_logits)
        state.mask.put(state.extract(processed_logits, self.sampling_states.top_k.np[slots],
                                     state.wants[slots], asked, normalise=True))
        return sampled, processed_logits

    @wraps(module, "Sampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            output.sampling_mask = self.sampling_mask.mask.take("Sampler.__call__")
        return output
