"""The V1 rejection sampler's per-request settings reach its draft positions on CPU.

What: wraps `expand_batch_to_tokens` (vllm/v1/sample/rejection_sampler.py), which
    spreads a per-request tensor (temperature, top_k, top_p) over the draft
    positions of a verify step: on a CPU tensor it computes the expansion with
    torch (`repeat_interleave` by the per-request counts, `replace_from` turned
    into `replace_to`), never through the platform's kernel override; on other
    devices upstream runs. Applies with the mask flag on or off.
Why: on the CPU build upstream's override of the expand kernel
    (`cpu_triton_utils._expand_kernel_impl`) converts the output buffer to
    int64 and writes into that converted copy, never back: the expanded
    temperature, top_k and top_p are `new_empty` memory. So at every draft
    position the target distribution the drafts are verified against has an
    arbitrary temperature and top-p, and an arbitrary top_k that makes
    top-k index out of the vocabulary ("index 4096 is out of bounds for
    dimension 1 with size 4096": the engine dies on the first verify step of a
    top_k request). Every release from 0.24 to 0.32 has it. Its sibling
    overrides (greedy, random and recovered sampling) copy their int64 results
    back; this one does not.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    import torch

    @wraps(module, "expand_batch_to_tokens")
    def expand_batch_to_tokens(wrapped, _, args, kwargs):
        x = argument(wrapped, args, kwargs, "x")
        if x.device.type != "cpu":
            return wrapped(*args, **kwargs)
        cu_num_tokens = argument(wrapped, args, kwargs, "cu_num_tokens").to(torch.int64)
        counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
        replace_from = argument(wrapped, args, kwargs, "replace_from")
        replace_to = argument(wrapped, args, kwargs, "replace_to")
        values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
        return torch.repeat_interleave(values, counts,
                                       output_size=argument(wrapped, args, kwargs,
                                                            "num_tokens"))
