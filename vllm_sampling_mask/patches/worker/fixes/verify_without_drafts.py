"""A verify step in which no request has a draft token leaves the logits alone.

What it wraps, in vllm/v1/sample/rejection_sampler.py, with the mask flag on or off:

- `apply_sampling_constraints`: draft logits with no row are returned as they are.

Why: upstream's CPU top-k took `k.max()` of an empty tensor and killed the engine on
the first step that verified no draft token.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    @wraps(module, "apply_sampling_constraints")
    def apply_sampling_constraints(wrapped, _, args, kwargs):
        logits = argument(wrapped, args, kwargs, "logits")
        # an n-gram proposer that found no match for any request of the batch (seen on
        # the V1 CPU runner with `ngram` and `draft_model`): "max(): Expected reduction
        # dim to be specified for input.numel() == 0", EngineDeadError
        if logits.shape[0] == 0:
            return logits

        return wrapped(*args, **kwargs)
