"""Device-to-host transport of one step's mask block, and its host form.

Plain module (torch, numpy; no vLLM). `MaskCopy` is started on Model Runner
V2's output copy stream, beside the sampled token ids, and read when the
runner's asynchronous output is resolved, after the runner's copy event.

Lifetimes across streams: the block was written on the main stream and is
read by the copy on the copy stream. `MaskCopy` keeps the device block
referenced until `result`, which runs only after the copy event has
completed, so the caching allocator cannot hand its memory to the main
stream while the copy may still read it, however many steps are in flight.

The host side (`result`) does numpy work only, no device work: it runs on the
thread that resolves outputs, which under asynchronous scheduling must not
wait on the main stream. Wide rows arrive in the same copy as packed bits and
are unpacked in time linear in their size.

Pinned staging: on CUDA the block lands in a reusable page-locked buffer from
`PinnedPool` (truly asynchronous; no page-locked allocation per step for the
mask). A buffer is handed out only while free and returns to the pool once
read. Support logprobs, when a row asked, are copied with `non_blocking=True`
into page-locked memory from torch's caching host allocator.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from vllm_sampling_mask.worker.extraction import NO_SLOT, DeviceMask, HostSupports, MaskLayout


class PinnedPool:
    """Reusable page-locked int32 buffers; one per copy in flight.

    `take` runs on the runner's thread, `give_back` wherever the output is
    resolved (an output thread under asynchronous scheduling): hence the lock.
    """

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, numel: int) -> torch.Tensor:
        with self._lock:
            for i, buf in enumerate(self._free):
                if buf.numel() >= numel:
                    return self._free.pop(i)
            if self._free:  # all too small: drop the smallest, allocate bigger
                self._free.remove(min(self._free, key=torch.Tensor.numel))
        return torch.empty(max(numel, 4096), dtype=torch.int32, pin_memory=True)

    def give_back(self, buf: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buf)

    def __len__(self) -> int:
        return len(self._free)


@dataclass
class StepMasks:
    """One step's supports on the host, one row per request of the batch.

    What crosses processes (it rides in `ModelRunnerOutput`, pickled under
    tensor/pipeline parallelism), so it is flat: the stored ids of every row
    back to back (`ids[offsets[r]:offsets[r + 1]]`, ascending), never the
    padded [R, W] block. A row's stored ids are its whole support, except for a
    row whose support is wider than the size limit or that found no wide-row
    slot: those store their first W ids and `problem` says why they cannot be
    used. Rows of requests that want no mask have `row_of == -1`: `wants(i)`
    is False and nothing else is defined for them. The last `idle` rows are
    batch rows whose request wants a mask but whose sample the runner discards
    (a partial prefill chunk): they were not extracted and hold count 0, as a
    row that sampled nothing does."""

    row_of: np.ndarray            # [batch rows] int64, row in counts/offsets, or -1
    counts: np.ndarray            # [R + idle] int32, true support size (0: sampled nothing)
    ids: np.ndarray               # [offsets[-1]] int32, each row's stored ids
    offsets: np.ndarray           # [R + idle + 1] int64
    width: int                    # W, the step's compacted columns
    wide: frozenset[int]          # rows wider than W, read exactly from their bits
    lost: frozenset[int]          # rows wider than W that found no wide-row slot
    max_size: int                 # --max-sampling-mask-size
    # Support logprobs (`return_sampling_mask_logprobs`), None when no row of the
    # step asked: the rows that asked ([R + idle] bool), float32 aligned with `ids` (each
    # stored id's processed logprob) and float32 [R + idle] log S; NaN in the rows that
    # did not ask (and where a row's logits held NaN: `problem` says so).
    asked_rows: np.ndarray | None = None
    logprobs: np.ndarray | None = None
    log_kept: np.ndarray | None = None
    idle: int = 0                 # trailing rows not extracted (their sample is discarded)
    # Under speculative decoding (a verify step) a request has a run of batch
    # rows, one per position it may emit a token at: [requests] int64, the batch
    # row of each request's first position; its k-th emitted token's support is
    # batch row first_row[i] + k. None: batch row i is request i's one row.
    first_row: np.ndarray | None = None
    # [R + idle] int64, on a CPU host whose sampler handed its tokens over (the V1
    # runner without speculative decoding): the token each row drew where
    # `problem` has nothing to say about that draw, else -1. A kept token equal
    # to its row's `drawn` is then checked by one comparison (`WireRows.drawn`);
    # any other goes through `problem`. None: check every token (`suspects`).
    drawn: np.ndarray | None = None

    def __reduce__(self):
        """Pickled (the worker -> engine core hop: vLLM's queue pickles the
        step's `ModelRunnerOutput`) as its wire form, the form the scheduler
        reads it in (`WireRows`: the rows as lists, ids and counts as bytes),
        and the fields that are not arrays. Lists and bytes pickle in C. A
        step's five to nine small arrays, by numpy's reduction or packed into
        one buffer, took more calls on both sides, and the engine core then
        made the wire form itself (`python benchmarks/bench_host_step.py`,
        the "hop pickle" rows). The arrays come
        back from the wire form where something asks for one (`__getattr__`):
        the scheduler's checks beyond `WireRows.drawn`, most steps none."""
        first_row = None if self.first_row is None else self.first_row.tolist()
        return _from_wire, (self.wire(), self.width, self.wide, self.lost, self.max_size,
                            self.idle, first_row)

    def __getattr__(self, name: str):
        """An unpickled step's arrays, rebuilt from its wire form on first use
        (writable, as unpickled arrays are)."""
        wire = self.__dict__.get("_wire")
        if wire is None or name not in _WIRE_ARRAYS:
            raise AttributeError(name)
        self.__dict__.update(wire.arrays())
        return self.__dict__[name]

    def rows(self, request: int, n: int) -> np.ndarray:
        """The batch rows of the first `n` tokens request `request` emitted."""
        first = request if self.first_row is None else int(self.first_row[request])
        return np.arange(first, first + n, dtype=np.int64)

    def asked(self, i: int) -> bool:
        """Whether batch row i carries support logprobs."""
        r = int(self.row_of[i])
        return r >= 0 and self.asked_rows is not None and bool(self.asked_rows[r])

    def row_logprobs(self, i: int) -> np.ndarray:
        r = int(self.row_of[i])
        return self.logprobs[self.offsets[r]: self.offsets[r + 1]]

    def wants(self, i: int) -> bool:
        return bool(self.row_of[i] >= 0)

    def row(self, i: int) -> np.ndarray:
        """Batch row i's support, ascending int32 (see `problem` first)."""
        r = int(self.row_of[i])
        return self.ids[self.offsets[r]: self.offsets[r + 1]]

    def problem(self, i: int, token: int) -> str | None:
        """Why batch row i cannot describe the draw of `token` exactly, or None."""
        r = int(self.row_of[i])
        count = int(self.counts[r])
        if r >= len(self.counts) - self.idle:
            return (f"the runner discards this row's sample this step (a partial "
                    f"prefill chunk), so it was not extracted, yet token {token} was kept")
        if count > self.max_size:
            return (f"the support of a step had {count} ids, more than "
                    f"--max-sampling-mask-size {self.max_size} allows: raise the limit, "
                    "narrow the distribution (top_k, top_p, min_p), or send "
                    "return_sampling_mask=false")
        if r in self.lost:
            return (f"its support of {count} ids is wider than this step's "
                    f"{self.width} compacted columns and every wide-row slot "
                    "of the step was taken")
        if count == 0:
            return (f"the sampler drew token {token} from a distribution with no "
                    "finite logit (every logit was -inf or NaN)")
        row = self.row(i)
        at = int(np.searchsorted(row, token))
        if at == len(row) or row[at] != token:
            return (f"the sampled token {token} is not in its support of {count} ids "
                    "(non-finite logits reached the sampler)")
        if self.asked(i) and (np.isnan(self.log_kept[r])
                              or np.isnan(self.row_logprobs(i)).any()):
            return ("its support logprobs are NaN (NaN logits reached the sampler; "
                    "send return_sampling_mask_logprobs=false to get the mask alone)")
        return None


    def suspects(self, batch_rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """For batch rows whose request wants a mask, each with the token it kept:
        True where `problem` may have something to say; False where it certainly
        has not. One pass of array operations over the step, not a call per row:
        the caller asks `problem` only for the (rare) suspects."""
        r = self.row_of[np.asarray(batch_rows, dtype=np.int64)]
        tokens = np.asarray(tokens, dtype=np.int64)
        counts = self.counts[r]
        bad = ((r >= len(self.counts) - self.idle) | (counts > self.max_size)
               | (counts == 0) | (tokens < 0))
        if self.lost:
            bad |= np.isin(r, list(self.lost))
        # Each row's ids ascend and rows follow in order, so (row, id) keys ascend:
        # one search finds every kept token in its row's support.
        stored = np.diff(self.offsets)
        owner = np.repeat(np.arange(len(stored), dtype=np.int64), stored)
        keys = (owner << 32) | self.ids.astype(np.int64)
        wanted = (r << 32) | tokens
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        bad |= (keys[at] != wanted) if len(keys) else True
        if self.asked_rows is not None:
            nan_rows = np.isnan(self.log_kept)
            nan_ids = np.isnan(self.logprobs)
            if nan_ids.any():
                nan_rows = nan_rows | (np.bincount(owner[nan_ids],
                                                   minlength=len(stored)) > 0)
            bad |= self.asked_rows[r] & nan_rows[r]
        return bad

    def wire(self) -> "WireRows":
        """The step as the engine-core outputs carry it: an unpickled step's own,
        else made now (once per step: the hop's pickle, or the scheduler)."""
        wire = self.__dict__.get("_wire")
        return WireRows(self) if wire is None else wire


class StepWithoutMasks:
    """A step in which no row has a mask: no request of the batch wants one and
    none waits on a partial prefill (`StepPlan.masks_nothing`). One instance,
    `NO_MASKS`, which pickles by name: the worker -> engine core hop carries a
    reference, not a step's worth of empty arrays, and the scheduler attaches
    nothing for it without looking further. It also stands where the step's
    `MaskCopy` stands on the asynchronous path (`result`): there is nothing to
    copy. Each empty stage cost the step tens of microseconds (decode, wire form,
    pickle, the scheduler's pass): 1.9-3.6% of the demo model's 32-row step for a
    batch that asked for no mask (`python benchmarks/bench_step_cost.py
    --unasked --timers`)."""

    __slots__ = ()

    def result(self, num_sampled=None) -> StepWithoutMasks:
        return self

    def __reduce__(self) -> str:
        return "NO_MASKS"

    def __repr__(self) -> str:
        return "NO_MASKS"


NO_MASKS = StepWithoutMasks()


# the arrays of `StepMasks` a `WireRows` holds, by name, with their dtypes (as
# lists of Python values, or as little-endian bytes)
_WIRE_ARRAYS = {"row_of": "i8", "counts": "<i4", "ids": "<i4", "offsets": "i8",
                "asked_rows": "?", "logprobs": "<f4", "log_kept": "<f4", "drawn": "i8"}


def _from_wire(wire: "WireRows", width: int, wide: frozenset, lost: frozenset,
               max_size: int, idle: int, first_row) -> StepMasks:
    """`StepMasks.__reduce__`'s counterpart: the arrays stay in the wire form
    until something asks for one."""
    masks = StepMasks.__new__(StepMasks)
    masks.__dict__.update(_wire=wire, width=width, wide=wide, lost=lost,
                          max_size=max_size, idle=idle,
                          first_row=None if first_row is None
                          else np.array(first_row, np.int64))
    return masks


class WireRows:
    """A step's masks as the bytes each engine-core output carries (`wire`):
    the flat arrays turned to bytes once per step, so one request's rows are
    byte slices (no per-request array, no per-request encoder hook). It is also
    what the worker -> engine core hop pickles (`StepMasks.__reduce__`), so it
    holds every array of the step, as a list or as bytes."""

    def __init__(self, masks: StepMasks) -> None:
        self.row_of = masks.row_of.tolist()
        # per host row, the token its support was checked against (-1: none)
        self.drawn = None if masks.drawn is None else masks.drawn.tolist()
        self._offsets = masks.offsets.tolist()
        self._ids = masks.ids.astype("<i4", copy=False).tobytes()
        self._counts = masks.counts.astype("<i4", copy=False).tobytes()
        self._asked = None if masks.asked_rows is None else masks.asked_rows.tolist()
        self._logprobs = _float_bytes(masks.logprobs)
        self._log_kept = _float_bytes(masks.log_kept)

    def of(self, batch_row: int, n: int = 1):
        """(ids, counts, logprobs, log_kept) bytes of the tokens of `n` batch rows
        from `batch_row` on (one request's emitted tokens: its rows are
        consecutive, and so are their host rows), logprobs and log_kept None
        unless it asked."""
        r = self.row_of[batch_row]
        a, b = 4 * self._offsets[r], 4 * self._offsets[r + n]
        ids, counts = self._ids[a:b], self._counts[4 * r: 4 * (r + n)]
        if self._asked is None or not self._asked[r]:
            return ids, counts, None, None
        return ids, counts, self._logprobs[a:b], self._log_kept[4 * r: 4 * (r + n)]

    def arrays(self) -> dict[str, np.ndarray | None]:
        """`StepMasks`' arrays back from this form, by name (`_WIRE_ARRAYS`)."""
        found = {"row_of": self.row_of, "counts": self._counts, "ids": self._ids,
                 "offsets": self._offsets, "asked_rows": self._asked,
                 "logprobs": self._logprobs, "log_kept": self._log_kept,
                 "drawn": self.drawn}
        return {name: None if value is None
                else np.frombuffer(value, _WIRE_ARRAYS[name]).copy()
                if isinstance(value, bytes) else np.array(value, _WIRE_ARRAYS[name])
                for name, value in found.items()}


def _float_bytes(values: np.ndarray | None) -> bytes | None:
    return None if values is None else values.astype("<f4", copy=False).tobytes()


def unpack_wide_row(head: np.ndarray, words: np.ndarray, start_word: int) -> np.ndarray:
    """The support of a wide row: its first W ids `head`, then every set bit of
    `words[start_word:]` above `head[-1]`. Linear in the size of `words`."""
    tail = np.unpackbits(np.ascontiguousarray(words[start_word:]).view(np.uint8),
                         bitorder="little")
    found = np.flatnonzero(tail).astype(np.int32) + np.int32(32 * start_word)
    return np.concatenate([head, found[found > head[-1]]])


def decode(block: np.ndarray, layout: MaskLayout, row_of: np.ndarray,
           num_sampled=None, support_logprobs=None, idle: int = 0,
           request_rows: np.ndarray | None = None) -> StepMasks:
    """The host form of a block (copied out of `block`, which may be reused).

    `row_of` maps batch rows to host rows (-1: no mask wanted): the block's
    rows, then `idle` rows that were not extracted (the runner discards their
    sample: count 0, no ids). `num_sampled` is the tokens each request emitted
    this step; `request_rows` the batch rows of each request of a verify step
    (None: one each). Rows at which no token was emitted (a request that
    produced none; under speculative decoding the positions after a rejected
    draft) get count 0 and no problem is raised for them. Vectorised over rows;
    only wide rows (rare: ties past W) are visited one by one.
    """
    meta, ids, bits = layout.views(block)
    counts = np.zeros(layout.rows + idle, dtype=np.int32)
    counts[: layout.rows] = meta[:, 0]
    first_row = None if request_rows is None else _first_rows(request_rows)
    if num_sampled is not None:
        counts[_silent_rows(row_of, num_sampled, first_row, request_rows)] = 0
    wide, lost = {}, set()
    over = counts > layout.width
    if over.any():   # rare: ties past W, or a support over the size limit
        for r in np.flatnonzero(over & (counts <= layout.max_size)).tolist():
            slot, start_word = int(meta[r, 1]), int(meta[r, 2])
            if slot == NO_SLOT or not 0 <= slot < layout.slots:
                lost.add(r)
            else:
                wide[r] = unpack_wide_row(ids[r], bits[slot], start_word)
    stored = np.minimum(counts, layout.width).astype(np.int64)   # idle rows: 0
    for r, support in wide.items():
        stored[r] = len(support)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(stored, out=offsets[1:])
    in_block = stored[: layout.rows]
    if not wide:
        flat = ids[np.arange(layout.width)[None, :] < in_block[:, None]]
    else:
        flat = np.empty(int(offsets[-1]), dtype=np.int32)
        keep = (np.arange(layout.width)[None, :]
                < np.minimum(counts[: layout.rows], layout.width)[:, None])
        keep[list(wide)] = False
        rr, cc = np.nonzero(keep)
        flat[offsets[rr] + cc] = ids[rr, cc]
        for r, support in wide.items():
            flat[offsets[r]: offsets[r + 1]] = support
    asked_rows = logprobs = log_kept = None
    if support_logprobs is not None and len(support_logprobs.rows):
        asked_rows = np.zeros(len(counts), dtype=bool)
        asked_rows[np.asarray(support_logprobs.rows, np.int64)] = True
        logprobs, log_kept = _align_logprobs(support_logprobs, layout, meta, len(counts),
                                             in_block, offsets, wide)
    return StepMasks(row_of=row_of, counts=counts, ids=np.ascontiguousarray(flat, np.int32),
                     offsets=offsets, width=layout.width, wide=frozenset(wide),
                     lost=frozenset(lost),
                     max_size=layout.max_size, asked_rows=asked_rows, logprobs=logprobs,
                     log_kept=log_kept, idle=idle, first_row=first_row)


def _first_rows(request_rows: np.ndarray) -> np.ndarray:
    """The batch row of each request's first position in a verify step."""
    first_row = np.zeros(len(request_rows), dtype=np.int64)
    np.cumsum(request_rows[:-1], out=first_row[1:])
    return first_row


def _silent_rows(row_of: np.ndarray, num_sampled, first_row, request_rows) -> np.ndarray:
    """The host rows at which no token was emitted (see `decode`)."""
    sampled = np.asarray(num_sampled, dtype=np.int64)
    if request_rows is None:
        emitted = sampled[: len(row_of)] > 0
    else:   # position k of request i emitted a token when k < num_sampled[i]
        position = np.arange(len(row_of)) - np.repeat(first_row, request_rows)
        emitted = position < np.repeat(sampled[: len(request_rows)], request_rows)
    return row_of[(row_of >= 0) & ~emitted]


_NO_ROWS: frozenset[int] = frozenset()   # a host form's wide and lost rows


def decode_host(host: HostSupports, layout: MaskLayout, row_of: np.ndarray,
                num_sampled=None, idle: int = 0,
                request_rows: np.ndarray | None = None) -> StepMasks:
    """`decode` for supports extracted on a CPU host (`extraction.extract_on_host`):
    they already are flat, so this only appends the idle rows and empties the
    rows at which no token was emitted (see `decode`). A step in which every
    row emitted a token (most) takes the arrays as they are."""
    n = len(host.counts)
    counts, ids, logprobs, offsets, drawn = (host.counts, host.ids, host.logprobs,
                                             host.offsets, host.drawn)
    first_row = None if request_rows is None else _first_rows(request_rows)
    if num_sampled is not None and not (request_rows is None and all(num_sampled)):
        silent = _silent_rows(row_of, num_sampled, first_row, request_rows)
        silent = silent[silent < n]     # the idle rows hold nothing already
        counts = counts.copy()
        counts[silent] = 0
        if drawn is not None:
            drawn = drawn.copy()
            drawn[silent] = -1
        stored = np.diff(offsets)
        if stored[silent].any():    # under speculative decoding: drop their ids
            dropped = np.zeros(n, dtype=bool)
            dropped[silent] = True
            keep = ~np.repeat(dropped, stored)
            ids = ids[keep]
            logprobs = None if logprobs is None else logprobs[keep]
            stored[silent] = 0
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(stored, out=offsets[1:])
    if idle:
        counts = np.concatenate([counts, np.zeros(idle, dtype=np.int32)])
        offsets = np.concatenate([offsets, np.full(idle, offsets[-1], dtype=np.int64)])
        if drawn is not None:
            drawn = np.concatenate([drawn, np.full(idle, -1, dtype=drawn.dtype)])
    asked_rows = log_kept = None
    if host.asked is not None and host.asked.any():
        asked_rows = np.zeros(n + idle, dtype=bool)
        asked_rows[:n] = host.asked
        log_kept = np.full(n + idle, np.nan, dtype=np.float32)
        log_kept[:n] = host.log_kept
    else:
        logprobs = None
    return StepMasks(row_of=row_of, counts=counts, ids=ids, offsets=offsets,
                     width=layout.width, wide=_NO_ROWS, lost=_NO_ROWS,
                     max_size=layout.max_size, asked_rows=asked_rows, logprobs=logprobs,
                     log_kept=log_kept, idle=idle, first_row=first_row, drawn=drawn)


def _align_logprobs(host, layout: MaskLayout, meta, n_rows, stored, offsets, wide):
    """(flat float32 aligned with the stored ids, float32 [n_rows] log S), NaN in
    the rows that did not ask (and the idle rows past the block's). Vectorised
    over rows; wide rows one by one."""
    from vllm_sampling_mask.worker.support_logprobs import align_row

    rows = np.asarray(host.rows, np.int64)
    values = np.full((layout.rows, layout.width), np.nan, np.float32)
    values[rows] = host.values
    log_kept = np.full(n_rows, np.nan, np.float32)
    log_kept[rows] = host.log_kept
    keep = np.arange(layout.width)[None, :] < np.minimum(stored, layout.width)[:, None]
    keep[list(wide)] = False
    flat = np.full(int(offsets[-1]), np.nan, np.float32)
    rr, cc = np.nonzero(keep)
    flat[offsets[rr] + cc] = values[rr, cc]
    asked = set(rows.tolist())
    for r, support in wide.items():
        if r in asked:
            flat[offsets[r]: offsets[r + 1]] = align_row(
                values[r], host.tail, len(support), int(meta[r, 1]), support)
    return flat, log_kept


class MaskCopy:
    """An in-flight device-to-host copy of one step's `DeviceMask`.

    Construct it with the copy stream current (after it waited for the main
    stream). Either call `result` once that stream's work has completed (MRv2:
    after the runner's copy event), or pass `record_event=True` and `result`
    waits for an event recorded right after this copy.
    """

    def __init__(self, mask: DeviceMask, pool: PinnedPool | None, *,
                 record_event: bool = False) -> None:
        self.layout = mask.layout
        self.row_of = mask.row_of()
        self.idle = mask.n_idle
        self.request_rows = mask.request_rows
        self._event = None
        self._host_form = mask.host
        if mask.host is not None:   # extracted on a CPU host: nothing to copy
            return
        # Referenced until `result`: the copy below reads it on another stream.
        self._device_block = mask.block
        self._pool = pool
        self._buffer = None
        self._logprobs = None
        found = mask.support_logprobs
        # referenced until `result`, like the block: the copies read them
        self._device_logprobs = found
        if found is not None and len(found.rows):
            # float32 values, log S and wide-row tails: small ([A, W], [A], [S, V])
            self._logprobs = (found.rows, found.values.to("cpu", non_blocking=True),
                              found.log_kept.to("cpu", non_blocking=True),
                              found.tail.to("cpu", non_blocking=True))
        if mask.block.device.type == "cpu":
            self._host = mask.block
        elif pool is not None:
            self._buffer = pool.take(mask.block.numel())
            self._host = self._buffer[: mask.block.numel()]
            self._host.copy_(mask.block, non_blocking=True)
        else:
            self._host = mask.block.to("cpu", non_blocking=True)
        if record_event and mask.block.device.type == "cuda":
            self._event = torch.cuda.Event(blocking=True)
            self._event.record()

    def result(self, num_sampled=None) -> StepMasks:
        """Decode the copy: host work only, after the copy has completed."""
        if self._host_form is not None:
            host, self._host_form = self._host_form, None
            return decode_host(host, self.layout, self.row_of, num_sampled, self.idle,
                               self.request_rows)
        if self._event is not None:
            self._event.synchronize()
        host = None
        if self._logprobs is not None:
            from vllm_sampling_mask.worker.support_logprobs import DeviceSupportLogprobs

            rows, values, log_kept, tail = self._logprobs
            host = DeviceSupportLogprobs(values.numpy(), log_kept.numpy(), tail.numpy(), rows)
        try:
            return decode(self._host.numpy(), self.layout, self.row_of, num_sampled, host,
                          self.idle, self.request_rows)
        finally:
            if self._buffer is not None:
                self._pool.give_back(self._buffer)
            self._device_block = self._buffer = self._host = self._event = None
            self._logprobs = self._device_logprobs = None
