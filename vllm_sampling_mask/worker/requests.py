"""`MaskRequests`: which requests want a mask, per request slot or batch row."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from vllm_sampling_mask.frontend.validation import wants_mask, wants_support_logprobs


class MaskRequests:
    """`wants` and `asked` (support logprobs), one bool per request slot (Model
    Runner V2) or persistent-batch row (the V1 runner): set when a request is
    added, cleared when it is removed, moved with the V1 batch's condense and
    swaps, so a step reads them with one numpy index and no loop over rows.
    `version` counts the changes: a step whose batch has not changed since the
    last one can take that step's plan as it is (`SamplingMaskState.plan`)."""

    def __init__(self, max_num_reqs: int) -> None:
        self.wants = np.zeros(max_num_reqs, dtype=bool)
        self.asked = np.zeros(max_num_reqs, dtype=bool)
        self.version = 0

    def add(self, slot: int, sampling_params) -> None:
        """Record the input processor's decision (`validation.wants_mask`)."""
        self.wants[slot] = sampling_params is not None and wants_mask(sampling_params)
        self.asked[slot] = (sampling_params is not None
                            and wants_support_logprobs(sampling_params))
        self.version += 1

    def remove(self, slot: int) -> None:
        self.wants[slot] = False
        self.asked[slot] = False
        self.version += 1

    def apply_batch_update(self, added: Iterable, removed: Iterable[int],
                           moved: Iterable[tuple[int, int, bool]]) -> None:
        """Follow a persistent batch's changes, in the order its logits
        processors apply them: `added` (slot, sampling params, ...), `removed`
        slots, then `moved` (from, to, swap): a swap exchanges two rows, a move
        copies `from` into `to` (condense)."""
        for slot, params, *_ in added:
            self.add(slot, params)
        for slot in removed:
            self.remove(slot)
        for a, b, swap in moved:
            self.version += 1
            for flags in (self.wants, self.asked):
                if swap:
                    flags[[a, b]] = flags[[b, a]]
                else:
                    flags[b] = flags[a]
