"""`CompletionOutput.sampling_mask`, and merging it when outputs are aggregated.

What: in `vllm/outputs.py`, adds the dataclass field
    `sampling_mask: SamplingMask | None = None` to `CompletionOutput`, exports
    `SamplingMask` from `vllm.outputs`, and wraps `RequestOutput.add` so that
    aggregating DELTA outputs (a consumer that fell behind) joins their masks
    exactly as upstream joins their `token_ids`.
Why: the completion is what users read; a real field keeps `replace` and
    the constructor working. None when the engine flag is off.
Remove when: upstream has the field.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.sampling_mask import SamplingMask


def apply(module) -> None:
    add_field(module.CompletionOutput, "sampling_mask", SamplingMask | None, None)
    module.SamplingMask = SamplingMask

    RequestOutput = module.RequestOutput
    original_add = RequestOutput.add

    @functools.wraps(original_add)
    def add(self, next_output, aggregate):
        if not aggregate:
            return original_add(self, next_output, aggregate)
        before = {c.index: c.sampling_mask if c.sampling_mask is not None or c.token_ids
                  else SamplingMask.from_lists([]) for c in self.outputs}
        original_add(self, next_output, aggregate)
        for nxt in next_output.outputs:
            old = before.get(nxt.index)
            if old is None or nxt.sampling_mask is None:
                continue
            for completion in self.outputs:
                if completion.index == nxt.index:
                    completion.sampling_mask = SamplingMask.concat([old, nxt.sampling_mask])

    RequestOutput.add = add
