"""Extract the sampling mask in the V1 model runner's sampler.

What: in `vllm/v1/sample/sampler.py`, declares on `Sampler`
    `return_sampling_mask` and `sampling_mask_max_size` (`runner_v1` sets them
    where upstream builds the sampler), `sampling_mask_top_k` and
    `sampling_mask_wanted` (per batch row, on the host, set by `runner_v1`
    before each call) and `sampling_mask_worst_case` (the memory-profiling
    run), and wraps `Sampler.sample` and `Sampler.forward`. With the flag on,
    `sample` compacts, for the rows that want a mask, the support of the
    processed logprobs it returns (`log_softmax` of the logits it sampled from, after
    every logits processor, custom ones included, penalties, temperature,
    min-p and top-k/top-p: the same -inf set) with
    `extraction.extract_support`; `forward` puts it on the declared field
    `SamplerOutput.sampling_mask`.
Why: the sampler is the only place where the exact support exists. Processed
    logprobs are always materialised in `processed_logprobs` mode (which the
    flag requires), and in that mode upstream never picks the FlashInfer
    sampler, so the mask costs no change of sampling kernel.
Remove when: upstream's V1 sampler returns the support (vLLM #49577 did it for
    Model Runner V2 only).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import extract_selected, no_rows
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE


def apply(module) -> None:
    Sampler = module.Sampler
    Sampler.return_sampling_mask = False
    Sampler.sampling_mask_max_size = DEFAULT_MAX_SIZE
    Sampler.sampling_mask_top_k = None      # host, per batch row, from `runner_v1`
    Sampler.sampling_mask_wanted = None     # host bool per batch row, from `runner_v1`
    Sampler.sampling_mask_worst_case = False
    Sampler._pending_sampling_mask = None  # from `sample` to `forward`, same step

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        sampled, processed_logprobs = wrapped(*args, **kwargs)
        if not self.return_sampling_mask:
            return sampled, processed_logprobs
        worst = self.sampling_mask_worst_case
        if worst:   # the profiling run: every row, at the widest
            rows = len(sampled)
            top_k, wanted = np.zeros(rows, np.int64), np.ones(rows, bool)
        else:
            top_k, wanted = self.sampling_mask_top_k, self.sampling_mask_wanted
            if top_k is None or wanted is None or len(wanted) != len(sampled):
                raise MissingSamplingMaskError(
                    "V1 Sampler.sample", "the runner did not hand over the batch's "
                    f"top-k and mask rows for {len(sampled)} rows")
        if processed_logprobs is None:   # an all-greedy batch
            if wanted.any():
                raise MissingSamplingMaskError(
                    "V1 Sampler.sample", "no processed logprobs were computed for a "
                    "batch in which some request wants a mask")
            self._pending_sampling_mask = no_rows(len(sampled), sampled.device)
        else:
            self._pending_sampling_mask = extract_selected(
                processed_logprobs, top_k, wanted,
                max_size=self.sampling_mask_max_size, worst_case=worst)
        return sampled, processed_logprobs

    @wraps(module, "Sampler.forward")
    def forward(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            mask, self._pending_sampling_mask = self._pending_sampling_mask, None
            self.sampling_mask_top_k = self.sampling_mask_wanted = None
            if mask is None:
                raise MissingSamplingMaskError(
                    "V1 Sampler.forward", "Sampler.sample returned without extracting one")
            output.sampling_mask = mask
        return output
