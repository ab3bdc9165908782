"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares
    `Sampler.return_sampling_mask` and `Sampler.sampling_mask_worst_case`
    (False; the `runner` patch sets them where upstream builds the sampler)
    and the dataclass field `SamplerOutput.sampling_mask` (None), and wraps
    `Sampler.sample` and `Sampler.__call__`. With the flag on, `sample`
    compacts the support of the logits it sampled from (after every processor
    and top-k/top-p/min-p) with `extraction.extract_support`, sized from the
    host-side top-k of the batch (no device sync), and `__call__` puts it on
    the `SamplerOutput` it returns. (The `runner` patch also turns the
    FlashInfer sampler off, which never materialises the processed logits.)
Why: the sampler is the only place where the exact support exists.
Remove when: upstream returns the support from its sampler (vLLM #49577,
    in 0.28, with GPU compaction in #54901).
"""

from __future__ import annotations

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import DeviceMask, extract_support, plan_layout
from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import wraps


def apply(module) -> None:
    Sampler = module.Sampler
    Sampler.return_sampling_mask = False
    Sampler.sampling_mask_worst_case = False
    Sampler._pending_sampling_mask = None  # from `sample` to `__call__`, same step
    add_field(module.SamplerOutput, "sampling_mask", DeviceMask | None, None)

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        sampled, processed_logits = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            idx_mapping_np = _arg(args, kwargs, 2, "idx_mapping_np")
            states = self.sampling_states
            layout = plan_layout(states.top_k.np[idx_mapping_np], states.vocab_size,
                                 worst_case=self.sampling_mask_worst_case)
            self._pending_sampling_mask = extract_support(processed_logits, layout)
        return sampled, processed_logits

    @wraps(module, "Sampler.__call__")
    def __call__(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            mask, self._pending_sampling_mask = self._pending_sampling_mask, None
            if mask is None:
                raise MissingSamplingMaskError(
                    "Sampler.__call__", "Sampler.sample returned without extracting one")
            output.sampling_mask = mask
        return output


def _arg(args, kwargs, index: int, name: str):
    """Argument `name` of `Sampler.sample(logits, expanded_idx_mapping, idx_mapping_np, ...)`."""
    return kwargs[name] if name in kwargs else args[index]
