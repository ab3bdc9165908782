"""Extract the sampling mask in Model Runner V2's sampler.

What: wraps `Sampler.__init__`, `Sampler.sample` and `Sampler.__call__` in
    `vllm/v1/worker/gpu/sample/sampler.py`. When the engine flag is on:
    `sample` compacts `isfinite(processed_logits)` (the logits it sampled
    from, after every processor and top-k/top-p/min-p) on the device with
    `extraction.extract_support`, sized by the batch's largest top-k read from
    the host-side request state (no device sync); `__call__` attaches it to the
    `SamplerOutput` it returns as `.sampling_mask`. The FlashInfer sampler is
    switched off for this engine, since it never materialises the processed
    logits. With the flag off nothing changes.
Why: the sampler is the only place where the exact support exists.
Remove when: upstream returns the support from its sampler.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.extraction import extract_support, support_width


def apply(module) -> None:
    from vllm.config import get_current_vllm_config_or_none

    Sampler = module.Sampler
    original_init = Sampler.__init__
    original_sample = Sampler.sample
    original_call = Sampler.__call__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.return_sampling_mask = mask_enabled(get_current_vllm_config_or_none())
        self._sampling_mask = None
        if self.return_sampling_mask:
            self.use_flashinfer = False

    @functools.wraps(original_sample)
    def sample(self, logits, expanded_idx_mapping, idx_mapping_np, *args, **kwargs):
        sampled, processed_logits = original_sample(
            self, logits, expanded_idx_mapping, idx_mapping_np, *args, **kwargs)
        if self.return_sampling_mask:
            states = self.sampling_states
            max_top_k = int(states.top_k.np[idx_mapping_np].max(initial=1))
            self._sampling_mask = extract_support(
                processed_logits, support_width(max_top_k, states.vocab_size))
        return sampled, processed_logits

    @functools.wraps(original_call)
    def __call__(self, logits, input_batch):
        output = original_call(self, logits, input_batch)
        output.sampling_mask, self._sampling_mask = self._sampling_mask, None
        return output

    Sampler.__init__ = __init__
    Sampler.sample = sample
    Sampler.__call__ = __call__
