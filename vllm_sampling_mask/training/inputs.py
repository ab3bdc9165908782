"""Input normalisation and validation shared by the ops.

Masks arrive as a :class:`~vllm_sampling_mask.frontend.sampling_mask.SamplingMask` or a
pair ``(ids, offsets)`` of tensors / arrays; token ids as ``[T]`` integer
tensors or arrays; the temperature as a float or a ``[T]`` tensor.  This module
turns them into index tensors on the compute device (``mask_to_tensors``,
``pack_masks``, :func:`prepare`) and, with ``validate=True``, checks them with
a fixed number of device-to-host synchronisations (:func:`check_offsets`: one;
:func:`check_contents`: one, two when a support is not ascending), raising
``ValueError`` that names the token position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch

from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

from .segments import segment_ids

__all__ = [
    "EMPTY_SUPPORT_MODES",
    "MaskLike",
    "Prepared",
    "Temperature",
    "check_contents",
    "check_offsets",
    "compute_dtype",
    "first_true",
    "mask_parts",
    "mask_to_tensors",
    "pack_masks",
    "prepare",
    "temperature_tensor",
    "to_index_tensor",
    "token_tensor",
]

Temperature = Union[float, int, torch.Tensor]
MaskLike = Any  # SamplingMask, or a pair (ids, offsets) of tensors / arrays

# What an empty support means: "error" (a ValueError naming the token) or "full" (the
# token has no mask: its log-probability is taken over the full softmax).
EMPTY_SUPPORT_MODES = ("error", "full")


def to_index_tensor(x, name: str, device: torch.device, keep_int32: bool = False
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


def mask_parts(mask: MaskLike):
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
    ids, offsets = mask_parts(mask)
    return (to_index_tensor(ids, "mask ids", device),
            to_index_tensor(offsets, "mask offsets", device))


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


def token_tensor(token_ids, T: int, device: torch.device) -> torch.Tensor:
    tok = to_index_tensor(token_ids, "token_ids", device)
    if tok.numel() != T:
        raise ValueError(f"token_ids has {tok.numel()} entries but there are {T} "
                         "positions (rows of logits / hidden)")
    return tok


def compute_dtype(*tensors: Optional[torch.Tensor]) -> torch.dtype:
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def temperature_tensor(temperature: Temperature, T: int, device: torch.device,
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


def first_true(cond: torch.Tensor) -> torch.Tensor:
    """Index of the first True in a 1-D bool tensor, -1 if none (no sync)."""
    if cond.numel() == 0:
        return torch.full((), -1, dtype=torch.int64, device=cond.device)
    return torch.where(cond.any(), cond.to(torch.uint8).argmax(), -1)

def check_offsets(offsets: torch.Tensor, T: int, N: int, allow_empty: bool = False) -> None:
    """One host sync: offsets start at 0, never decrease, end at N; no empty support
    unless ``allow_empty``."""
    counts = offsets[1:] - offsets[:-1]
    summary = torch.stack([
        offsets[0], offsets[-1], first_true(counts < 0), first_true(counts == 0)]).tolist()
    start, end, t_dec, t_empty = summary
    if start != 0:
        raise ValueError(f"mask offsets must start at 0 (got offsets[0]={start})")
    if t_dec >= 0:
        raise ValueError(
            "mask offsets must be non-decreasing: offsets[t + 1] < offsets[t] "
            f"at token t={t_dec}")
    if end != N:
        raise ValueError(f"mask offsets must end at len(ids)={N} (got offsets[-1]={end})")
    if t_empty >= 0 and not allow_empty:
        raise ValueError(f"empty support at token t={t_empty} "
                         "(offsets[t] == offsets[t + 1]); pass empty_support=\"full\" if "
                         "an empty support means the token has no mask (full softmax)")


def check_contents(ids: torch.Tensor, seg: torch.Tensor, key: torch.Tensor,
                    tok: torch.Tensor, temp: torch.Tensor, V: int, T: int) -> None:
    """One host sync (two if some support is not in ascending order).

    ``key = seg * V + ids`` is strictly increasing exactly when every support
    is ascending without repeats (ids in range); then membership of each
    sampled token is a binary search of ``t * V + a_t`` in ``key``: O(N + T log N).
    """
    N = ids.numel()
    device = ids.device
    rows = torch.arange(T, device=device)
    t_temp = first_true(~((temp > 0) & torch.isfinite(temp)))
    t_tok = first_true((tok < 0) | (tok >= V))
    tkey = rows * V + tok
    lo, hi = torch.aminmax(ids)
    ascending = (key[1:] > key[:-1]).all() if N > 1 else torch.ones((), dtype=torch.bool,
                                                                     device=device)
    pos = torch.searchsorted(key, tkey).clamp_(max=N - 1)
    t_miss = first_true(key[pos] != tkey)
    summary = torch.stack([t_temp, t_tok, lo.to(torch.int64), hi.to(torch.int64),
                           ascending.to(torch.int64), t_miss]).tolist()
    t_temp, t_tok, lo, hi, ascending, t_miss = summary
    # Error paths below may read more values: they run once, before raising.
    if t_temp >= 0:
        raise ValueError(f"temperature must be positive and finite: temperature[{t_temp}]="
                         f"{float(temp[t_temp])} at token t={t_temp}")
    if lo < 0 or hi >= V:
        k = int(first_true((ids < 0) | (ids >= V)))
        raise ValueError(f"mask id {int(ids[k])} at token t={int(seg[k])} (ids[{k}]) is "
                         f"outside the vocabulary [0, {V})")
    if t_tok >= 0:
        raise ValueError(f"sampled token {int(tok[t_tok])} at token t={t_tok} is outside the "
                         f"vocabulary [0, {V})")
    if not ascending:
        # Some support is not ascending: sort to find repeats and search again.
        skey = torch.sort(key).values
        pos = torch.searchsorted(skey, tkey).clamp_(max=N - 1)
        k_dup, t_miss = torch.stack([first_true(skey[1:] == skey[:-1]),
                                     first_true(skey[pos] != tkey)]).tolist()
        if k_dup >= 0:
            dup = int(skey[k_dup])
            raise ValueError(f"id {dup % V} is listed twice in the support of "
                             f"token t={dup // V}")
    if t_miss >= 0:
        raise ValueError(f"sampled token {int(tok[t_miss])} at token t={t_miss} is not "
                         "inside its support")


class Prepared(NamedTuple):
    """The normalised inputs of one call, on the compute device.

    Attributes:
        ids: ``[N]`` mask ids, int64 (int32 kept as given); with
            ``empty_support="full"`` each empty support holds its sampled token
            alone (a stand-in whose value the op's caller replaces).
        offsets: ``[T + 1]`` int64 support boundaries.
        seg: ``[N]`` int64 token position of each id (:func:`segment_ids`).
        key: ``[N]`` int64 flat keys ``seg * V + ids`` when validation built
            them (the logits op reuses them), else ``None``.
        tok: ``[T]`` int64 sampled tokens.
        temp: ``[T]`` temperature in the compute dtype (float32 / float64).
        temp_scalar: the temperature as a Python float when it was given as
            a number (a cheaper scalar division), ``None`` for a tensor.
        unmasked: ``[E]`` int64 positions whose support was empty under
            ``empty_support="full"`` (their log-probability is the full
            softmax's: :func:`full_rows`), ``None`` when there are none.
    """

    ids: torch.Tensor
    offsets: torch.Tensor
    seg: torch.Tensor
    key: Optional[torch.Tensor]
    tok: torch.Tensor
    temp: torch.Tensor
    temp_scalar: Optional[float]
    unmasked: Optional[torch.Tensor] = None


def fill_empty_supports(ids: torch.Tensor, offsets: torch.Tensor, tok: torch.Tensor,
                        T: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Give each empty support its sampled token alone, as ``(ids, offsets, rows)``.

    ``rows`` are the positions that were empty (``None``, and the mask unchanged,
    when none was).  A support of one id gives the op the value 0 and exactly zero
    gradient at that position, so the caller can put the full softmax's value there.
    One host synchronisation (whether any support is empty).
    """
    counts = offsets[1:] - offsets[:-1]
    empty = counts == 0
    rows = torch.nonzero(empty).squeeze(1)                     # the one sync
    if rows.numel() == 0:
        return ids, offsets, None
    new_counts = counts + empty.to(counts.dtype)
    new_offsets = torch.zeros_like(offsets)
    torch.cumsum(new_counts, 0, out=new_offsets[1:])
    N = ids.numel()
    seg = segment_ids(offsets, T, N)
    new_ids = torch.empty(N + rows.numel(), dtype=ids.dtype, device=ids.device)
    new_ids[torch.arange(N, device=ids.device) - offsets[seg] + new_offsets[seg]] = ids
    new_ids[new_offsets[rows]] = tok[rows].to(ids.dtype)
    return new_ids, new_offsets, rows


def prepare(T: int, V: int, token_ids, mask: MaskLike, temperature: Temperature,
            device: torch.device, cdt: torch.dtype, validate: bool,
            empty_support: str = "error") -> Prepared:
    """Normalise and (optionally) validate the mask, tokens and temperature."""
    if empty_support not in EMPTY_SUPPORT_MODES:
        raise ValueError(f"empty_support must be one of {EMPTY_SUPPORT_MODES} "
                         f"(got {empty_support!r})")
    raw_ids, raw_offsets = mask_parts(mask)
    ids = to_index_tensor(raw_ids, "mask ids", device, keep_int32=True)
    offsets = to_index_tensor(raw_offsets, "mask offsets", device)
    tok = token_tensor(token_ids, T, device)
    if offsets.numel() != T + 1:
        raise ValueError(f"mask covers {offsets.numel() - 1} tokens but there are {T} "
                         "positions (rows of logits / hidden); len(offsets) must be T + 1")
    temp = temperature_tensor(temperature, T, device, cdt, validate)
    temp_scalar = None if isinstance(temperature, torch.Tensor) else float(temperature)
    N = ids.numel()
    full = empty_support == "full"
    if validate:
        check_offsets(offsets, T, N, allow_empty=full)
    unmasked = None
    if full and T:
        ids, offsets, unmasked = fill_empty_supports(ids, offsets, tok, T)
        N = ids.numel()
    seg = segment_ids(offsets, T, N)
    key = None
    if validate and T:
        key = seg * V + ids
        check_contents(ids, seg, key, tok, temp, V, T)
    return Prepared(ids=ids, offsets=offsets, seg=seg, key=key, tok=tok, temp=temp,
                    temp_scalar=temp_scalar, unmasked=unmasked)
