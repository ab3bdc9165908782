"""A CPU host's extraction: numpy (or `_supports_native`, C, where the install built it)
over the logits' own memory.

On a CPU host the logits already are host memory: numpy reads them in place and
writes the block in a dozen calls of a few microseconds each, where the same
calls in torch cost tens (`benchmarks/bench_extraction.py --cpu-sections impl`),
and the whole step's rows go at once (no chunks: the temporaries are one bool
per logit and the kept ids).

`extract_on_host` reads the logits straight into the host form (`layout.HostSupports`),
with nothing to size, copy or decode, in one pass over their memory; `write_block`
writes the device block's layout instead (`ExtractionSettings.implementation="host"`).
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import torch

from vllm_sampling_mask.worker.extraction.layout import (NO_SLOT, NOT_WIDE, DeviceMask,
                                                         HostSupports, MaskLayout)

try:  # compiled where setup.py found a C compiler; numpy does the same without it
    from vllm_sampling_mask.worker import _supports_native
except ImportError:  # pragma: no cover - exercised only where it was not built
    _supports_native = None


_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


def host_readable(logits: torch.Tensor) -> bool:
    # `is_cpu`, not `device`: reading `device` builds a device object
    return logits.is_cpu and logits.dtype in _HOST_DTYPES


def write_block(x: np.ndarray, rows: np.ndarray | None, block: np.ndarray,
                layout: MaskLayout) -> None:
    """The block of `layout` (the one `torch_path.write_block` writes), written with
    numpy (`x`: the logits, `block`: the block proper, both host arrays)."""
    meta, ids, bits = layout.views(block)
    ids.fill(-1)
    meta[:, 1] = NOT_WIDE
    meta[:, 2] = 0
    if layout.rows == 0:
        return
    if rows is not None:
        x = x[np.asarray(rows, dtype=np.int64)]
    vocab, width = layout.vocab_size, layout.width
    keep = x > -np.inf                          # NaN compares False
    flat = np.flatnonzero(keep)
    row, col = np.divmod(flat, vocab)
    posinf = x[row, col] == np.inf              # +inf is not a finite logit
    if posinf.any():
        keep[row[posinf], col[posinf]] = False
        row, col = row[~posinf], col[~posinf]
    counts = np.bincount(row, minlength=layout.rows)
    meta[:, 0] = counts
    pos = np.arange(len(row)) - (np.cumsum(counts) - counts)[row]
    fits = pos < width
    ids[row[fits], pos[fits]] = col[fits]
    # rows wider than the size limit end with an error: they take no slot
    wide = np.flatnonzero((counts > width) & (counts <= layout.max_size))
    if len(wide):
        slots = min(len(wide), layout.slots)
        meta[wide[slots:], 1] = NO_SLOT
        meta[wide[:slots], 1] = np.arange(slots)
        padded = np.zeros((slots, layout.words * 32), dtype=bool)
        padded[:, :vocab] = keep[wide[:slots]]
        bits[:slots] = np.packbits(padded, axis=1, bitorder="little").view(np.int32)


_NO_BLOCK = torch.empty(0, dtype=torch.int32)   # a host form's (never written)


def extract_on_host(processed_logits: torch.Tensor, rows: np.ndarray | None,
                    max_size: int, sampled: torch.Tensor | None = None, *,
                    values: bool = True) -> DeviceMask:
    """The finite entries of the given rows of CPU `processed_logits` (None: all
    rows) as a `DeviceMask` holding `HostSupports`: numpy over the logits' own
    memory, one vocabulary-wide test and one `flatnonzero` for the whole step,
    then work in the size of the supports only. With `sampled` (the sampler's
    token per batch row) it also says, per row, whether the support describes
    the draw (`HostSupports.drawn`); `values`: read the logits at the ids (what
    support logprobs are made of). Every operation counts: on a busy host each
    costs several microseconds (`python benchmarks/bench_host_step.py`, cold)."""
    x = _host_array(processed_logits)
    batch_rows, vocab = x.shape
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
    tokens = None if sampled is None else _host_array(sampled).reshape(-1)
    supports = (_native_supports(x, rows, max_size, values, tokens)
                if _supports_native is not None else None)
    if supports is None:
        supports = _numpy_supports(x if rows is None else x.take(rows, axis=0),
                                   max_size, values) + (None,)
    counts, ids, offsets, read, drawn = supports
    if tokens is not None and drawn is None:
        drawn = _numpy_drawn(x, rows, tokens, counts, max_size)
    return DeviceMask(_NO_BLOCK, _host_layout(len(counts), vocab, max_size), batch_rows,
                      rows, host=HostSupports(counts, ids, offsets, read, drawn))


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as an ndarray (`detach` only where it is needed:
    the sampler's tensors are made under inference mode)."""
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


@functools.lru_cache(maxsize=64)
def _host_layout(rows: int, vocab: int, max_size: int) -> MaskLayout:
    """The layout a host form reports (no block: its width is the size limit's)."""
    return MaskLayout(rows, max(1, min(max_size, vocab)), 0, vocab, max_size)


# `_native_supports`' room for the ids and logits of a step: R x min(V, N) of each,
# kept per thread and grown when a step needs more (a fresh one each step would cost
# more than the scan: the kernel maps and zeroes its pages), the step's own copied out
_room = threading.local()


def _room_for(items: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    ids, values = getattr(_room, "arrays", (None, None))
    if ids is None or len(ids) < items or values.dtype != dtype:
        ids = np.empty(max(items, 1 << 16), dtype=np.int32)
        values = np.empty(len(ids), dtype=dtype)
        _room.arrays = ids, values
    return ids, values


def _native_supports(x: np.ndarray, rows: np.ndarray | None, max_size: int,
                     values: bool, tokens: np.ndarray | None = None) -> tuple | None:
    """`_numpy_supports` of `x[rows]` by `_supports_native`, reading each row
    where it lies, and `_numpy_drawn` in the same pass where `tokens` are int64
    (else None in its place); None where it does not take `x` (not C-ordered, say)."""
    n = len(x) if rows is None else len(rows)
    ids, read = _room_for(n * min(x.shape[1], max_size), x.dtype)
    counts = np.empty(n, dtype=np.int32)
    offsets = np.empty(n + 1, dtype=np.int64)
    checks = tokens is not None and tokens.dtype == np.int64
    drawn = np.empty(n, dtype=np.int64) if checks else None
    stored = _supports_native.finite_support(x, rows, max_size, ids,
                                             read if values else None, counts, offsets,
                                             *((tokens, drawn) if checks else ()))
    if stored is None:
        return None
    return (counts, ids[:stored].copy(), offsets, read[:stored].copy() if values else None,
            drawn)


def _numpy_drawn(x: np.ndarray, rows: np.ndarray | None, tokens: np.ndarray,
                 counts: np.ndarray, max_size: int) -> np.ndarray:
    """Per extracted row, the token drawn from it (`tokens`, per batch row of `x`)
    where its logit is finite and the row within the size limit; -1 elsewhere."""
    source = np.arange(len(counts)) if rows is None else rows
    if rows is not None:
        tokens = tokens.take(rows)
    drawn = np.where(np.isfinite(x[source, tokens]), tokens, -1)
    drawn[counts > max_size] = -1
    return drawn


def _numpy_supports(x: np.ndarray, max_size: int, values: bool) -> tuple:
    """(counts, ids, offsets, values) of the finite entries of each row of `x`:
    each row's true count (int32), the ids it stores ascending (int32, back to
    back from `offsets[r]`, int64 [R + 1]: none for a row of more than
    `max_size`) and, with `values`, the logits at those ids (None without)."""
    n, vocab = x.shape
    flat = np.flatnonzero(np.isfinite(x))       # NaN and +inf are not finite logits
    offsets = np.searchsorted(flat, np.arange(0, (n + 1) * vocab, vocab))
    counts = np.diff(offsets).astype(np.int32)
    ids = (flat % vocab).astype(np.int32)
    read = x.reshape(-1).take(flat) if values else None
    if counts.max(initial=0) > max_size:        # stored: none (an error, not a mask)
        over = counts > max_size
        stored = ~np.repeat(over, counts)
        ids = ids[stored]
        read = None if read is None else read[stored]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.where(over, 0, counts), out=offsets[1:])
    return counts, ids, offsets, read


