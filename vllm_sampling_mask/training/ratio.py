"""Ratio helpers: ``importance_ratio`` (differentiable) and ``ratio_statistics`` (for logs).

``importance_ratio(new_logprobs, old_logprobs, clip=None)`` is
``exp(new - old)`` with the old log-probabilities treated as constants,
optionally clamped, for the loss.  ``ratio_statistics(new_logprobs,
old_logprobs, support_sizes=None, band=(0.9, 1.1))`` summarises the
trainer/engine mismatch as a plain dict of Python numbers (k3 KL estimate,
ratio mean and percentiles, share outside a band, support-size figures), for
logs and replay checks; no gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import numpy as np
import torch

__all__ = ["importance_ratio", "ratio_statistics"]


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
