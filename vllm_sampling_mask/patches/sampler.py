"""Extract the sampling mask in Model Runner V2's sampler.

What: in `vllm/v1/worker/gpu/sample/sampler.py`, declares on `Sampler`
    `return_sampling_mask`, `sampling_mask_max_size`, `sampling_mask_rows`
    (per request slot: does that request want a mask) and
    `sampling_mask_worst_case` (the `runner` patch sets them where upstream
    builds the sampler, and around the memory-profiling run), the dataclass
    field `SamplerOutput.sampling_mask` (None), and wraps `Sampler.add_request`
    (records the request's decision, `validation.wants_mask`), `Sampler.sample`
    and `Sampler.__call__`. With the flag on, `sample` compacts the support of
    the logits it sampled from (after every processor and top-k/top-p/min-p)
    for the rows that want a mask with `extraction.extract_support`, sized from
    their host-side top-k (no device sync), and `__call__` puts it on the
    `SamplerOutput` it returns (a mask of no rows when none wants one). (The `runner` patch also turns the
    FlashInfer sampler off, which never materialises the processed logits.)
Why: the sampler is the only place where the exact support exists.
Remove when: upstream returns the support from its sampler (vLLM #49577,
    in 0.28, with GPU compaction in #54901).
"""

from __future__ import annotations

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import DeviceMask, extract_selected
from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE, wants_mask


def apply(module) -> None:
    Sampler = module.Sampler
    Sampler.return_sampling_mask = False
    Sampler.sampling_mask_max_size = DEFAULT_MAX_SIZE
    Sampler.sampling_mask_rows = None       # bool per request slot, set by `runner`
    Sampler.sampling_mask_worst_case = False
    Sampler._pending_sampling_mask = None  # from `sample` to `__call__`, same step
    add_field(module.SamplerOutput, "sampling_mask", DeviceMask | None, None)

    @wraps(module, "Sampler.add_request")
    def add_request(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            req_idx = args[0] if args else kwargs["req_idx"]
            params = args[2] if len(args) > 2 else kwargs["sampling_params"]
            self.sampling_mask_rows[req_idx] = wants_mask(params)

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        sampled, processed_logits = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            idx_mapping_np = _arg(args, kwargs, 2, "idx_mapping_np")
            self._pending_sampling_mask = extract_selected(
                processed_logits, self.sampling_states.top_k.np[idx_mapping_np],
                self.sampling_mask_rows[idx_mapping_np],
                max_size=self.sampling_mask_max_size,
                worst_case=self.sampling_mask_worst_case)
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
