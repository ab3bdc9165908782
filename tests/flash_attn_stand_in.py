"""A test-only stand-in of flash-attn's pure tensor functions, for importing OpenRLHF.

OpenRLHF's `openrlhf.models.ring_attn_utils` (imported by its `Actor`, `PolicyLoss`'s
package and its trainer actors) imports `flash_attn.bert_padding` (`index_first_axis`,
`pad_input`, `unpad_input`, `rearrange`) and `flash_attn.utils.distributed.all_gather`
at module top, for packed samples; flash-attn does not build without CUDA. `install()`
puts modules with those functions (written here) in `sys.modules` where flash-attn is
not installed, and nothing else of flash-attn: `flash_attn.ops` stays missing, so
OpenRLHF's `log_probs_from_logits` takes its plain-torch branch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types


def install() -> None:
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        return
    import einops
    import torch

    def unpad_input(hidden, attention_mask, *unused):
        lengths = attention_mask.sum(dim=-1, dtype=torch.int32)
        indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
        cu = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
        flat = hidden.reshape(-1, *hidden.shape[2:])
        return flat[indices], indices, cu, int(lengths.max()), lengths

    def index_first_axis(x, indices):
        return x[indices]

    def pad_input(hidden, indices, batch, seqlen):
        out = hidden.new_zeros(batch * seqlen, *hidden.shape[1:])
        out[indices] = hidden
        return out.view(batch, seqlen, *hidden.shape[1:])

    def all_gather(x, group):
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts)

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    module("flash_attn")
    module("flash_attn.bert_padding", unpad_input=unpad_input, pad_input=pad_input,
           index_first_axis=index_first_axis, rearrange=einops.rearrange)
    module("flash_attn.utils")
    module("flash_attn.utils.distributed", all_gather=all_gather)
