"""On a CPU host, a request without a LoRA adapter batched beside adapter requests
runs the base model, as it does alone.

What: wraps `bgmv_shrink`, `bgmv_expand` and `bgmv_expand_slice`
    (vllm/lora/ops/torch_ops/lora_ops.py), the PyTorch LoRA ops that
    `PunicaWrapperCPU` calls for every LoRA layer (its `sgmv_*` prefill ops call
    them too). Rows whose adapter index is -1 (no adapter) are left exactly as
    they were, the way the Triton kernels' early exit leaves them; a call whose
    rows all have -1 changes nothing; a call without -1 goes to upstream
    unchanged. Applied before `vllm.lora.ops.torch_ops` and `punica_cpu` bind the
    names. Applies with the mask flag on or off, on both runners.
Why: upstream gathers `lora_b_weights[lora_indices_tensor]`, and -1 is Python's
    last index: a base-model row of a batch that holds adapter rows gets the delta
    of the adapter in the last slot. Its logits, tokens and masks are then another
    model's (a trainer replaying the base model disagrees at every token), and the
    row's output depends on what it is batched with. Alone, or in a batch of
    base rows only, it was right (the prefill ops skip a batch of -1 rows).
Upstream issue: vLLM #48421 and #49656 ("Skip no-LoRA tokens (index -1) in CPU torch
    bgmv ops", "Fix LoRA no-op row aliasing in PunicaWrapperCPU"). Every supported
    release (0.24.0-0.32.0) has the same ops; 0.33.0's clamp the index and zero the
    -1 rows (#48421's way), so the seam report flags the gather as changed there.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def _without_base_rows(wrapped, instance, args, kwargs):
    indices = argument(wrapped, args, kwargs, "lora_indices_tensor")
    base = indices < 0
    if not bool(base.any()):
        return wrapped(*args, **kwargs)
    if bool(base.all()):
        return None                               # no row has an adapter: nothing to add
    output = argument(wrapped, args, kwargs, "output_tensor")
    rows = min(len(base), output.shape[0])
    base = base[:rows]
    kept = output[:rows][base].clone()
    args, kwargs = with_argument(wrapped, args, kwargs, "lora_indices_tensor",
                                 lambda i: i.clamp(min=0))
    result = wrapped(*args, **kwargs)
    output[:rows][base] = kept                   # the base rows as they were
    return result


def apply(module, release: Release) -> None:
    for name in OPS:
        wraps(module, name)(_without_base_rows)
