"""A verify step in which no request has a draft token leaves the logits alone.

What: wraps `apply_sampling_constraints` (vllm/v1/sample/rejection_sampler.py):
    when the draft positions' logits have no row, it returns them as they are,
    without running temperature, top-k and top-p over an empty batch. Applies
    with the mask flag on or off.
Why: under speculative decoding a step can verify no draft token at all (an
    n-gram proposer that found no match for any request of the batch), and
    with a request that sets top_k, upstream's top-k on the CPU path takes
    `k.max()` of an empty tensor: "max(): Expected reduction dim to be
    specified for input.numel() == 0", which kills the engine (EngineDeadError)
    on the first such step. Seen on the V1 CPU runner with `ngram` and
    `draft_model`.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    @wraps(module, "apply_sampling_constraints")
    def apply_sampling_constraints(wrapped, _, args, kwargs):
        logits = argument(wrapped, args, kwargs, "logits")
        if logits.shape[0] == 0:
            return logits
        return wrapped(*args, **kwargs)
