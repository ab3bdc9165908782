"""`CompletionOutput.sampling_mask` (`sampling_mask_error`, `sampling_mask_reason`),
merged on aggregation.

What it adds and wraps, in `vllm/outputs.py`:

- `CompletionOutput` fields `sampling_mask`, `sampling_mask_error` (why the mask path
  ended the completion: finish_reason "error") and `sampling_mask_reason` (why a request
  that never asked carries no mask from some token on); all None without a mask;
- `vllm.outputs.SamplingMask`: the overlay's class (on 0.32 in place of upstream's);
- `RequestOutput.add`: aggregating DELTA outputs joins their masks as their `token_ids`.

Why: the completion is what users read; real fields keep `replace` and the constructor
working.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask


def apply(module, release: Release) -> None:
    add_field(module.CompletionOutput, "sampling_mask", SamplingMask | None, None)
    add_field(module.CompletionOutput, "sampling_mask_error", str | None, None)
    add_field(module.CompletionOutput, "sampling_mask_reason", str | None, None)
    # It takes upstream's constructor (`SamplingMask(token_ids)`) and reads `.token_ids`
    # alike, so code written for upstream's keeps working.
    module.SamplingMask = SamplingMask

    # A consumer that fell behind aggregates DELTA outputs. 0.32's own merge extends a
    # list our `.token_ids` builds afresh, so this join is what counts there too.
    @wraps(module, "RequestOutput.add")
    def add(wrapped, self, args, kwargs):

        next_output = argument(wrapped, args, kwargs, "next_output")
        aggregate = argument(wrapped, args, kwargs, "aggregate")
        if not aggregate:
            return wrapped(*args, **kwargs)
        before = {c.index: c.sampling_mask if c.sampling_mask is not None or c.token_ids
                  else SamplingMask.from_lists([]) for c in self.outputs}
        wrapped(*args, **kwargs)
        merged = {c.index: c for c in self.outputs}
        for nxt in next_output.outputs:
            completion, old = merged[nxt.index], before.get(nxt.index)
            if nxt.sampling_mask_error is not None:
                completion.sampling_mask_error = nxt.sampling_mask_error
            if nxt.sampling_mask_reason is not None or completion.sampling_mask_reason:
                # the mask stopped in one of the joined outputs: none for the whole
                completion.sampling_mask_reason = (completion.sampling_mask_reason
                                                   or nxt.sampling_mask_reason)
                completion.sampling_mask = None
            elif old is not None and nxt.sampling_mask is not None:
                completion.sampling_mask = SamplingMask.concat([old, nxt.sampling_mask])
