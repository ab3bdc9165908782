"""Per-request accumulation of supports in the output processor.

Plain module (numpy). Supports arrive a few tokens at a time (one engine-core
output per step), as the engine core's bytes (int32 ids and counts, float32
support logprobs) or as arrays. `append` only keeps a reference (a list append:
the output processor makes one per request per step, so it must cost next to
nothing); the next `mask` joins what arrived since the last one into the flat
arrays in one go (one `bytes.join` and one `np.frombuffer` per field), and
returns any span of tokens as a `SamplingMask` without copying the ids.

`MaskAccumulator(with_logprobs, keep)` makes one of two kinds. `KeptMasks`
(`keep=True`: cumulative and final outputs) joins what arrived into flat arrays and
hands out any span again. `ReadOnceMasks` (`keep=False`, a DELTA request's) hands each token out once,
in order: its `mask` makes the span's arrays straight from what arrived since the
last one (one `np.frombuffer` per field) and keeps nothing, as no later output
reads those tokens again. `newest(n)` is the DELTA output's read in one call: a
stream's usual step (one token, its support as the engine core's bytes) takes the
bytes as they came and a shared read-only offsets array, with no other call.

A request that never asked for its mask (switch null) may lose it at a step the
mask cannot describe (`stop`): from that token on there is no mask, only the
reason, and any span reaching past it has none either (`mask` returns None; never
a partial list). Later tokens are only counted (`skip`).
"""

from __future__ import annotations

import struct

import numpy as np

from vllm_sampling_mask.formats.packed_wire import offsets_of_counts
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask


def _nbytes(buffer) -> int:
    return buffer.nbytes if isinstance(buffer, np.ndarray) else len(buffer)


def _unmatched(total: int, ids: int) -> ValueError:
    """The error of supports whose counts do not add up to the ids that came."""
    return ValueError(f"MaskAccumulator: counts add up to {total}, not the {ids} ids appended")


# the wire's item types, made once (`np.frombuffer` parses a dtype string each call)
_I4, _F4 = np.dtype("<i4"), np.dtype("<f4")

# a one-token step's count as the engine core's bytes -> (the count, the offsets
# `[0, count]`), shared read-only by the masks of a stream's one-token steps
# (`newest`); sizes up to `_ONE_TOKEN_CACHED` are kept
_ONE_TOKEN: dict[bytes, tuple[int, np.ndarray]] = {}
_ONE_TOKEN_CACHED = 1 << 16


def _one_token(counts: bytes) -> tuple[int, np.ndarray]:
    count = int.from_bytes(counts, "little", signed=True)
    offsets = np.array((0, count), np.int64)
    offsets.flags.writeable = False
    if 0 <= count <= _ONE_TOKEN_CACHED:
        _ONE_TOKEN[counts] = count, offsets
    return count, offsets


def _joined(parts: list) -> bytes:
    """The bytes of `parts` one after another: a stream's step is one part of the
    engine core's bytes, handed back as it is."""
    if len(parts) == 1 and type(parts[0]) is bytes:
        return parts[0]
    return b"".join(parts)


def _raw(values, dtype) -> bytes | np.ndarray:
    """`values` as a buffer of `dtype` items (little-endian, as the wire carries
    them): bytes as they came, arrays converted (no copy when they already are)."""
    if isinstance(values, (bytes, bytearray, memoryview)):
        return values
    return np.ascontiguousarray(values, dtype=dtype).reshape(-1)


class _Pending:
    """What `append` kept that no flat array or span has taken yet: one list of parts
    per field (each part the engine core's bytes or an array) and their tokens."""

    __slots__ = ("ids", "counts", "logprobs", "log_kept", "tokens")

    def __init__(self, ids: list, counts: list, logprobs: list, log_kept: list,
                 tokens: int) -> None:
        self.ids, self.counts, self.logprobs, self.log_kept = ids, counts, logprobs, log_kept
        self.tokens = tokens

    @classmethod
    def empty(cls) -> _Pending:
        return cls([], [], [], [], 0)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(ids, counts, logprobs, log_kept), each field's parts as one array."""
        return tuple(np.frombuffer(b"".join(parts), dtype)
                     for parts, dtype in ((self.ids, _I4), (self.counts, _I4),
                                          (self.logprobs, _F4), (self.log_kept, _F4)))


class MaskAccumulator:
    """One request's supports. `with_logprobs`: the request asked for support
    logprobs; each `append` then carries them (float32 aligned with the ids, and log
    S per token). `keep`: spans may be read again (cumulative and final outputs:
    a `KeptMasks`); False for a DELTA request, whose spans are read once each, in
    order (a `ReadOnceMasks`: a span starting before the end of the last one read
    raises)."""

    keep: bool

    def __new__(cls, with_logprobs: bool = False, keep: bool = True):
        if cls is MaskAccumulator:
            cls = KeptMasks if keep else ReadOnceMasks
        return super().__new__(cls)

    def __init__(self, with_logprobs: bool = False, keep: bool = True) -> None:
        self.with_logprobs = with_logprobs
        self._pending = _Pending.empty()   # appended, not yet taken
        # tokens no longer pending: in the flat arrays (kept) or handed out (read once)
        self._taken = 0
        self.reason: str | None = None     # why the mask stopped (None: it did not)
        self._unmasked = 0                 # tokens counted after the stop

    def __len__(self) -> int:
        """Tokens so far, those after a stop included."""
        return self._taken + self._pending.tokens + self._unmasked

    @property
    def first_readable(self) -> int:
        """The first token a span may start at: 0 while spans may be read again,
        else the end of the last span read."""
        return 0 if self.keep else self._taken

    @property
    def stopped_at(self) -> int | None:
        """The first token without a mask, or None while every token has one."""
        return None if self.reason is None else self._taken + self._pending.tokens

    def stop(self, reason: str) -> None:
        """No mask from the next token on (the first reason is kept)."""
        if self.reason is None:
            self.reason = reason

    def skip(self, n: int) -> None:
        """Count `n` tokens that carry no mask (after `stop`)."""
        if self.reason is None:
            raise ValueError("MaskAccumulator.skip: the mask has not stopped")
        self._unmasked += n

    def append(self, ids, counts, logprobs=None, log_kept=None) -> None:
        """Add the supports of `len(counts)` more tokens (ids concatenated), with
        their support logprobs when the request asked for them: int32 ids and
        counts, float32 logprobs and log S, as arrays or their bytes."""
        if self.reason is not None:
            raise ValueError("MaskAccumulator.append: the mask has stopped ("
                             f"{self.reason}); count later tokens with skip")
        if type(ids) is bytes and type(counts) is bytes:   # the engine core's (the hot path)
            n = len(counts) // 4
        else:
            ids, counts = _raw(ids, "<i4"), _raw(counts, "<i4")
            n = _nbytes(counts) // 4
        pending = self._pending
        if self.with_logprobs:
            k = _nbytes(ids) // 4
            if logprobs is None or log_kept is None:
                raise ValueError(f"MaskAccumulator: {k} ids and {n} tokens need as many "
                                 "support logprobs and log S values")
            logprobs, log_kept = _raw(logprobs, "<f4"), _raw(log_kept, "<f4")
            if _nbytes(logprobs) != 4 * k or _nbytes(log_kept) != 4 * n:
                raise ValueError(f"MaskAccumulator: {k} ids and {n} tokens need as many "
                                 "support logprobs and log S values")
            pending.logprobs.append(logprobs)
            pending.log_kept.append(log_kept)
        pending.ids.append(ids)
        pending.counts.append(counts)
        pending.tokens += n

    def mask(self, first: int = 0, last: int | None = None) -> SamplingMask | None:
        """The supports of tokens [first, last) as a SamplingMask; None when the
        span reaches a token past a stop (`reason` says why)."""
        raise NotImplementedError

    def newest(self, n: int) -> SamplingMask | None:
        """`mask` of the last `n` tokens (a DELTA output's): `mask(len(self) - n)`."""
        return self.mask(len(self) - n)


class KeptMasks(MaskAccumulator):
    """Spans read again: what arrived is joined, at the next `mask`, into flat arrays
    (ids, offsets per token; support logprobs and log S when asked) that grow
    amortised, and each span is a view of them."""

    keep = True

    def __init__(self, with_logprobs: bool = False, keep: bool = True) -> None:
        super().__init__(with_logprobs)
        self._ids = np.empty(256, dtype=np.int32)
        self._offsets = np.zeros(64 + 1, dtype=np.int64)
        self._logprobs = np.empty(256 if with_logprobs else 0, dtype=np.float32)
        self._log_kept = np.empty(64 if with_logprobs else 0, dtype=np.float32)

    def _flush(self) -> None:
        """Join what `append` kept into the flat arrays (amortised O(new ids))."""
        pending = self._pending
        if not pending.counts:
            return
        ids, counts, logprobs, log_kept = (
            None if not parts else np.frombuffer(parts[0] if len(parts) == 1
                                                 else b"".join(parts), dtype=dtype)
            for parts, dtype in ((pending.ids, _I4), (pending.counts, _I4),
                                 (pending.logprobs, _F4), (pending.log_kept, _F4)))
        self._pending = _Pending.empty()
        n, k = len(counts), len(ids)
        total = int(counts[0]) if n == 1 else int(counts.sum())
        if total != k:
            raise _unmatched(total, k)
        start = self._offsets[self._taken]
        if start + k > len(self._ids):
            self._ids = np.resize(self._ids, max(2 * len(self._ids), start + k))
            if self.with_logprobs:
                self._logprobs = np.resize(self._logprobs, len(self._ids))
        if self._taken + n + 1 > len(self._offsets):
            self._offsets = np.resize(self._offsets, max(2 * len(self._offsets),
                                                         self._taken + n + 1))
            if self.with_logprobs:
                self._log_kept = np.resize(self._log_kept, len(self._offsets))
        self._ids[start:start + k] = ids
        if self.with_logprobs:
            self._logprobs[start:start + k] = logprobs
            self._log_kept[self._taken:self._taken + n] = log_kept
        if n == 1:      # one token a step (a stream's usual flush)
            self._offsets[self._taken + 1] = start + k
        else:
            np.cumsum(counts, out=self._offsets[self._taken + 1:self._taken + n + 1])
            self._offsets[self._taken + 1:self._taken + n + 1] += start
        self._taken += n

    def mask(self, first: int = 0, last: int | None = None) -> SamplingMask | None:
        self._flush()
        last = len(self) if last is None else last
        if self.reason is not None and (last > self._taken or first >= self._taken):
            return None
        offsets = self._offsets[first:last + 1]
        base = offsets[0]
        end = offsets[-1]
        # the flat arrays are built here, from counts that add up (`_flush`): no
        # need for `SamplingMask.__init__`'s checks
        if not self.with_logprobs:
            return SamplingMask._of(self._ids[base:end], offsets - base)
        return SamplingMask._of(self._ids[base:end], offsets - base,
                                self._logprobs[base:end], self._log_kept[first:last])


class ReadOnceMasks(MaskAccumulator):
    """Each token handed out once, in order: a span's arrays are made straight from
    what arrived since the last one (read-only, over the bytes that came) and nothing
    is kept; tokens before the span that were not read are dropped."""

    keep = False

    def __init__(self, with_logprobs: bool = False, keep: bool = False) -> None:
        super().__init__(with_logprobs)

    def newest(self, n: int) -> SamplingMask | None:
        """A step that brought one token, as the engine core's bytes, is read here
        without another call (the stream's hot path); else `mask`."""
        pending = self._pending
        if (n == 1 == pending.tokens and self.reason is None
                and type(counts := pending.counts[0]) is bytes and len(pending.counts) == 1
                and type(ids := pending.ids[0]) is bytes):
            count, offsets = _ONE_TOKEN.get(counts) or _one_token(counts)
            if 4 * count != len(ids):
                raise _unmatched(count, len(ids) // 4)
            self._drop(self._taken + 1)
            if not self.with_logprobs:
                return SamplingMask._of(np.frombuffer(ids, _I4), offsets)
            return SamplingMask._of(np.frombuffer(ids, _I4), offsets,
                                    np.frombuffer(pending.logprobs[0], _F4),
                                    np.frombuffer(pending.log_kept[0], _F4))
        return self.mask(len(self) - n)

    def mask(self, first: int = 0, last: int | None = None) -> SamplingMask | None:
        """Tokens before `first` not yet read are dropped, those up to `last` become
        the span's own arrays."""
        last = len(self) if last is None else last
        arrived = self._taken + self._pending.tokens
        if first < self._taken or last < first:
            raise ValueError(f"MaskAccumulator: tokens [{first}, {last}) asked of a mask "
                             f"that hands each token out once ({self._taken} read)")
        if self.reason is not None and last > arrived:   # reaches past the stop
            self._drop(arrived)
            return None
        if last > arrived:
            raise ValueError(f"MaskAccumulator: tokens [{first}, {last}) asked, "
                             f"{arrived} arrived")
        if first != self._taken or last != arrived:
            span = self._split(first, last)
        else:
            span = self._pending
            self._drop(last)
        ids, counts = np.frombuffer(_joined(span.ids), "<i4"), _joined(span.counts)
        if len(counts) == 4:      # one token: its count is the ids' number, checked
            (count,) = struct.unpack("<i", counts)
            if count != len(ids):
                raise _unmatched(count, len(ids))
            offsets = np.array((0, count), np.int64)
        else:
            offsets = offsets_of_counts(np.frombuffer(counts, "<i4"), len(ids),
                                        owner="MaskAccumulator")
        if not self.with_logprobs:
            return SamplingMask._of(ids, offsets)
        return SamplingMask._of(ids, offsets, np.frombuffer(_joined(span.logprobs), "<f4"),
                                np.frombuffer(_joined(span.log_kept), "<f4"))

    def _drop(self, read: int) -> None:
        """Forget what is pending: tokens up to `read` have been handed out."""
        self._pending = _Pending.empty()
        self._taken = read

    def _split(self, first: int, last: int) -> _Pending:
        """The pending parts of tokens [first, last), one array per field; those
        before `first` are dropped (a read-once mask never hands them out), those
        from `last` on stay pending."""
        ids, counts, logprobs, log_kept = self._pending.arrays()
        offsets = offsets_of_counts(counts, len(ids), owner="MaskAccumulator")
        cut = [0, first - self._taken, last - self._taken, len(counts)]
        at = [int(offsets[c]) for c in cut]

        def part(k: int) -> _Pending:
            return _Pending([ids[at[k]:at[k + 1]]], [counts[cut[k]:cut[k + 1]]],
                            [logprobs[at[k]:at[k + 1]]] if self.with_logprobs else [],
                            [log_kept[cut[k]:cut[k + 1]]] if self.with_logprobs else [],
                            cut[k + 1] - cut[k])
        span = part(1)
        self._pending, self._taken = part(2), last
        return span
