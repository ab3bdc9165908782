"""Trainer-side log-probabilities under a sampling mask.

When the engine samples token ``a_t`` with top-k / top-p / min-p, it draws from
the renormalised distribution over the *support* ``S_t`` (the ids that survived
the truncation), not from the full softmax.  The sampling mask records ``S_t``
for every generated token; this module recomputes, on the trainer's own logits,
the log-probability of the action under that same distribution::

    z_t        = logits[t] / temp_t                      (temperature first,
                                                          as the sampler did)
    log pi_t   = z_t[a_t] - logsumexp_{v in S_t} z_t[v]

and its gradient::

    d log pi_t / d logits[t, v] = (1[v == a_t] - p_t(v)) / temp_t    for v in S_t
                                = 0                                  otherwise

with ``p_t(v) = softmax(z_t restricted to S_t)[v]``.  Ids outside the support
get exactly zero gradient, which is the point: the policy gradient is taken
with respect to the distribution the rollout actually used.

Packed mask layout (shared with :class:`~vllm_sampling_mask.sampling_mask.SamplingMask`)::

    ids      [N]      every support concatenated, N = sum_t |S_t|
    offsets  [T + 1]  offsets[0] == 0, offsets[-1] == N, non-decreasing;
                      support t is ids[offsets[t]:offsets[t + 1]]

Several sequences can be packed along ``T``: concatenate their logits rows,
their token ids and their masks (``pack_masks``, i.e. ``SamplingMask.concat``).

Entry points
------------
``nucleus_logprobs(logits, token_ids, mask, temperature=1.0)``
    From ``[T, V]`` logits.  The kept logits are *gathered* with one flat
    index ``row * V + id`` (N values), reduced per support by a segmented
    log-sum-exp (segment max with ``scatter_reduce(amax)``, then ``exp`` and a
    segment sum with ``index_add``).  Extra memory is O(N + T): there is no
    ``[T, V]`` boolean mask and no second ``[T, V]`` float tensor, in the
    forward or the backward.  The backward (hand-written, a custom
    ``autograd.Function``) allocates the one dense ``[T, V]`` gradient that
    autograd needs for ``logits`` itself and fills it with one ``index_add``
    of N values and one ``index_put`` of T (the sampled tokens, so that a
    bf16 gradient is rounded once).  Work: O(N + T log N) plus the zero-fill
    of that gradient.

``nucleus_logprobs_from_hidden(hidden, lm_head_weight, token_ids, mask, ...)``
    From the last hidden states ``[T, H]`` and the LM head ``[V, H]``
    (optional bias ``[V]``).  Since ``log pi`` needs logits only on ``S_t``,
    only those N logits (plus the T sampled ones) are computed: a sampled
    dense-dense product (SDDMM, ``z_k = W[id_k] . h[t_k]``, O((N + T) * H)
    work) instead of the ``[T, V]`` matmul (O(T * V * H)).  The pairs are
    processed in vocabulary-id order, so each weight row is read once and
    contiguously however many supports contain it (on CPU through
    ``torch.sparse.sampled_addmm`` on a CSR pattern; elsewhere by gathering
    weight rows in chunks of at most ``chunk_size``).  The weight is used in
    place when it is already in the compute dtype; otherwise (bf16 / fp16)
    it is converted block by block, ``chunk_size`` vocabulary rows at a
    time (default: 256 MiB of float32), so the working set stays bounded.
    The backward is hand-written too: ``grad_hidden`` is an
    ``embedding_bag`` of weight rows per token weighted by the coefficients
    ``(1[v == a_t] - p_t(v)) * g_t / temp_t``, ``grad_weight`` an
    ``embedding_bag`` of hidden rows per vocabulary id written block by block
    into the one ``[V, H]`` buffer the weight gradient needs, ``grad_bias`` an
    ``index_add``.  No ``[T, V]`` tensor exists at any point; memory beyond
    the inputs and their gradients is O(N + T * H + chunk_size * H).

``full_logprobs(logits, token_ids, temperature=1.0)``
    The untruncated counterpart ``z_t[a_t] - logsumexp_v z_t[v]`` (dense,
    O(T * V) memory, plain autograd).

``importance_ratio(new_logprobs, old_logprobs, clip=None)``
    ``exp(new - old)`` with the old log-probabilities treated as constants,
    optionally clamped.

``ratio_statistics(new_logprobs, old_logprobs, support_sizes=None, band=(0.9, 1.1))``
    Summary of the trainer/engine mismatch as a plain dict of Python numbers
    (k3 KL estimate, ratio mean and percentiles, share outside a band,
    support-size figures): for logs and replay checks, no gradient.

Precision: everything is computed in float32 (float64 when an input is
float64), whatever the input dtype; the result is float32 (float64 for float64
inputs).  Gradients are accumulated in that precision and cast once to the
input dtype.

Validation (``validate=True``, the default) checks every bad input below and
raises ``ValueError`` naming the token position ``t``:

* length mismatches between logits / hidden, token_ids and the mask;
* offsets not starting at 0, decreasing, or not ending at ``len(ids)``;
* an empty support; an id outside ``[0, V)``; an id listed twice in a support;
* a sampled token outside ``[0, V)`` or not inside its support;
* a non-positive (or NaN / infinite) temperature.

It is vectorised: at most two device-to-host synchronisations per call (three
when a support is not in ascending order and has to be checked for duplicate
ids), never one per token.  ``validate=False`` skips it for the hot loop; the
result on invalid input is then unspecified (a sampled token outside its
support just gives the formula's value, which can be positive).

Synchronisations with ``validate=False``: none for ``nucleus_logprobs``; none
for ``nucleus_logprobs_from_hidden`` when the weight is processed as one block
(a float32 weight on CPU), one (the block boundaries) otherwise.

``torch.compile``: ``nucleus_logprobs`` compiles; with ``validate=False`` it
is a single graph with no break (the custom ``autograd.Function`` is traced
by Dynamo, forward and backward).  Validation reads a few values on the host,
so with ``validate=True`` Dynamo splits the graph there (it still compiles
and gives the same results).  ``full_logprobs`` compiles.
``nucleus_logprobs_from_hidden`` works under ``torch.compile`` but not as one
graph: Dynamo does not support creating sparse tensors (the CPU SDDMM) and
the block loop depends on data, so those parts run eagerly between graph
breaks.  Checked with torch 2.13 on CPU.

This module depends on torch, numpy, the standard library and the numpy-only
``vllm_sampling_mask.sampling_mask``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from vllm_sampling_mask.sampling_mask import SamplingMask

__all__ = [
    "full_logprobs",
    "importance_ratio",
    "mask_to_tensors",
    "nucleus_logprobs",
    "nucleus_logprobs_from_hidden",
    "pack_masks",
    "ratio_statistics",
]


Temperature = Union[float, int, torch.Tensor]
MaskLike = Any  # SamplingMask, or a pair (ids, offsets) of tensors / arrays

_DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
# The SDDMM kernel: "sparse" (torch.sparse.sampled_addmm, the fast CPU path)
# or "gather" (gathered weight rows in chunks, any device).  `None` picks
# sparse on CPU and gather elsewhere.  Tests force each one.
_SDDMM_KERNEL: Optional[str] = None


# ---------------------------------------------------------------------------
# Input normalisation
# ---------------------------------------------------------------------------

def _to_index_tensor(x, name: str, device: torch.device, keep_int32: bool = False
                     ) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    else:
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{name} must be an integer tensor or array") from exc
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype (got {t.dtype})")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D (got shape {tuple(t.shape)})")
    dtype = torch.int32 if (keep_int32 and t.dtype == torch.int32) else torch.int64
    return t.to(device=device, dtype=dtype)


def _mask_parts(mask: MaskLike):
    if hasattr(mask, "ids") and hasattr(mask, "offsets"):
        return mask.ids, mask.offsets
    if isinstance(mask, (tuple, list)) and len(mask) == 2:
        return mask[0], mask[1]
    raise TypeError("mask must be a SamplingMask or a pair (ids, offsets), "
                    f"got {type(mask).__name__}")


def mask_to_tensors(mask: MaskLike, device: Union[str, torch.device, None] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, offsets)`` as int64 tensors on ``device`` from a mask.

    ``mask`` is a :class:`SamplingMask` (anything with ``.ids`` and
    ``.offsets``) or a pair ``(ids, offsets)`` of tensors / arrays.  Convert
    once and pass the pair to the op inside a training loop to avoid a
    host-to-device copy per call.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    ids, offsets = _mask_parts(mask)
    return (_to_index_tensor(ids, "mask ids", device),
            _to_index_tensor(offsets, "mask offsets", device))


def pack_masks(masks: Sequence[Any], device: Union[str, torch.device, None] = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack the masks of a batch of completions for one call of the ops.

    ``masks`` are :class:`SamplingMask` objects (``SamplingMask.from_response``
    makes one from an HTTP choice, ``CompletionOutput.sampling_mask`` offline).
    Returns ``(ids, offsets)``, int64 tensors on ``device``: the supports of
    ``masks[0]`` first, then ``masks[1]``'s, and so on (``SamplingMask.concat``),
    so that ``nucleus_logprobs(logits, token_ids, pack_masks(masks))`` matches
    the completions' logits rows and token ids concatenated in the same order.
    """
    masks = list(masks)
    for i, mask in enumerate(masks):
        if not isinstance(mask, SamplingMask):
            raise TypeError(f"pack_masks: masks[{i}] is a {type(mask).__name__}, not a "
                            "SamplingMask (SamplingMask.from_response makes one from an "
                            "HTTP choice)")
    return mask_to_tensors(SamplingMask.concat(masks), device)


def _token_tensor(token_ids, T: int, device: torch.device) -> torch.Tensor:
    tok = _to_index_tensor(token_ids, "token_ids", device)
    if tok.numel() != T:
        raise ValueError(f"token_ids has {tok.numel()} entries but there are {T} "
                         "positions (rows of logits / hidden)")
    return tok


def _compute_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _temperature_tensor(temperature: Temperature, T: int, device: torch.device,
                        dtype: torch.dtype, validate: bool) -> torch.Tensor:
    """Temperature as a ``[T]`` tensor (a constant: no gradient flows to it)."""
    if isinstance(temperature, torch.Tensor):
        temp = temperature.detach()
        if temp.numel() == 1:
            return temp.reshape(1).to(device=device, dtype=dtype).expand(T)
        if temp.dim() != 1 or temp.numel() != T:
            raise ValueError(f"temperature must be a float or a [T] tensor with T={T} "
                             f"(got shape {tuple(temp.shape)})")
        return temp.to(device=device, dtype=dtype)
    try:
        value = float(temperature)
    except (TypeError, ValueError) as exc:
        raise ValueError("temperature must be a float or a [T] tensor") from exc
    if validate and not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"temperature must be positive and finite (got {value})")
    return torch.full((T,), value, dtype=dtype, device=device)


def _first(cond: torch.Tensor) -> torch.Tensor:
    """Index of the first True in a 1-D bool tensor, -1 if none (no sync)."""
    if cond.numel() == 0:
        return torch.full((), -1, dtype=torch.int64, device=cond.device)
    return torch.where(cond.any(), cond.to(torch.uint8).argmax(), -1)


def _segment_ids(offsets: torch.Tensor, T: int, N: int) -> torch.Tensor:
    """``seg[k] = t`` for ``offsets[t] <= k < offsets[t + 1]`` (valid offsets)."""
    if N == 0:
        return torch.zeros(0, dtype=torch.int64, device=offsets.device)
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(
        torch.arange(T, device=offsets.device), counts, output_size=N)


def _check_offsets(offsets: torch.Tensor, T: int, N: int) -> None:
    """One host sync: offsets start at 0, never decrease, end at N; no empty support."""
    counts = offsets[1:] - offsets[:-1]
    summary = torch.stack([
        offsets[0], offsets[-1], _first(counts < 0), _first(counts == 0)]).tolist()
    start, end, t_dec, t_empty = summary
    if start != 0:
        raise ValueError(f"mask offsets must start at 0 (got offsets[0]={start})")
    if t_dec >= 0:
        raise ValueError(
            "mask offsets must be non-decreasing: offsets[t + 1] < offsets[t] "
            f"at token t={t_dec}")
    if end != N:
        raise ValueError(f"mask offsets must end at len(ids)={N} (got offsets[-1]={end})")
    if t_empty >= 0:
        raise ValueError(f"empty support at token t={t_empty} "
                         "(offsets[t] == offsets[t + 1])")


def _check_contents(ids: torch.Tensor, seg: torch.Tensor, key: torch.Tensor,
                    tok: torch.Tensor, temp: torch.Tensor, V: int, T: int) -> None:
    """One host sync (two if some support is not in ascending order).

    ``key = seg * V + ids`` is strictly increasing exactly when every support
    is ascending without repeats (ids in range); then membership of each
    sampled token is a binary search of ``t * V + a_t`` in ``key``: O(N + T log N).
    """
    N = ids.numel()
    device = ids.device
    rows = torch.arange(T, device=device)
    t_temp = _first(~((temp > 0) & torch.isfinite(temp)))
    t_tok = _first((tok < 0) | (tok >= V))
    tkey = rows * V + tok
    lo, hi = torch.aminmax(ids)
    ascending = (key[1:] > key[:-1]).all() if N > 1 else torch.ones((), dtype=torch.bool,
                                                                     device=device)
    pos = torch.searchsorted(key, tkey).clamp_(max=N - 1)
    t_miss = _first(key[pos] != tkey)
    summary = torch.stack([t_temp, t_tok, lo.to(torch.int64), hi.to(torch.int64),
                           ascending.to(torch.int64), t_miss]).tolist()
    t_temp, t_tok, lo, hi, ascending, t_miss = summary
    # Error paths below may read more values: they run once, before raising.
    if t_temp >= 0:
        raise ValueError(f"temperature must be positive and finite: temperature[{t_temp}]="
                         f"{float(temp[t_temp])} at token t={t_temp}")
    if lo < 0 or hi >= V:
        k = int(_first((ids < 0) | (ids >= V)))
        raise ValueError(f"mask id {int(ids[k])} at token t={int(seg[k])} (ids[{k}]) is "
                         f"outside the vocabulary [0, {V})")
    if t_tok >= 0:
        raise ValueError(f"sampled token {int(tok[t_tok])} at token t={t_tok} is outside the "
                         f"vocabulary [0, {V})")
    if not ascending:
        # Some support is not ascending: sort to find repeats and search again.
        skey = torch.sort(key).values
        pos = torch.searchsorted(skey, tkey).clamp_(max=N - 1)
        k_dup, t_miss = torch.stack([_first(skey[1:] == skey[:-1]),
                                     _first(skey[pos] != tkey)]).tolist()
        if k_dup >= 0:
            dup = int(skey[k_dup])
            raise ValueError(f"id {dup % V} is listed twice in the support of "
                             f"token t={dup // V}")
    if t_miss >= 0:
        raise ValueError(f"sampled token {int(tok[t_miss])} at token t={t_miss} is not "
                         "inside its support")


class _Prepared:
    __slots__ = ("ids", "offsets", "seg", "key", "tok", "temp", "temp_scalar")


def _prepare(T: int, V: int, token_ids, mask: MaskLike, temperature: Temperature,
             device: torch.device, cdt: torch.dtype, validate: bool) -> _Prepared:
    """Normalise and (optionally) validate the mask, tokens and temperature."""
    raw_ids, raw_offsets = _mask_parts(mask)
    ids = _to_index_tensor(raw_ids, "mask ids", device, keep_int32=True)
    offsets = _to_index_tensor(raw_offsets, "mask offsets", device)
    tok = _token_tensor(token_ids, T, device)
    if offsets.numel() != T + 1:
        raise ValueError(f"mask covers {offsets.numel() - 1} tokens but there are {T} "
                         "positions (rows of logits / hidden); len(offsets) must be T + 1")
    out = _Prepared()
    out.temp = _temperature_tensor(temperature, T, device, cdt, validate)
    out.temp_scalar = None if isinstance(temperature, torch.Tensor) else float(temperature)
    N = ids.numel()
    if validate:
        _check_offsets(offsets, T, N)
    out.seg = _segment_ids(offsets, T, N)
    out.key = None
    if validate and T:
        out.key = out.seg * V + ids
        _check_contents(ids, out.seg, out.key, tok, out.temp, V, T)
    out.ids, out.offsets, out.tok = ids, offsets, tok
    return out


# ---------------------------------------------------------------------------
# Segmented softmax
# ---------------------------------------------------------------------------

def _segment_logsumexp(x: torch.Tensor, seg: torch.Tensor, T: int):
    """Per-segment logsumexp of ``x`` [N] (overwritten), with ``e`` and ``s``.

    Returns ``(lse, e, s)``: ``e = exp(x - m[seg])`` (in ``x``'s storage) and
    ``s`` its segment sums, so the softmax weights are ``e / s[seg]``.
    Entries equal to -inf take no part (weight 0).  O(N + T) memory.
    """
    m = torch.full((T,), -math.inf, dtype=x.dtype, device=x.device)
    m.scatter_reduce_(0, seg, x, reduce="amax", include_self=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = x.sub_(m[seg]).exp_()
    s = torch.zeros(T, dtype=x.dtype, device=x.device).index_add_(0, seg, e)
    return m + torch.log(s), e, s


def _flat_view(x: torch.Tensor) -> torch.Tensor:
    """A 1-D view spanning a 2-D tensor's storage window (any strides)."""
    if x.is_contiguous():
        return x.view(-1)
    span = (x.shape[0] - 1) * x.stride(0) + (x.shape[1] - 1) * x.stride(1) + 1
    return x.as_strided((span,), (1,))


def _flat_index(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    if x.is_contiguous():
        return rows * x.shape[1] + cols
    return rows * x.stride(0) + cols * x.stride(1)


# ---------------------------------------------------------------------------
# From logits
# ---------------------------------------------------------------------------

class _NucleusFromLogits(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, seg, ids, key, tok, temp, temp_scalar):
        T, V = logits.shape
        cdt = temp.dtype
        if key is None:
            key = seg * V + ids
        flat_logits = _flat_view(logits)
        rows = torch.arange(T, device=logits.device)
        tkey = rows * V + tok
        if logits.is_contiguous():
            idx, tidx = key, tkey
        else:
            idx = _flat_index(logits, seg, ids)
            tidx = _flat_index(logits, rows, tok)
        kept = flat_logits.index_select(0, idx).to(cdt)
        if temp_scalar is not None:
            kept = kept.div_(temp_scalar)
        else:
            kept = kept.div_(temp[seg])
        target = flat_logits.index_select(0, tidx).to(cdt) / temp
        lse, e, s = _segment_logsumexp(kept, seg, T)
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
                     temperature: Temperature = 1.0, *, validate: bool = True
                     ) -> torch.Tensor:
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
    cdt = _compute_dtype(logits)
    pr = _prepare(T, V, token_ids, mask, temperature, logits.device, cdt, validate)
    return _NucleusFromLogits.apply(logits, pr.seg, pr.ids, pr.key, pr.tok, pr.temp,
                                    pr.temp_scalar)


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
    cdt = _compute_dtype(logits)
    tok = _token_tensor(token_ids, T, logits.device)
    temp = _temperature_tensor(temperature, T, logits.device, cdt, validate)
    if validate and T:
        t_tok, t_temp = torch.stack([
            _first((tok < 0) | (tok >= V)),
            _first(~((temp > 0) & torch.isfinite(temp)))]).tolist()
        if t_temp >= 0:
            raise ValueError("temperature must be positive and finite: "
                             f"temperature[{t_temp}]={float(temp[t_temp])} at token t={t_temp}")
        if t_tok >= 0:
            raise ValueError(f"sampled token {int(tok[t_tok])} at token t={t_tok} is "
                             f"outside the vocabulary [0, {V})")
    z = logits.to(cdt) / temp[:, None]
    return z.gather(1, tok[:, None]).squeeze(1) - torch.logsumexp(z, dim=1)


# ---------------------------------------------------------------------------
# From hidden states (never the [T, V] logits)
# ---------------------------------------------------------------------------

class _Layout:
    """The pairs (token, vocabulary id) whose logits are needed, in three orders.

    Pairs: the N support entries ``(t, ids[k])`` plus one entry ``(t, a_t)``
    per token for the sampled logit (flagged ``is_target``), n = N + T.

    * id-major ("im"): sorted by vocabulary id (then token).  The forward
      SDDMM and ``grad_weight`` run in this order, so each weight row is read
      once, contiguously; it is a CSR matrix ``[V, T]`` with row pointers
      ``crow_im``, and vocabulary block ``b`` (rows ``v0:v0 + nv``) is the
      slice ``bounds[b]:bounds[b + 1]``.
    * token-major per block ("hm"): sorted by (vocabulary block, token);
      ``grad_hidden`` runs in this order (one ``embedding_bag`` per block, a
      bag per token, row pointers ``crow_h[b]``).  With one block it is the
      plain token order, known in closed form.
    """

    def __init__(self, ids, offsets, seg, tok, T: int, V: int, chunk: int):
        device = ids.device
        N = ids.numel()
        n = N + T
        rows = torch.arange(T, device=device)
        self.T, self.V, self.chunk = T, V, chunk
        self.n_blocks = max(1, -(-V // chunk))
        # Token order with each token's sampled id after its support:
        # positions are known in closed form (no sort, no sync).
        pos_support = torch.arange(N, device=device) + seg
        pos_target = offsets[1:] + rows
        cols_tm = torch.empty(n, dtype=torch.int64, device=device)
        segs_tm = torch.empty(n, dtype=torch.int64, device=device)
        cols_tm[pos_support] = ids.to(torch.int64)
        cols_tm[pos_target] = tok
        segs_tm[pos_support] = seg
        segs_tm[pos_target] = rows
        # Id-major order.
        perm = torch.sort(cols_tm, stable=True).indices
        self.cols_im = cols_tm[perm]
        self.segs_im = segs_tm[perm]
        im_of_tm = torch.empty_like(perm)
        im_of_tm[perm] = torch.arange(n, device=device)
        self.target_im = im_of_tm[pos_target]
        self.is_target_im = torch.zeros(n, dtype=torch.bool, device=device)
        self.is_target_im[self.target_im] = True
        self.crow_im = torch.zeros(V + 1, dtype=torch.int64, device=device)
        torch.cumsum(torch.bincount(cols_tm, minlength=V), 0, out=self.crow_im[1:])
        if self.n_blocks == 1:
            self.bounds = [0, n]
            self.cols_h = cols_tm
            self.im_of_h = im_of_tm
            self.crow_h = (offsets + torch.arange(T + 1, device=device)).unsqueeze(0)
        else:
            starts = torch.arange(0, V, chunk, device=device)
            edges = torch.cat([starts, torch.tensor([V], device=device)])
            self.bounds = self.crow_im[edges].tolist()                  # the one sync
            key = torch.div(cols_tm, chunk, rounding_mode="floor") * T + segs_tm
            perm_h = torch.sort(key, stable=True).indices
            self.cols_h = cols_tm[perm_h]
            self.im_of_h = im_of_tm[perm_h]
            counts = torch.bincount(key, minlength=self.n_blocks * T).view(self.n_blocks, T)
            self.crow_h = torch.zeros(self.n_blocks, T + 1, dtype=torch.int64, device=device)
            torch.cumsum(counts, dim=1, out=self.crow_h[:, 1:])

    def blocks(self):
        """(b, p0, p1, v0, nv) per vocabulary block; pairs p0:p1 in both orders."""
        for b in range(self.n_blocks):
            v0 = b * self.chunk
            yield b, self.bounds[b], self.bounds[b + 1], v0, min(self.chunk, self.V - v0)


def _kernel(device: torch.device) -> str:
    if _SDDMM_KERNEL is not None:
        return _SDDMM_KERNEL
    return "sparse" if device.type == "cpu" else "gather"


def _sddmm_block(h, w_block, crow, tokens, cols, kernel: str, pair_chunk: int):
    """``out[k] = w_block[row k] . h[tokens[k]]`` for one block's id-major pairs.

    ``crow`` are the block's CSR row pointers (one row per vocabulary id),
    ``cols`` the pairs' vocabulary ids relative to the block (gather kernel).
    """
    n = tokens.numel()
    if kernel == "sparse":
        with warnings.catch_warnings():
            # torch warns that sparse CSR is "beta"; only its sampled_addmm is used.
            warnings.simplefilter("ignore", UserWarning)
            csr = torch.sparse_csr_tensor(
                crow, tokens, torch.zeros(n, dtype=h.dtype, device=h.device),
                size=(w_block.shape[0], h.shape[0]), check_invariants=False)
        return torch.sparse.sampled_addmm(csr, w_block, h.t(), beta=0.0).values()
    out = torch.empty(n, dtype=h.dtype, device=h.device)
    for a in range(0, n, pair_chunk):
        b = min(n, a + pair_chunk)
        out[a:b] = torch.linalg.vecdot(w_block.index_select(0, cols[a:b]),
                                       h.index_select(0, tokens[a:b]))
    return out


class _NucleusFromHidden(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, layout: _Layout, temp, temp_scalar, kernel: str,
                pair_chunk: int):
        cdt = temp.dtype
        T = hidden.shape[0]
        h = hidden.to(cdt)
        L = layout
        z = torch.empty(L.cols_im.numel(), dtype=cdt, device=hidden.device)
        for _b, p0, p1, v0, nv in L.blocks():
            if p1 == p0:
                continue
            w_block = weight[v0:v0 + nv].to(cdt)
            crow = L.crow_im[v0:v0 + nv + 1] - p0
            z[p0:p1] = _sddmm_block(h, w_block, crow, L.segs_im[p0:p1],
                                    L.cols_im[p0:p1] - v0, kernel, pair_chunk)
        if bias is not None:
            z += bias.to(cdt)[L.cols_im]
        if temp_scalar is not None:
            z.div_(temp_scalar)
        else:
            z.div_(temp[L.segs_im])
        target = z[L.target_im]
        # The sampled entries take no part in the normaliser (weight 0).
        x = z.masked_fill_(L.is_target_im, -math.inf)
        lse, e, s = _segment_logsumexp(x, L.segs_im, T)
        ctx.save_for_backward(hidden, weight, bias, temp, e, s)
        ctx.layout, ctx.kernel = layout, kernel
        return target - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, temp, e, s = ctx.saved_tensors
        L: _Layout = ctx.layout
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt = temp.dtype
        T, H = hidden.shape
        g = grad_out.to(cdt) / temp
        # d out / d z for every pair (id-major): +g on the sampled entry, -p*g
        # on each support entry.  All sums below run in `cdt`.
        p = e / s[L.segs_im]
        coef = (L.is_target_im.to(cdt) - p).mul_(g[L.segs_im])
        coef_h = coef[L.im_of_h] if need_h else None
        h = hidden.to(cdt) if need_w else None
        grad_h = grad_w = grad_b = None
        if need_h:
            grad_h = torch.zeros((T, H), dtype=cdt, device=hidden.device)
        in_place_w = L.n_blocks == 1 and weight.dtype == cdt
        if need_w and not in_place_w:
            grad_w = torch.empty_like(weight)
        for b, p0, p1, v0, nv in L.blocks():
            w_block = weight[v0:v0 + nv].to(cdt) if (need_h and p1 > p0) else None
            if need_h and p1 > p0:
                # grad_hidden[t] += sum_k coef_k * W[id_k]: one bag per token.
                grad_h += F.embedding_bag(L.cols_h[p0:p1] - v0, w_block, L.crow_h[b],
                                          mode="sum", per_sample_weights=coef_h[p0:p1],
                                          include_last_offset=True)
            if need_w:
                # grad_W[v] = sum_k coef_k * hidden[t_k]: one bag per vocabulary id.
                rows = F.embedding_bag(L.segs_im[p0:p1], h, L.crow_im[v0:v0 + nv + 1] - p0,
                                       mode="sum", per_sample_weights=coef[p0:p1],
                                       include_last_offset=True)
                if in_place_w:
                    grad_w = rows
                else:
                    grad_w[v0:v0 + nv].copy_(rows)
        if need_b:
            grad_b = torch.zeros(bias.shape[0], dtype=cdt, device=bias.device)
            grad_b.index_add_(0, L.cols_im, coef)
            grad_b = grad_b.to(bias.dtype)
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def nucleus_logprobs_from_hidden(hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                                 token_ids, mask: MaskLike,
                                 temperature: Temperature = 1.0,
                                 bias: Optional[torch.Tensor] = None, *,
                                 validate: bool = True,
                                 chunk_size: Optional[int] = None) -> torch.Tensor:
    """:func:`nucleus_logprobs` of ``hidden @ lm_head_weight.T (+ bias)``, without the logits.

    Only the logits on each support (and of each sampled token) are computed:
    O(N * H) work and O(N + T * H) memory instead of the ``[T, V]`` matmul.

    Args:
        hidden: ``[T, H]`` final hidden states at the positions that produced
            the T generated tokens.
        lm_head_weight: ``[V, H]`` output projection (tied embeddings work).
        token_ids, mask, temperature, validate: as in :func:`nucleus_logprobs`.
        bias: optional ``[V]`` output bias.
        chunk_size: vocabulary rows converted to the compute dtype at once,
            and weight rows gathered per step by the non-CPU kernel.
            Default: 256 MiB of float32, ``256 MiB // (4 * H)`` rows.  On CPU
            a weight already in the compute dtype (float32, float64) is read
            in place as one block unless ``chunk_size`` is given.

    Returns:
        ``[T]`` float32 tensor (float64 for float64 inputs), differentiable
        with respect to ``hidden``, ``lm_head_weight`` and ``bias``.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError("hidden must be a [T, H] tensor")
    if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
        raise ValueError("lm_head_weight must be a [V, H] tensor")
    if not (hidden.dtype.is_floating_point and lm_head_weight.dtype.is_floating_point):
        raise ValueError("hidden and lm_head_weight must be floating tensors")
    T, H = hidden.shape
    V, H2 = lm_head_weight.shape
    if H2 != H:
        raise ValueError(f"hidden is [T, {H}] but lm_head_weight is [V, {H2}]: "
                         "hidden sizes differ")
    if lm_head_weight.device != hidden.device:
        raise ValueError("hidden and lm_head_weight must be on the same device")
    if bias is not None:
        if bias.shape != (V,):
            raise ValueError(f"bias must be [V]=[{V}] (got {tuple(bias.shape)})")
        if bias.device != hidden.device:
            raise ValueError("bias must be on the same device as hidden")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer (got {chunk_size})")
    device = hidden.device
    cdt = _compute_dtype(hidden, lm_head_weight, bias)
    pr = _prepare(T, V, token_ids, mask, temperature, device, cdt, validate)
    kernel = _kernel(device)
    budget_rows = max(1, _DEFAULT_CHUNK_BYTES // (4 * max(H, 1)))
    if chunk_size is not None:
        chunk = chunk_size
    elif kernel == "sparse" and lm_head_weight.dtype == cdt:
        chunk = max(V, 1)
    else:
        chunk = budget_rows
    layout = _Layout(pr.ids, pr.offsets, pr.seg, pr.tok, T, V, chunk)
    pair_chunk = max(1, min(chunk, budget_rows) // 2)
    return _NucleusFromHidden.apply(hidden, lm_head_weight, bias, layout, pr.temp,
                                    pr.temp_scalar, kernel, pair_chunk)


# ---------------------------------------------------------------------------
# Importance ratio
# ---------------------------------------------------------------------------

def importance_ratio(new_logprobs: torch.Tensor, old_logprobs,
                     clip: Union[None, float, Sequence[Optional[float]]] = None
                     ) -> torch.Tensor:
    """``exp(new_logprobs - old_logprobs)``, the per-token importance ratio.

    ``old_logprobs`` (e.g. the engine's logprobs recorded at sampling time) is
    a constant: it is detached and moved to ``new_logprobs``' device; the
    ratio is computed in float32 (float64 if ``new_logprobs`` is float64).

    ``clip``: ``None`` (no clamping), a float ``eps`` (clamp to
    ``[1 - eps, 1 + eps]``, the PPO range) or a pair ``(low, high)`` where
    either bound may be ``None`` (e.g. ``(None, 2.0)`` for truncated
    importance sampling).  Clamped entries carry no gradient, as in PPO;
    use ``torch.minimum(r * adv, importance_ratio(..., clip=eps) * adv)``.
    """
    if not isinstance(new_logprobs, torch.Tensor):
        raise ValueError("new_logprobs must be a tensor")
    cdt = torch.float64 if new_logprobs.dtype == torch.float64 else torch.float32
    old = torch.as_tensor(old_logprobs).detach().to(device=new_logprobs.device, dtype=cdt)
    if old.shape != new_logprobs.shape:
        raise ValueError(f"old_logprobs has shape {tuple(old.shape)} but new_logprobs has "
                         f"shape {tuple(new_logprobs.shape)}")
    ratio = torch.exp(new_logprobs.to(cdt) - old)
    if clip is None:
        return ratio
    if isinstance(clip, (int, float)):
        if not clip >= 0:
            raise ValueError(f"clip must be >= 0 (got {clip})")
        low, high = 1.0 - clip, 1.0 + clip
    else:
        try:
            low, high = clip
        except (TypeError, ValueError) as exc:
            raise ValueError("clip must be None, a float or a pair (low, high)") from exc
        if low is not None and high is not None and low > high:
            raise ValueError(f"clip low {low} is above clip high {high}")
    if low is None and high is None:
        return ratio
    return torch.clamp(ratio, min=low, max=high)


def _stat_vector(x, name: str) -> np.ndarray:
    """A 1-D float64 numpy copy of a tensor / array-like of logprobs."""
    try:
        if isinstance(x, torch.Tensor):
            arr = x.detach().to(device="cpu", dtype=torch.float64).numpy()
        else:
            arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a 1-D tensor or array of floats") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D [T] (got shape {tuple(arr.shape)})")
    return arr


def ratio_statistics(new_logprobs, old_logprobs, support_sizes=None,
                     band: tuple[float, float] = (0.9, 1.1)) -> dict:
    """How far the trainer's log-probabilities are from the engine's, as plain numbers.

    ``new_logprobs`` (the trainer's) and ``old_logprobs`` (the engine's, recorded
    at sampling time) are ``[T]`` tensors or array-likes of the sampled tokens'
    log-probabilities; ``support_sizes`` an optional ``[T]`` of support sizes
    (``SamplingMask.sizes``).  With ``log_r = new - old`` and ``r = exp(log_r)``
    the result (a ``dict`` of Python ``float`` / ``int``, computed in float64,
    no gradient) has:

    * ``tokens``: T;
    * ``mismatch_kl``: mean over tokens of the k3 estimator
      ``exp(log_r) - 1 - log_r`` (>= 0; 0 exactly when every ratio is 1);
    * ``ratio_mean``, ``ratio_p1``, ``ratio_p99``: mean and 1st / 99th
      percentiles of ``r`` (linear interpolation, numpy's default);
    * ``out_of_band``: share of tokens with ``r`` outside ``[band[0], band[1]]``;
    * with ``support_sizes``: ``support_mean``, ``support_median``,
      ``support_p99`` (linear interpolation) and ``singleton_share`` (share of
      supports with one id: tokens the engine had no choice about).

    Raises ``ValueError`` on inputs that are not 1-D, of different lengths,
    empty, not finite (naming the first bad position), on support sizes that
    are not integers >= 1, and on a band with ``band[0] > band[1]``.
    """
    new = _stat_vector(new_logprobs, "new_logprobs")
    old = _stat_vector(old_logprobs, "old_logprobs")
    if new.shape != old.shape:
        raise ValueError(f"new_logprobs has {new.shape[0]} entries but old_logprobs has "
                         f"{old.shape[0]}")
    T = new.shape[0]
    if T < 1:
        raise ValueError("ratio_statistics needs at least one token (got T=0)")
    for name, arr in (("new_logprobs", new), ("old_logprobs", old)):
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]} is not finite")
    try:
        low, high = (float(b) for b in band)
    except (TypeError, ValueError) as exc:
        raise ValueError("band must be a pair (low, high) of floats") from exc
    if not low <= high:
        raise ValueError(f"band low {low} is above band high {high}")
    log_r = new - old
    ratio = np.exp(log_r)
    k3 = np.expm1(log_r) - log_r
    p1, p99 = np.percentile(ratio, [1.0, 99.0])
    out = {
        "tokens": int(T),
        "mismatch_kl": float(k3.mean()),
        "ratio_mean": float(ratio.mean()),
        "ratio_p1": float(p1),
        "ratio_p99": float(p99),
        "out_of_band": float(np.mean((ratio < low) | (ratio > high))),
    }
    if support_sizes is not None:
        if isinstance(support_sizes, torch.Tensor):
            sizes = support_sizes.detach().cpu().numpy()
        else:
            sizes = np.asarray(support_sizes)
        if sizes.ndim != 1:
            raise ValueError(f"support_sizes must be 1-D [T] (got shape {tuple(sizes.shape)})")
        if sizes.shape[0] != T:
            raise ValueError(f"support_sizes has {sizes.shape[0]} entries but there are "
                             f"{T} tokens")
        if not (np.issubdtype(sizes.dtype, np.integer)
                or (np.issubdtype(sizes.dtype, np.floating)
                    and np.all(np.isfinite(sizes)) and np.all(sizes == np.round(sizes)))):
            raise ValueError(f"support_sizes must be integers (got dtype {sizes.dtype})")
        sizes = sizes.astype(np.int64)
        bad = np.flatnonzero(sizes < 1)
        if bad.size:
            raise ValueError(f"support_sizes[{bad[0]}]={sizes[bad[0]]}: a support has at "
                             "least one id")
        median, sp99 = np.percentile(sizes.astype(np.float64), [50.0, 99.0])
        out.update({
            "support_mean": float(sizes.mean()),
            "support_median": float(median),
            "support_p99": float(sp99),
            "singleton_share": float(np.mean(sizes == 1)),
        })
    return out
