"""The packed wire format of sampling masks: a compact, opt-in alternative to JSON lists.

Plain module: numpy and the standard library only (no torch, no vLLM). The API
server encodes with `encode_packed` when a request says
`sampling_mask_format: "packed"`; `SamplingMask.from_response` decodes it.

JSON (one choice's `sampling_mask`, or one stream chunk's):

    {"format": "packed-varint-v1", "tokens": T, "data": "<base64>"}

`data` is base64 (RFC 4648, standard alphabet, padded) of one stream of unsigned
LEB128 varints (7 value bits per byte, least significant group first, high bit
set on every byte but a value's last):

    count[0] .. count[T-1]                  support size of each token, in order
    then, for each token t, its ids ascending as deltas:
        ids[t][0]                           the first id itself
        ids[t][j] - ids[t][j-1] - 1         for j >= 1 (ids are distinct)

With support logprobs (`return_sampling_mask_logprobs`), the object has two more
keys, each base64 of little-endian IEEE-754 float32 values, back to back:

    "logprobs"   one per id, in the order the ids are encoded (token by token,
                 ascending within a token): each id's processed logprob
    "log_kept"   one per token: log S

An empty mask (T = 0) is `{"format": ..., "tokens": 0, "data": ""}`. Decoders
must refuse another `format` string: a later layout gets a new tag.

Both directions are vectorised (a handful of numpy passes over the ids, no
per-id Python), except that a mask of fewer than 128 ids (a stream chunk) is
encoded by a plain loop to the same bytes: numpy's per-call cost dominates there.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np

__all__ = ["encode_floats", "decode_floats", "PACKED_FORMAT", "MASK_FORMATS", "encode_packed", "decode_packed",
           "encode_varints", "decode_varints", "is_packed"]

PACKED_FORMAT = "packed-varint-v1"
MASK_FORMATS = ("lists", "packed")   # the request field `sampling_mask_format`
_MAX_BYTES = 10                        # a uint64 takes at most 10 varint bytes


_SHIFTS = np.arange(0, 7 * _MAX_BYTES, 7, dtype=np.uint64)   # 0, 7, ..., 63


def encode_varints(values: np.ndarray) -> bytes:
    """Unsigned LEB128 of every value (non-negative integers), concatenated.

    One `[n, B]` table of 7-bit groups, B the widest value's byte count: a group is
    written when it or a higher one is non-zero (group 0 always), with the
    continuation bit when a higher group is written; row-major order of the written
    groups is the stream."""
    v = np.asarray(values).astype(np.uint64, copy=False).reshape(-1)
    if len(v) == 0:
        return b""
    width = max(1, (int(v.max()).bit_length() + 6) // 7)
    groups = v[:, None] >> _SHIFTS[:width]
    written = groups != 0
    written[:, 0] = True
    table = (groups & np.uint64(0x7F)).astype(np.uint8)
    table[:, :-1] |= written[:, 1:].view(np.uint8) << 7
    return table[written].tobytes()


def decode_varints(data: bytes | np.ndarray) -> np.ndarray:
    """The values of a stream of unsigned LEB128 varints, as int64."""
    b = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) \
        else np.asarray(data, np.uint8)
    if len(b) == 0:
        return np.zeros(0, np.int64)
    last = b < 0x80
    if not last[-1]:
        raise ValueError("packed sampling mask: the varint stream ends inside a value")
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 9:       # ids and counts fit in 63 bits by far
        raise ValueError("packed sampling mask: a varint longer than 9 bytes")
    owner_start = np.repeat(starts, lengths)
    shift = (np.arange(len(b)) - owner_start).astype(np.uint64) * np.uint64(7)
    contrib = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(contrib, starts).astype(np.int64)


_FAST_LIMIT = 1 << 21   # values below it take at most 3 varint bytes


def _varints_3(v: np.ndarray) -> bytes:
    """`encode_varints` of uint32 values below 2**21 (ids and counts of any real
    vocabulary): a `[n, 3]` byte table in uint32/uint8 arithmetic, the written
    bytes picked row-major."""
    c1 = v >= 0x80
    c2 = v >= 0x4000
    table = np.empty((len(v), 3), np.uint8)
    table[:, 0] = (v & 0x7F) | (c1.view(np.uint8) << 7)
    table[:, 1] = ((v >> 7) & 0x7F) | (c2.view(np.uint8) << 7)
    table[:, 2] = v >> 14
    written = np.empty((len(v), 3), bool)
    written[:, 0] = True
    written[:, 1] = c1
    written[:, 2] = c2
    return table[written].tobytes()


# Below this many ids (a stream chunk's few tokens), numpy's per-call cost is most
# of the work: the same bytes are written by a plain loop over the ids.
_SMALL = 128


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _encode_small(ids: list[int], offsets: list[int]) -> bytes:
    """`encode_packed`'s varint stream for a few ids, without numpy."""
    out = bytearray()
    for t in range(len(offsets) - 1):
        _varint(offsets[t + 1] - offsets[t], out)
    for t in range(len(offsets) - 1):
        previous = -1
        for token_id in ids[offsets[t]: offsets[t + 1]]:
            if token_id <= previous:
                raise ValueError("packed sampling mask: each support must be strictly "
                                 "ascending")
            _varint(token_id - previous - 1 if previous >= 0 else token_id, out)
            previous = token_id
    return bytes(out)


def encode_packed(ids: np.ndarray, counts: np.ndarray | None = None, *,
                  offsets: np.ndarray | None = None) -> dict:
    """The packed JSON object of a mask: `ids` every support concatenated in
    generation order (each strictly ascending), and either `counts` (the size of
    each support) or `offsets` (`SamplingMask.offsets`, length T + 1)."""
    if len(ids) < _SMALL and offsets is not None:
        bounds = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
        values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        if all(v >= 0 for v in values):
            raw = _encode_small(values, bounds)
            return {"format": PACKED_FORMAT, "tokens": len(bounds) - 1,
                    "data": base64.b64encode(raw).decode("ascii")}
    ids = np.asarray(ids).reshape(-1)
    if offsets is None:
        counts = np.asarray(counts).astype(np.int64, copy=False).reshape(-1)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
    else:
        offsets = np.asarray(offsets).astype(np.int64, copy=False).reshape(-1)
    tokens, n = len(offsets) - 1, len(ids)
    values = np.empty(tokens + n, np.int64)
    np.subtract(offsets[1:], offsets[:-1], out=values[:tokens])
    deltas = values[tokens:]
    if n:
        deltas[0] = ids[0]
        np.subtract(ids[1:], ids[:-1], out=deltas[1:], casting="unsafe")
        deltas[1:] -= 1
        starts = offsets[:-1]
        starts = starts[starts < n]             # empty supports start nowhere new
        deltas[starts] = ids[starts]
        if deltas.min() < 0:
            raise ValueError("packed sampling mask: each support must be strictly ascending")
    if len(values) and values.max() < _FAST_LIMIT:
        raw = _varints_3(values.astype(np.uint32))
    else:
        raw = encode_varints(values)
    return {"format": PACKED_FORMAT, "tokens": tokens,
            "data": base64.b64encode(raw).decode("ascii")}


def encode_floats(values) -> str:
    """base64 of `values` as little-endian float32."""
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def decode_floats(data: str, expected: int, what: str) -> np.ndarray:
    """The float32 values of `encode_floats`; ValueError unless there are `expected`."""
    raw = base64.b64decode(data, validate=True)
    if len(raw) != 4 * expected:
        raise ValueError(f"packed sampling mask: {what} holds {len(raw)} bytes, "
                         f"{4 * expected} expected ({expected} float32)")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def is_packed(value) -> bool:
    return isinstance(value, Mapping) and "format" in value


def decode_packed(obj: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32, counts int64) of a packed mask object."""
    if obj.get("format") != PACKED_FORMAT:
        raise ValueError(f"packed sampling mask: unknown format {obj.get('format')!r} "
                         f"(this decoder reads {PACKED_FORMAT!r})")
    tokens = int(obj["tokens"])
    values = decode_varints(base64.b64decode(obj["data"], validate=True))
    if len(values) < tokens:
        raise ValueError(f"packed sampling mask: {len(values)} values for {tokens} counts")
    counts = values[:tokens]
    deltas = values[tokens:]
    if int(counts.sum()) != len(deltas):
        raise ValueError(f"packed sampling mask: counts sum to {int(counts.sum())}, "
                         f"{len(deltas)} ids follow")
    if len(deltas) == 0:
        return np.zeros(0, np.int32), counts
    steps = deltas + 1
    starts = np.cumsum(counts) - counts
    starts = starts[counts > 0]
    steps[starts] = deltas[starts]               # a token's first id is absolute
    running = np.cumsum(steps)
    base = running[starts] - deltas[starts]      # the running sum before each token
    ids = running - np.repeat(base, counts[counts > 0])
    return ids.astype(np.int32), counts
