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

An empty mask (T = 0) is `{"format": ..., "tokens": 0, "data": ""}`. Decoders
must refuse another `format` string: a later layout gets a new tag.

Both directions are vectorised (a handful of numpy passes over the ids, no
per-id Python).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import numpy as np

__all__ = ["PACKED_FORMAT", "MASK_FORMATS", "encode_packed", "decode_packed",
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


def encode_packed(ids: np.ndarray, counts: np.ndarray) -> dict:
    """The packed JSON object of a mask: `ids` every support concatenated in
    generation order (each ascending), `counts` the size of each support."""
    ids = np.asarray(ids).astype(np.int64, copy=False).reshape(-1)
    counts = np.asarray(counts).astype(np.int64, copy=False).reshape(-1)
    values = np.empty(len(counts) + len(ids), np.int64)
    values[:len(counts)] = counts
    deltas = values[len(counts):]
    if len(ids):
        deltas[0] = ids[0]
        np.subtract(ids[1:], ids[:-1] + 1, out=deltas[1:])
        starts = np.cumsum(counts[:-1])
        starts = starts[starts < len(ids)]      # empty supports start nowhere new
        deltas[starts] = ids[starts]
        if deltas.min() < 0:
            raise ValueError("packed sampling mask: each support must be strictly ascending")
    return {"format": PACKED_FORMAT, "tokens": len(counts),
            "data": base64.b64encode(encode_varints(values)).decode("ascii")}


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
