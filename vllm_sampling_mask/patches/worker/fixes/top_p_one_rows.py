"""A row with top_p = 1 keeps its whole distribution, whatever its batch holds.

What: wraps `apply_top_k_top_p_pytorch` (vllm/v1/sample/ops/topk_topp_sampler.py)
    so that rows whose top_p is 1 (or more) enter upstream's top-p step with
    p = 2: its cut `cumsum <= 1 - p` is then false on every id of those rows.
    Rows with top_p < 1 are untouched. One elementwise `torch.where` on the
    device, no host sync. Applies with the mask flag on or off.
Why: upstream runs top-p on every row once any row of the batch has
    top_p < 1, and `cumsum <= 1 - 1.0` then cuts a top_p = 1 row's ids whose
    float32 probability is exactly 0 (low temperatures, large logit gaps). The
    draw is the same (those ids cannot be drawn), but the support, and so the
    sampling mask and the processed logprobs, depended on the other requests in
    the batch: the same seeded request returned 50 ids alone and 20 beside a
    top_p = 0.5 request (found by tests/http/test_fuzz.py). The PyTorch path runs
    on CPU hosts and, on CUDA, for batches of fewer than 8 rows; vLLM's Triton
    kernel already skips top-p on rows with p >= 1.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release

# Any p > 1 makes `1 - p` negative, below every cumulative probability.
NO_CUT = 2.0


def apply(module, release: Release) -> None:
    import torch

    @wraps(module, "apply_top_k_top_p_pytorch")
    def apply_top_k_top_p_pytorch(wrapped, _, args, kwargs):
        if argument(wrapped, args, kwargs, "p") is not None:
            args, kwargs = with_argument(
                wrapped, args, kwargs, "p",
                lambda p: torch.where(p >= 1, torch.full_like(p, NO_CUT), p))
        return wrapped(*args, **kwargs)
