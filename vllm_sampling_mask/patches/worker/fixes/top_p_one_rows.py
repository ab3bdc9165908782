"""A row with top_p = 1 keeps its whole distribution, whatever its batch holds.

What it wraps, in vllm/v1/sample/ops/topk_topp_sampler.py, with the mask flag on or off:

- `apply_top_k_top_p_pytorch`: rows whose top_p is 1 (or more) enter upstream's top-p
  step with p = 2, which cuts nothing; rows with top_p < 1 are untouched.

Why: upstream's top-p cut a top_p = 1 row's zero-probability ids once any row had
top_p < 1, so the row's mask depended on its batch.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release

# Any p > 1 makes `1 - p` negative, below every cumulative probability.
NO_CUT = 2.0


def apply(module, release: Release) -> None:
    import torch

    # Upstream runs top-p on every row once any row has top_p < 1, and `cumsum <= 1 - 1.0`
    # cuts ids whose float32 probability is exactly 0 (low temperatures, large logit
    # gaps): the same seeded request returned 50 ids alone and 20 beside a top_p = 0.5
    # request (tests/http/test_fuzz.py). The PyTorch path runs on CPU hosts and, on
    # CUDA, for batches of fewer than 8 rows; the Triton kernel skips rows with p >= 1.
    @wraps(module, "apply_top_k_top_p_pytorch")
    def apply_top_k_top_p_pytorch(wrapped, _, args, kwargs):
        # one elementwise `torch.where` on the device, no host sync

        if argument(wrapped, args, kwargs, "p") is not None:
            args, kwargs = with_argument(
                wrapped, args, kwargs, "p",
                lambda p: torch.where(p >= 1, torch.full_like(p, NO_CUT), p))
        return wrapped(*args, **kwargs)
