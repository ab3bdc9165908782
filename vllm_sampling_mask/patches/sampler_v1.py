"""Extract the sampling mask in the V1 model runner's sampler.

What: in `vllm/v1/sample/sampler.py`, declares on `Sampler`
    `return_sampling_mask` (False; `runner_v1` sets it where upstream builds
    the sampler), `sampling_mask_top_k` (the batch's per-row top-k on the host,
    set by `runner_v1` before each call) and `sampling_mask_worst_case` (the
    memory-profiling run), and wraps `Sampler.sample` and `Sampler.forward`.
    With the flag on, `sample` compacts the support of the processed
    logprobs it returns (`log_softmax` of the logits it sampled from, after
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
from vllm_sampling_mask.extraction import extract_support, plan_layout
from vllm_sampling_mask.patches._wrap import wraps


def apply(module) -> None:
    Sampler = module.Sampler
    Sampler.return_sampling_mask = False
    Sampler.sampling_mask_top_k = None
    Sampler.sampling_mask_worst_case = False
    Sampler._pending_sampling_mask = None  # from `sample` to `forward`, same step

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        sampled, processed_logprobs = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            if processed_logprobs is None:
                raise MissingSamplingMaskError(
                    "V1 Sampler.sample", "no processed logprobs were computed "
                    "(an all-greedy batch, or a logprobs mode other than processed)")
            rows, vocab = processed_logprobs.shape
            if self.sampling_mask_worst_case:
                layout = plan_layout(np.full(rows, vocab), vocab, worst_case=True)
            else:
                top_k = self.sampling_mask_top_k
                if top_k is None or len(top_k) != rows:
                    raise MissingSamplingMaskError(
                        "V1 Sampler.sample", "the runner did not hand over the "
                        f"batch's top-k for {rows} rows")
                layout = plan_layout(top_k, vocab)
            self._pending_sampling_mask = extract_support(processed_logprobs, layout)
        return sampled, processed_logprobs

    @wraps(module, "Sampler.forward")
    def forward(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            mask, self._pending_sampling_mask = self._pending_sampling_mask, None
            self.sampling_mask_top_k = None
            if mask is None:
                raise MissingSamplingMaskError(
                    "V1 Sampler.forward", "Sampler.sample returned without extracting one")
            output.sampling_mask = mask
        return output
