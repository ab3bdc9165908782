"""The logits op: ``nucleus_logprobs`` (and its untruncated ``full_logprobs``).

``nucleus_logprobs(logits, token_ids, mask, temperature=1.0)`` works from
``[T, V]`` logits.  The kept logits are *gathered* with one flat index
``row * V + id`` (N values), reduced per support by a segmented log-sum-exp
(segment max with ``scatter_reduce(amax)``, then ``exp`` and a segment sum
with ``index_add``).  Extra memory is O(N + T): there is no ``[T, V]`` boolean
mask and no second ``[T, V]`` float tensor, in the forward or the backward.
The backward (hand-written, a custom ``autograd.Function``) allocates the one
dense ``[T, V]`` gradient that autograd needs for ``logits`` itself and fills
it with one ``index_add`` of N values and one ``index_put`` of T (the sampled
tokens, so that a bf16 gradient is rounded once).  Work: O(N + T log N) plus
the zero-fill of that gradient.

``full_logprobs(logits, token_ids, temperature=1.0)`` is the untruncated
counterpart ``z_t[a_t] - logsumexp_v z_t[v]`` (dense, O(T * V) memory, plain
autograd).
"""

from __future__ import annotations

import torch

from .inputs import (
    MaskLike,
    Temperature,
    compute_dtype,
    first_true,
    prepare,
    temperature_tensor,
    token_tensor,
)
from .segments import flat_index, flat_view, segment_logsumexp

__all__ = ["full_logprobs", "full_rows", "nucleus_logprobs"]


def full_rows(out: torch.Tensor, rows: torch.Tensor, z: torch.Tensor,
              tok: torch.Tensor) -> torch.Tensor:
    """``out`` with positions ``rows`` replaced by the full softmax's log-probability
    of their sampled token, from their tempered logits ``z`` (``[E, V]``, the
    compute dtype).  Out of place: the gradient reaching ``out`` at those positions
    is zero, and theirs flows through ``z``."""
    full = z.gather(1, tok[rows, None]).squeeze(1) - torch.logsumexp(z, dim=1)
    return out.index_put((rows,), full)


class _NucleusFromLogits(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, seg, ids, key, tok, temp, temp_scalar):
        T, V = logits.shape
        cdt = temp.dtype
        if key is None:
            key = seg * V + ids
        flat_logits = flat_view(logits)
        rows = torch.arange(T, device=logits.device)
        tkey = rows * V + tok
        if logits.is_contiguous():
            idx, tidx = key, tkey
        else:
            idx = flat_index(logits, seg, ids)
            tidx = flat_index(logits, rows, tok)
        kept = flat_logits.index_select(0, idx).to(cdt)
        if temp_scalar is not None:
            kept = kept.div_(temp_scalar)
        else:
            kept = kept.div_(temp[seg])
        target = flat_logits.index_select(0, tidx).to(cdt) / temp
        lse, e, s = segment_logsumexp(kept, seg, T)
        ctx.save_for_backward(seg, key, tkey, temp, e, s)
        ctx.logits_meta = (T, V, logits.dtype, logits.device)
        return target - lse

    @staticmethod
    def backward(ctx, grad_out):
        seg, key, tkey, temp, e, s = ctx.saved_tensors
        T, V, dtype, device = ctx.logits_meta
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None, None
        g = grad_out.to(temp.dtype) / temp                      # d out / d z, per row
        pg = (e / s[seg]).mul_(g[seg])                          # p * g on every kept id
        # The sampled token: +g, minus p*g for each entry equal to it.  Its
        # entries get 0 in the index_add and the element is then set to
        # g * (1 - q_t) in one go (q_t: its total p; 0 if absent), so a bf16
        # gradient is rounded once and duplicate / absent tokens stay exact.
        hit = key == tkey[seg]
        gq = torch.zeros(T, dtype=pg.dtype, device=device).index_add_(
            0, seg, torch.where(hit, pg, 0.0))
        coef = torch.where(hit, 0.0, pg.neg_())
        grad = torch.zeros((T, V), dtype=dtype, device=device)
        flat = grad.view(-1)
        flat.index_add_(0, key, coef.to(dtype))
        flat.index_put_((tkey,), (g - gq).to(dtype))
        return grad, None, None, None, None, None, None


def nucleus_logprobs(logits: torch.Tensor, token_ids, mask: MaskLike,
                     temperature: Temperature = 1.0, *, validate: bool = True,
                     empty_support: str = "error") -> torch.Tensor:
    """Log-probability of each sampled token under its sampling support.

    ``out[t] = logits[t, a_t] / temp_t - logsumexp(logits[t, S_t] / temp_t)``

    Args:
        logits: ``[T, V]`` floating tensor (any dtype, any device, any
            strides): the trainer's raw logits at the positions that produced
            the T generated tokens (sequences may be packed along T).
        token_ids: ``[T]`` integer tensor of the sampled tokens ``a_t``.
        mask: a ``SamplingMask`` or a pair ``(ids, offsets)`` (ids int32/int64
            ``[N]``, offsets int64 ``[T + 1]``); support t is
            ``ids[offsets[t]:offsets[t + 1]]``.
        temperature: a float or a ``[T]`` tensor; logits are divided by it
            before normalising, as the sampler did.  No gradient flows to it.
        validate: check the inputs (vectorised, at most two host syncs);
            ``False`` in the hot loop once the data pipeline is trusted.
        empty_support: what an empty support means.  ``"error"`` (the
            default): a ``ValueError`` naming the token.  ``"full"``: the token
            has no mask (a token the engine did not sample, such as tool output,
            or one whose mask was dropped), so its log-probability is taken
            over the full softmax, as prime-rl, verifiers and SkyRL read an
            empty row.  Costs one host sync, and a dense ``[E, V]`` block for
            the E such tokens.

    Returns:
        ``[T]`` float32 tensor (float64 for float64 logits), differentiable
        with respect to ``logits``; the gradient is non-zero only on the ids
        of each support.

    Raises:
        ValueError: on bad input, naming the offending token position.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a [T, V] tensor (got "
                         f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__})")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a floating tensor (got {logits.dtype})")
    T, V = logits.shape
    cdt = compute_dtype(logits)
    pr = prepare(T, V, token_ids, mask, temperature, logits.device, cdt, validate,
                 empty_support)
    out = _NucleusFromLogits.apply(logits, pr.seg, pr.ids, pr.key, pr.tok, pr.temp,
                                   pr.temp_scalar)
    if pr.unmasked is None:
        return out
    rows = pr.unmasked
    return full_rows(out, rows, logits.index_select(0, rows).to(cdt) / pr.temp[rows, None],
                     pr.tok)


def full_logprobs(logits: torch.Tensor, token_ids, temperature: Temperature = 1.0, *,
                  validate: bool = True) -> torch.Tensor:
    """Log-probability of each sampled token under the full softmax.

    ``out[t] = logits[t, a_t] / temp_t - logsumexp(logits[t, :] / temp_t)``:
    the untruncated counterpart of :func:`nucleus_logprobs` (for tokens sampled
    without top-k / top-p, or to measure what the truncation changes).
    Dense: O(T * V) memory in float32.  Returns ``[T]`` float32 (float64 for
    float64 logits), differentiable with respect to ``logits``.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a [T, V] tensor")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a floating tensor (got {logits.dtype})")
    T, V = logits.shape
    cdt = compute_dtype(logits)
    tok = token_tensor(token_ids, T, logits.device)
    temp = temperature_tensor(temperature, T, logits.device, cdt, validate)
    if validate and T:
        t_tok, t_temp = torch.stack([
            first_true((tok < 0) | (tok >= V)),
            first_true(~((temp > 0) & torch.isfinite(temp)))]).tolist()
        if t_temp >= 0:
            raise ValueError("temperature must be positive and finite: "
                             f"temperature[{t_temp}]={float(temp[t_temp])} at token t={t_temp}")
        if t_tok >= 0:
            raise ValueError(f"sampled token {int(tok[t_tok])} at token t={t_tok} is "
                             f"outside the vocabulary [0, {V})")
    z = logits.to(cdt) / temp[:, None]
    return z.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(z, dim=1)
