"""How much of the trainer's full softmax lies outside each token's sampling support.

For a token sampled from support ``S_t`` at temperature ``temp``, with the trainer's
logits ``z = logits[t] / temp`` at its current weights::

    mass_outside_t = 1 - sum_{v in S_t} softmax(z)[v]
                   = -expm1(logsumexp_{v in S_t} log_softmax(z)[v])

It is 0 when the support holds all of the trainer's probability and grows as the
trainer's full softmax puts mass on ids the engine could not draw (the truncation's
tail). It is what a full-softmax policy gradient pushes against that the sampler never
shows; ``log(1 - mass_outside_t)`` is the per-token term of TRL's default importance
correction (at equal weights).

:func:`support_coverage` computes it, with the support sizes and optionally the full
softmax's entropy, without gradient, ``chunk_rows`` rows of ``[rows, V]`` logits at a
time (from logits, or from hidden states and the LM head). With the entropy asked for,
it is the entropy pass a trainer already runs (logits, ``log_softmax``, ``exp``, product)
plus, per chunk, a gather of the support's log-probabilities and a segmented
log-sum-exp over them: ``O(N_chunk)`` more operations and bytes, no other ``[rows, V]``
tensor.

A token with an empty support (no mask: the engine did not truncate, or the token was
not sampled) has ``mass_outside`` 0 and size 0; average over ``sizes > 0``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .inputs import (MaskLike, Temperature, check_offsets, mask_to_tensors,
                     temperature_tensor)
from .segments import segment_ids, segment_logsumexp

__all__ = ["Coverage", "support_coverage"]


class Coverage(NamedTuple):
    """Per-token figures of :func:`support_coverage` (all ``[T]``, no gradient).

    Attributes:
        mass_outside: float32 (float64 for float64 inputs), the full softmax's
            probability outside the support; 0 where the support is empty.
        sizes: int64, the support sizes ``|S_t|``.
        entropy: the full temperature-scaled softmax's entropy, or None when not
            asked for.
    """

    mass_outside: torch.Tensor
    sizes: torch.Tensor
    entropy: Optional[torch.Tensor]

    def totals(self, where: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[mass outside, support size, tokens]`` summed over the tokens with a
        support (and, given ``where``, a boolean of the figures' shape, only where it
        is set): one float64 ``[3]`` tensor on their device, so that one ``.tolist()``
        reads all three back. Divide the first two by the third for the means."""
        has = self.sizes > 0
        if where is not None:
            has = has & where.to(has.device).bool()
        return torch.stack([self.mass_outside[has].double().sum(),
                            self.sizes[has].double().sum(), has.sum().double()])


@torch.no_grad()
def support_coverage(logits_or_hidden: torch.Tensor, mask: MaskLike,
                     temperature: Temperature = 1.0, *,
                     lm_head_weight: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None,
                     entropy: bool = False, chunk_rows: int = 256,
                     validate: bool = True) -> Coverage:
    """The full softmax's mass outside each token's support, and the support sizes.

    Args:
        logits_or_hidden: ``[T, V]`` logits, or ``[T, H]`` last hidden states when
            ``lm_head_weight`` is given.
        mask: the T supports, packed (a ``SamplingMask`` or ``(ids, offsets)``;
            several completions: ``pack_masks``).
        temperature: the sampler's temperature, a number or ``[T]``.
        lm_head_weight: ``[V, H]`` output projection (then logits are formed
            ``chunk_rows`` rows at a time; no ``[T, V]`` tensor).
        bias: optional ``[V]`` output bias (with ``lm_head_weight``).
        entropy: also return the full softmax's entropy per token.
        chunk_rows: rows of ``[rows, V]`` logits formed at once.
        validate: check the mask's offsets and ids (two host syncs); False for a
            mask the caller has checked already.

    Returns:
        :class:`Coverage`.
    """
    x = logits_or_hidden
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError("logits_or_hidden must be a floating [T, V] (logits) or [T, H] "
                         "(hidden states, with lm_head_weight) tensor")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer (got {chunk_rows})")
    T = x.shape[0]
    if lm_head_weight is not None:
        if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != x.shape[1]:
            raise ValueError(f"lm_head_weight must be [V, H] with H = {x.shape[1]} "
                             f"(got {tuple(lm_head_weight.shape)})")
        V = lm_head_weight.shape[0]
        if bias is not None and tuple(bias.shape) != (V,):
            raise ValueError(f"bias must be [V]=[{V}] (got {tuple(bias.shape)})")
    elif bias is not None:
        raise ValueError("bias is only used with lm_head_weight (hidden states)")
    else:
        V = x.shape[1]
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    device = x.device
    ids, offsets = mask_to_tensors(mask, device)
    if offsets.numel() != T + 1:
        raise ValueError(f"the mask has {offsets.numel() - 1} supports for {T} rows; "
                         "give one support per row")
    N = ids.numel()
    if validate:
        check_offsets(offsets, T, N, allow_empty=True)
        if N:
            low, high = torch.stack(torch.aminmax(ids)).tolist()
            if low < 0 or high >= V:
                raise ValueError(f"mask ids must lie in [0, {V}) (the vocabulary)")
    temp = temperature_tensor(temperature, T, device, cdt, True)
    sizes = offsets.diff()
    seg = segment_ids(offsets, T, N)
    mass = torch.zeros(T, dtype=cdt, device=device)
    ent = torch.zeros(T, dtype=cdt, device=device) if entropy else None
    if lm_head_weight is not None:
        w = lm_head_weight.to(cdt)
        b = bias.to(cdt) if bias is not None else None
    starts = list(range(0, T, chunk_rows))
    bounds = offsets[starts + [T]].tolist()     # each chunk's span of ids: one sync
    for i, a in enumerate(starts):
        e_ = min(T, a + chunk_rows)
        if lm_head_weight is not None:
            z = torch.nn.functional.linear(x[a:e_].to(cdt), w, b).div_(temp[a:e_, None])
        else:
            z = x[a:e_].to(cdt) / temp[a:e_, None]
        logp = torch.log_softmax(z, dim=-1)
        del z
        if entropy:
            ent[a:e_] = -(logp.exp() * logp).sum(dim=-1)
        k0, k1 = bounds[i], bounds[i + 1]
        if k1 > k0:
            rows = seg[k0:k1] - a
            # log of the mass inside: a log-sum-exp of the support's log-probabilities
            inside, _, _ = segment_logsumexp(logp[rows, ids[k0:k1]], rows, e_ - a)
            outside = -torch.expm1(inside.clamp(max=0.0))
            mass[a:e_] = torch.where(sizes[a:e_] > 0, outside, torch.zeros_like(outside))
    return Coverage(mass_outside=mass, sizes=sizes, entropy=ent)
