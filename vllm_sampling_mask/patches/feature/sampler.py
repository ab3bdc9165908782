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
Why: the sampler is the only place where the exact support exists.
Remove when: upstream returns the support from its sampler (vLLM #49577,
    in 0.28, with GPU compaction in #54901).
"""

from __future__ import annotations

from vllm_sampling_mask.extraction import DeviceMask
from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.state import SamplingMaskState


def apply(module) -> None:
    module.Sampler.sampling_mask: SamplingMaskState | None = None
    add_field(module.SamplerOutput, "sampling_mask", DeviceMask | None, None)

    @wraps(module, "Sampler.add_request")
    def add_request(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            self.sampling_mask.add_request(argument(wrapped, args, kwargs, "req_idx"),
                                           argument(wrapped, args, kwargs, "sampling_params"))

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        sampled, processed_logits = wrapped(*args, **kwargs)
        state = self.sampling_mask
        if state is not None:
            slots = argument(wrapped, args, kwargs, "idx_mapping_np")
            state.mask.put(state.extract(processed_logits, self.sampling_states.top_k.np[slots],
                                    state.wants[slots]))
        return sampled, processed_logits

    @wraps(module, "Sampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            output.sampling_mask = self.sampling_mask.mask.take("Sampler.__call__")
        return output
