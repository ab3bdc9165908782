"""The V1 rejection sampler's per-request settings reach its draft positions on CPU.

What it wraps, in vllm/v1/sample/rejection_sampler.py, with the mask flag on or off:

- `expand_batch_to_tokens` (spreads temperature, top_k, top_p over a verify step's draft
  positions): on a CPU tensor, computed with torch; on other devices upstream's.

Why: on CPU upstream's expansion left `new_empty` memory, so drafts were verified
against arbitrary settings, and an arbitrary top_k killed the engine.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    import torch

    @wraps(module, "expand_batch_to_tokens")
    def expand_batch_to_tokens(wrapped, _, args, kwargs):
        x = argument(wrapped, args, kwargs, "x")
        # The CPU build's override (`cpu_triton_utils._expand_kernel_impl`) converts the
        # output buffer to int64 and writes into that copy, never back (its greedy,
        # random and recovered siblings copy back): "index 4096 is out of bounds for
        # dimension 1 with size 4096" on the first verify step of a top_k request
        # (0.24 to 0.32). Never through the platform's kernel override here.
        if x.device.type != "cpu":
            return wrapped(*args, **kwargs)
        cu_num_tokens = argument(wrapped, args, kwargs, "cu_num_tokens").to(torch.int64)
        counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
        replace_from = argument(wrapped, args, kwargs, "replace_from")
        replace_to = argument(wrapped, args, kwargs, "replace_to")
        # `replace_from` turned into `replace_to`, then repeated by the per-request counts
        values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)

        return torch.repeat_interleave(values, counts,
                                       output_size=argument(wrapped, args, kwargs,
                                                            "num_tokens"))
