"""On a CPU host, a request without a LoRA adapter batched beside adapter requests
runs the base model, as it does alone.

What it wraps, in vllm/lora/ops/torch_ops/lora_ops.py (the PyTorch LoRA ops
`PunicaWrapperCPU` calls for every LoRA layer), before `torch_ops` and `punica_cpu` bind
the names, with the mask flag on or off, on both runners:

- `bgmv_shrink`, `bgmv_expand`, `bgmv_expand_slice`: rows without an adapter (index -1)
  are left exactly as they were, as the Triton kernels' early exit leaves them.

Why: upstream gathered the last slot's adapter for -1, so a base-model row's logits,
tokens and masks were another model's, depending on its batch.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


# Upstream gathers `lora_b_weights[lora_indices_tensor]`, and -1 is Python's last index.
# Alone, or in a batch of base rows only, a base row was right (the prefill ops skip a
# batch of -1 rows). 0.33's ops clamp the index and zero the -1 rows (vLLM #48421's way).
def _without_base_rows(wrapped, instance, args, kwargs):
    indices = argument(wrapped, args, kwargs, "lora_indices_tensor")
    # a call without -1 rows goes to upstream unchanged

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
