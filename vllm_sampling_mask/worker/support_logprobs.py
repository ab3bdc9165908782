"""Support logprobs on the device: the processed logprob of every id of a sampling
mask's support, in the mask's order, and log S, for the rows that asked.

Plain module (torch and numpy; no vLLM). The runner's mask state
(`worker.state.SamplingMaskState.extract`) calls `gather_support_logprobs` right after
extracting the step's supports (same step, same device, no host sync: host ints
reach the device through pinned memory, `extraction.host_index`); the host, once
it has decoded the step's supports (`transport.decode`), aligns the copied values
to them with `align_row`.

Inputs, for the sampler's batch of `B` rows over a vocabulary of `V`:
    processed_logprobs  float [B, V]  what the mask was extracted from:
                        log_softmax of the logits sampled from (every processor,
                        temperature, min-p, top-k/top-p), -inf outside the support
                        (Model Runner V2 hands processed logits: `normalise`)
    scaled_top          float [B]  per row, log p_max of the temperature-scaled
                        distribution (before min-p/top-k/top-p), recorded by the
                        sampler adapters with `scaled_top_logprob` where the scaled
                        logits exist (no copy of them is kept)
    mask                `extraction.DeviceMask` of that step
    asked               host bool per row of `mask.block` (the rows that asked)

Output (`DeviceSupportLogprobs`, still on the device, float32):
    values    [A, W]   values[a, j] = processed_logprobs[row, ids[row, j]] for
                       j < min(count, W); NaN where the block holds -1
    log_kept  [A]      log S, the mass the support kept under the scaled
                       distribution; 0 for an untruncated row
    tail      [S, V]   for each wide-row slot of the layout, its row's processed
                       logprobs (ids past W come from the slot's bits; their values
                       are read from here on the host); [0, V] when S = 0
    rows      host int64 [A], the block rows gathered (ascending)

log S without the scaled rows: min-p, top-k and top-p always keep the most probable
id, and processed logits equal scaled ones on the support, so log S = log p_max
(scaled) - log p_max(processed), each the largest entry of the row's log-softmax
(for processed logprobs, their largest entry). (A caller may
instead pass the whole `scaled_logits` [B, V]; the tests use it as a reference.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.worker.extraction import DeviceMask, host_index

__all__ = ["DeviceSupportLogprobs", "gather_support_logprobs", "align_row",
           "scaled_top_logprob", "log_kept_of"]


@dataclass
class DeviceSupportLogprobs:
    values: torch.Tensor     # float32 [A, W]
    log_kept: torch.Tensor   # float32 [A]
    tail: torch.Tensor       # float32 [S, V]
    rows: np.ndarray         # host int64 [A]: block rows (of `mask`)


def _source_rows(mask: DeviceMask, block_rows: np.ndarray) -> np.ndarray:
    """The sampler batch row of each block row given."""
    if mask.rows is None:
        return block_rows.astype(np.int64)
    return np.asarray(mask.rows, np.int64)[block_rows]


def _host_view(x: torch.Tensor) -> np.ndarray | None:
    """The numpy view of a CPU float32 tensor with contiguous rows (what a CPU
    host's V1 sampler hands over), None for anything else: the host path then
    reads the tensor's own memory with a few numpy calls instead of a dozen small
    torch operations, each with its own dispatch cost."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad \
            or x.dim() != 2 or x.stride(1) != 1:
        return None
    return x.numpy()


# A CPU host's scaled rows past this many logits are reduced a block of rows at a
# time through one reused buffer of about this size (`_blocked_top_logprob`)
_BLOCK_LOGITS = 1 << 18
_room = threading.local()


def _blocked_top_logprob(rows: torch.Tensor) -> torch.Tensor:
    """log p_max of each row of CPU float32 `rows`, -log sum exp(x - max), without
    a tensor as large as `rows`: the fused `log_softmax` writes one, whose pages a
    CPU host maps and zeroes anew each step past glibc's reuse threshold (26 ms
    at 64 x 151,936 on one thread against 6.3 ms here;
    `benchmarks/bench_host_step.py`). The sums are torch's (pairwise), so
    the value is also closer to float64's than the fused kernel's."""
    batch, vocab = rows.shape
    block = max(1, _BLOCK_LOGITS // vocab)
    room = getattr(_room, "buffer", None)
    if room is None or room.numel() < block * vocab:
        room = _room.buffer = torch.empty(max(_BLOCK_LOGITS, vocab), dtype=torch.float32)
    top = rows.amax(dim=1)
    sums = torch.empty(batch, dtype=torch.float32)
    for start in range(0, batch, block):
        part = rows[start:start + block]
        shifted = room[: len(part) * vocab].view(len(part), vocab)
        torch.sub(part, top[start:start + block, None], out=shifted)
        torch.sum(shifted.exp_(), dim=1, out=sums[start:start + block])
    return sums.log_().neg_()


def log_kept_of(top_difference, counts, vocab: int):
    """log S from each row's scaled top logprob less its processed top logprob:
    at most 0 (a rounding above it is 0), and 0 exactly in the rows whose
    support is the whole vocabulary (nothing was filtered: S = 1), whatever
    rounding the two tops carry; a NaN stays NaN (that row describes no draw).
    numpy or torch, as given."""
    if isinstance(top_difference, torch.Tensor):
        log_kept = torch.clamp(top_difference, max=0.0)
        whole = (counts == vocab) & ~torch.isnan(log_kept)
        return torch.where(whole, torch.zeros_like(log_kept), log_kept)
    log_kept = np.minimum(top_difference, np.float32(0.0))
    whole = (np.asarray(counts) == vocab) & ~np.isnan(log_kept)
    return np.where(whole, np.float32(0.0), log_kept)


def scaled_top_logprob(scaled_logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """For the sampler's batch rows `rows` (host ints, ascending), the log of the
    largest probability of the temperature-scaled distribution, float32 in a [B]
    tensor (0 in the other rows). What the samplers capture where the scaled
    logits exist (before min-p/top-k/top-p edit them in place): with it, log S
    needs no copy of the scaled logits (see `gather_support_logprobs`).

    Computed as the largest entry of the rows' `log_softmax`, the operation the
    V1 sampler's processed logprobs come from, in one fused kernel that costs a
    third of the five small operations (max, subtract, exp, sum, log) it replaced
    on a CPU host at the demo's 8 x 4,096 (`benchmarks/bench_host_step.py`); past
    `_BLOCK_LOGITS` logits of CPU float32, a block of rows at a time
    (`_blocked_top_logprob`). A row nothing filtered gets log S = 0 exactly
    where it is taken (`log_kept_of`). No operation writes the logits."""
    batch = scaled_logits.shape[0]
    out = torch.zeros(batch, dtype=torch.float32, device=scaled_logits.device)
    if len(rows):
        rows = np.asarray(rows, np.int64)
        every_row = len(rows) == batch    # ascending and distinct: all of them
        index = None if every_row else host_index(rows, scaled_logits.device)
        picked = scaled_logits if every_row else scaled_logits.index_select(0, index)
        if picked.device.type == "cpu" and picked.dtype == torch.float32 \
                and picked.numel() > _BLOCK_LOGITS:
            top = _blocked_top_logprob(picked)
        else:
            top = picked.log_softmax(dim=1, dtype=torch.float32).amax(dim=1)
        if every_row:
            out.copy_(top)
        else:
            out.index_copy_(0, index, top)
    return out


def gather_support_logprobs(processed_logprobs: torch.Tensor,
                            scaled_logits: torch.Tensor | None,
                            mask: DeviceMask, asked: np.ndarray, *,
                            scaled_top: torch.Tensor | None = None,
                            normalise: bool = False) -> DeviceSupportLogprobs:
    """Gather, for the block rows with `asked` true, the processed logprob of each
    support id and log S (see the module docstring). No host synchronisation:
    everything sized here is a host int of the layout or of `asked`.

    Instead of `scaled_logits` a sampler may pass `scaled_top` ([B], from
    `scaled_top_logprob`): the largest id of a scaled row is always kept
    (min-p, top-k and top-p keep the most probable id), and processed logits
    equal scaled ones on the support, so
    log S = log p_max(scaled) - log p_max(processed), each the largest entry
    of the row's log-softmax. `normalise`: `processed_logprobs` are processed *logits* (Model
    Runner V2); their asked rows are log-softmaxed here (float32)."""
    layout = mask.layout
    device = processed_logprobs.device
    asked = np.asarray(asked, bool)
    if len(asked) != layout.rows:
        raise ValueError(f"gather_support_logprobs: {len(asked)} asked flags for "
                         f"{layout.rows} block rows")
    if scaled_logits is None and scaled_top is None:
        raise ValueError("gather_support_logprobs: pass scaled_logits or scaled_top")
    if scaled_logits is not None and processed_logprobs.shape != scaled_logits.shape:
        raise ValueError("gather_support_logprobs: processed_logprobs and scaled_logits "
                         f"differ in shape ({tuple(processed_logprobs.shape)} vs "
                         f"{tuple(scaled_logits.shape)})")
    block_rows = np.flatnonzero(asked)
    vocab = layout.vocab_size
    if len(block_rows) == 0:
        empty = torch.empty(0, layout.width, dtype=torch.float32, device=device)
        return DeviceSupportLogprobs(empty, torch.empty(0, dtype=torch.float32,
                                                        device=device),
                                     torch.empty(0, vocab, dtype=torch.float32,
                                                 device=device), block_rows)
    host = None if (normalise or scaled_logits is not None) else _host_view(processed_logprobs)
    if host is not None:
        return _gather_on_host(host, mask, block_rows, scaled_top)
    meta, ids, _ = layout.views(mask.block)
    pick = host_index(block_rows, device)
    meta = meta.index_select(0, pick)                                 # [A, 3]
    source = host_index(_source_rows(mask, block_rows), device)
    every_row = len(block_rows) == processed_logprobs.shape[0] and np.array_equal(
        _source_rows(mask, block_rows), np.arange(len(block_rows)))
    processed = (processed_logprobs if every_row             # no copy when all asked
                 else processed_logprobs.index_select(0, source)).float()   # [A, V]
    if normalise:
        processed = processed.log_softmax(dim=1)
    if scaled_logits is None:
        # log p_max of the processed row: its largest logprob, what
        # `scaled_top_logprob` reads of the scaled row
        processed_top = processed.amax(dim=1)
    row_ids = ids.index_select(0, pick).long()                        # [A, W]
    valid = row_ids >= 0
    values = processed.gather(1, row_ids.clamp(min=0))
    values = torch.where(valid, values, torch.full_like(values, float("nan")))

    # log S over the support (the finite processed entries: exactly the mask)
    if scaled_logits is None:
        log_kept = log_kept_of(scaled_top.index_select(0, source).float() - processed_top,
                               meta[:, 0], vocab)
    else:
        scaled = scaled_logits.index_select(0, source).float()
        top = scaled.amax(dim=1, keepdim=True)
        shifted = scaled - top
        log_total = torch.logsumexp(shifted, dim=1)
        kept = torch.where(torch.isfinite(processed), shifted,
                           torch.full_like(shifted, float("-inf")))
        log_kept = torch.logsumexp(kept, dim=1) - log_total

    # wide rows: their processed rows by slot. Each slot has at most one owner:
    # scatter the asked rows' positions by slot (slot -1 / -2 rows go to a dump
    # entry), then copy only `slots` rows (a slot nobody asked for holds another
    # row's values, never read: only asked wide rows are aligned)
    slots = layout.slots
    if slots:
        slot = meta[:, 1].long()
        target = torch.where(slot >= 0, slot, torch.full_like(slot, slots))
        owner = torch.zeros(slots + 1, dtype=torch.long, device=device)
        owner.index_copy_(0, target, torch.arange(len(block_rows), device=device))
        tail = processed.index_select(0, owner[:slots])
    else:
        tail = torch.empty(0, vocab, dtype=torch.float32, device=device)
    return DeviceSupportLogprobs(values, log_kept, tail, block_rows)


def _gather_on_host(processed: np.ndarray, mask: DeviceMask, block_rows: np.ndarray,
                    scaled_top: torch.Tensor) -> DeviceSupportLogprobs:
    """`gather_support_logprobs` of processed *logprobs* on a CPU host, in numpy over
    the tensors' own memory: the same values, log S and tail. The largest
    processed logprob of a row is its log p_max (the row is normalised), one pass
    of `max` over the asked rows instead of a `logsumexp`."""
    layout = mask.layout
    meta, ids, _ = layout.views(mask.block.numpy())
    source = _source_rows(mask, block_rows)
    rows = processed[source]                                          # [A, V]
    row_ids = ids[block_rows]                                         # [A, W]
    valid = row_ids >= 0
    values = np.take_along_axis(rows, np.where(valid, row_ids, 0), axis=1)
    values[~valid] = np.nan
    log_kept = log_kept_of(scaled_top.numpy()[source] - rows.max(axis=1),
                           meta[block_rows, 0], layout.vocab_size)
    if layout.slots:
        # each slot has at most one owner; a slot nobody asked for holds another
        # row's values, never read (only asked wide rows are aligned)
        slot = meta[block_rows, 1]
        owner = np.zeros(layout.slots + 1, dtype=np.int64)
        owner[np.where(slot >= 0, slot, layout.slots)] = np.arange(len(block_rows))
        tail = rows[owner[: layout.slots]]
    else:
        tail = np.empty((0, layout.vocab_size), dtype=np.float32)
    return DeviceSupportLogprobs(torch.from_numpy(np.ascontiguousarray(values, np.float32)),
                                 torch.from_numpy(log_kept.astype(np.float32, copy=False)),
                                 torch.from_numpy(tail), block_rows)


def on_host(mask: DeviceMask, asked: np.ndarray, scaled_top: torch.Tensor,
            processed_logits: torch.Tensor, *, normalise: bool = False) -> None:
    """`gather_support_logprobs` for a mask extracted on a CPU host
    (`extraction.extract_on_host`): fills its `HostSupports`' support logprobs,
    flat and aligned with its ids, for the extracted rows with `asked` true
    (NaN in the others). The values are the logits the ids were read at
    (processed logprobs), or, with `normalise` (processed logits), their
    log-softmax over the row; log S = log p_max(scaled) - log p_max(processed)
    as on the device, and NaN in a row whose logits hold a NaN (the mask path
    then ends the request, as it does for the device's NaN: such a row's
    `HostSupports.drawn` becomes -1)."""
    host = mask.host
    asked = np.asarray(asked, bool)
    n = len(host.counts)
    if len(asked) != n:
        raise ValueError(f"support_logprobs.on_host: {len(asked)} asked flags for {n} rows")
    x = processed_logits.detach().numpy()
    if not normalise and n == len(x) and asked.all() and host.values is not None:
        _every_row_on_host(host, asked, x, scaled_top)
        return
    block_rows = np.flatnonzero(asked)
    source = _source_rows(mask, block_rows)
    stored = np.diff(host.offsets)
    owner = np.repeat(np.arange(n), stored)
    picked = asked[owner]
    logprobs = np.full(len(host.ids), np.nan, dtype=np.float32)
    log_kept = np.full(n, np.nan, dtype=np.float32)
    if len(source):
        rows = x if len(source) == len(x) else x[source]                # [A, V]
        if normalise:   # the asked rows' log-softmax, and log p_max, as on the device
            normalised = torch.from_numpy(rows).float().log_softmax(dim=1).numpy()
            top = normalised.max(axis=1)
            local = np.zeros(n, dtype=np.int64)
            local[block_rows] = np.arange(len(block_rows))
            logprobs[picked] = normalised[local[owner[picked]], host.ids[picked]]
        else:           # processed logprobs: log p_max is the row's largest
            logprobs[picked] = host.values[picked]
            top = rows.max(axis=1)
        log_kept[block_rows] = log_kept_of(scaled_top.numpy()[source] - top,
                                           host.counts[block_rows], x.shape[1])
    host.asked, host.logprobs, host.log_kept = asked, logprobs, log_kept
    if host.drawn is not None:   # NaN support logprobs describe no draw
        bad = asked & np.isnan(log_kept)
        nan_ids = picked & np.isnan(logprobs)
        if nan_ids.any():
            bad |= np.bincount(owner[nan_ids], minlength=n) > 0
        host.drawn[bad] = -1


def _every_row_on_host(host, asked: np.ndarray, x: np.ndarray,
                       scaled_top: torch.Tensor) -> None:
    """`on_host` for processed logprobs when every batch row was extracted and
    asked (a rollout's usual step): the values read at the ids are the support
    logprobs as they are (finite by construction: the ids are the finite
    entries), and log S needs one `max` per row; none of the per-id bookkeeping
    a subset needs (a few microseconds each on a loaded host)."""
    log_kept = log_kept_of(scaled_top.numpy() - x.max(axis=1), host.counts, x.shape[1])
    host.asked, host.logprobs = asked, host.values.astype(np.float32, copy=False)
    host.log_kept = log_kept.astype(np.float32, copy=False)
    if host.drawn is not None:   # a row holding a NaN (its max is NaN) describes no draw
        host.drawn[np.isnan(log_kept)] = -1


def align_row(values: np.ndarray, tail: np.ndarray, count: int, slot: int,
              support: np.ndarray) -> np.ndarray:
    """On the host: the float32 logprobs of one row's decoded `support` (ascending
    ids, `count` of them), from its copied `values` row and, for a row wider than
    the block's width (`slot` >= 0), the `tail` row of its slot."""
    width = len(values)
    if count <= width:
        return np.ascontiguousarray(values[:count], np.float32)
    if slot < 0:
        raise ValueError(f"align_row: a row of {count} ids past width {width} has no slot")
    return np.concatenate([values[:width], tail[slot][np.asarray(support[width:])]]
                          ).astype(np.float32)
