"""The packed wire format of sampling masks: a compact, opt-in alternative to JSON lists.

Plain module: numpy and the standard library only (no torch, no vLLM). The API
server encodes with `encode_packed` when a request says
`sampling_mask_format: "packed"`; `SamplingMask.from_response` decodes it.

JSON (one choice's `sampling_mask`, or one stream chunk's):

    {"format": "packed-rice-v2", "tokens": T, "data": "<base85>"}

Text encoding. `data` (and `logprobs`, `log_kept` below) is base85 with the
alphabet of RFC 1924 and Python's `base64.b85encode`:

    0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~

(character i is digit i; no `"`, `\\` or control character, so JSON writes it
unescaped). Each 4 bytes, read as a big-endian uint32, become 5 digits, most
significant first. A last group of r = 1..3 bytes is padded with zero bytes to 4,
encoded, and only its first r + 1 characters kept; a decoder pads such a group
with `~` (84) back to 5 and keeps the first r bytes. A text whose length is 1 more
than a multiple of 5, a character outside the alphabet, or a group worth 2**32 or
more is invalid.

Binary layout of `data` (v2). T is the object's `tokens`; k[t] the size of token
t's support, n = sum k; ids[t] its ids, strictly ascending. T = 0 is `data: ""`.
Otherwise the bytes are a header, section A and section B, in that order:

    header  two unsigned LEB128 varints (7 value bits per byte, least significant
            group first, high bit set on every byte but a value's last):
              g   the count code's order, 0 <= g <= 31
              R   one more than the largest id in the mask; 0 when n = 0.
                  R <= 2**31, every id < R.
    A       a bit string, most significant bit of each byte first, ending with
            zero bits up to the next byte boundary (fewer than 8), made of
              A1  for each token t: z[t] zero bits, then a one bit
              A2  for each token t: the low w[t] bits of v[t], most significant first
              A3  for each token t, for each of its ids j: the low b[t] bits of
                  gap[t][j], most significant first
    B       a bit string in the same bit order, ending with zero bits up to the
            next byte boundary (fewer than 8), made of
              for each token t, for each of its ids j: q[t][j] zero bits, then a
              one bit.
            B's last byte holds its last one bit; nothing follows B. When
            n = 0, B is empty.

  with, per token (the count: exp-Golomb of order g, its prefix in A1, its
  mantissa in A2; the ids: Rice codes, the quotient in B, the remainder in A3)

    v[t] = k[t] + 2**g,   w[t] = bit_length(v[t]) - 1,   z[t] = w[t] - g
    b[t] = max(0, bit_length(R // (k[t] + 1)) - 1)   (max(0, floor(log2(R / (k + 1)))))
    gap[t][0] = ids[t][0],  gap[t][j] = ids[t][j] - ids[t][j-1] - 1  (j >= 1)
    q[t][j]   = gap[t][j] >> b[t],  the remainder gap[t][j] & (2**b[t] - 1)

A decoder reads the header; the first T one bits of A are A1 (so the z[t], w[t]),
then A2 gives the counts (v[t] = 2**w[t] + the w[t] bits; k[t] = v[t] - 2**g), the
counts give the b[t] and so A3's length, B starts at the next byte, and its n one
bits give the q. The encoder here writes R = max id + 1 and
g = max(0, bit_length(n // T) - 2); a decoder takes both from the header. This one
refuses (ValueError) data that ends early or goes on past B, non-zero padding, a
w[t] past 32, an id at or past R, g past 31 or R past 2**31.

Example: supports [3, 4, 300] and [7] (n = 4, g = 0, R = 301, b = 6 and 7) are the
bytes 00 AD 02 | 28 0C 09 C3 80 | C3, `"data": "0IdQj3<<-4!v"`:

    header  00 AD 02     g = 0; R = 301 = 0b10_0101101 as LEB128
    A       001 01 | 00 0 | 000011 000000 100111 | 0000111 | 0000000
            A1 (z = 2, 1) | A2 (4 -> 00, 2 -> 0) | token 0's remainders
            (3, 0, 295 & 63 = 39) | token 1's (7) | padding
    B       1 1 00001 1  (quotients 0, 0, 295 >> 6 = 4, 0)

Support logprobs (`return_sampling_mask_logprobs`): the object has two more keys,
each the base85 above of little-endian IEEE-754 float32 values, back to back:

    "logprobs"   one per id, in the order the ids are encoded (token by token,
                 ascending within a token): each id's processed logprob
    "log_kept"   one per token: log S

`decode_packed` also reads the earlier layout, `"format": "packed-varint-v1"`:
`data` is base64 (RFC 4648, standard alphabet, padded) of unsigned LEB128 varints,
the T counts, then per token its first id and each gap (as above); its `logprobs`
and `log_kept` are base64 float32. Any other `format` string is refused (a later
layout gets a new tag).

Both directions are vectorised (numpy passes over the ids, no per-id Python):
the fields of A (and of B) are placed into 64-bit words (`_pack_fields`), the
decoder finds A1's and B's one bits with `np.unpackbits` and reads fixed-width
fields from 64-bit windows of the data. Where numpy's per-call cost would dominate,
plain loops do the same work: a mask of fewer than 128 ids (a stream chunk) is
encoded over Python integers to the same bytes, and data under 256 bytes are read
as a str of bits.

The API server encodes with the compiled encoder, `_packed_native` (C, built by
setup.py where a compiler is there), when it is built: the same bytes, written in
one pass over the tokens and two over the ids, then base85 straight into the str
(`NATIVE` says whether it is). The numpy and plain-Python encoders above are the
fallback and the reference the tests hold it to. It also writes a stream chunk's mask
as JSON text in one call: `packed_json`, the whole packed object's text, and
`lists_json`, what `json.dumps` makes of `SamplingMask.token_ids`, without building
the lists (None without the compiled encoder).
"""

from __future__ import annotations

import base64
import json
import operator
import struct
from collections.abc import Callable, Mapping

import numpy as np

try:
    from vllm_sampling_mask.formats import _packed_native
except ImportError:          # not built (no C compiler at install): numpy and Python
    _packed_native = None

__all__ = ["encode_floats", "decode_floats", "PACKED_FORMAT", "PACKED_FORMAT_V1",
           "PACKED_FORMATS", "MASK_FORMATS", "encode_packed", "encode_packed_v1",
           "decode_packed", "encode_varints", "decode_varints", "b85encode", "b85decode",
           "is_packed", "lists_json", "packed_json", "offsets_of_counts", "NATIVE",
           "LISTS_JSON", "PACKED_JSON"]

PACKED_FORMAT = "packed-rice-v2"           # what `encode_packed` writes
PACKED_FORMAT_V1 = "packed-varint-v1"      # the earlier layout, still decoded
PACKED_FORMATS = (PACKED_FORMAT, PACKED_FORMAT_V1)
MASK_FORMATS = ("lists", "packed")         # the request field `sampling_mask_format`
NATIVE = _packed_native is not None      # whether the compiled encoder is built
# the compiled `lists_json(ids, offsets)` (None where not built): a stream chunk's
# mask written with no Python call between (see `lists_json`)
LISTS_JSON = None if _packed_native is None else _packed_native.lists_json
# and `packed_json(ids, offsets)`, the same way (None where not built; the compiled
# call returns None for arrays it does not take)
PACKED_JSON = None if _packed_native is None else _packed_native.packed_json
_ID_LIMIT = 1 << 31                        # ids are int32
_MAX_G = 31
_MAX_COUNT_WIDTH = 32                      # w[t]: counts (at most n) below 2**32

# Below this many ids (a stream chunk's few tokens), numpy's per-call cost is most
# of the work: the same bytes are written by a plain loop over the ids.
_SMALL = 128


def _error(message: str) -> ValueError:
    return ValueError(f"packed sampling mask: {message}")


# -- base85 (RFC 1924 alphabet, as `base64.b85encode`) ---------------------------

_B85_ALPHABET = (b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                 b"abcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~")
_B85_VALUES = bytes(_B85_ALPHABET.index(c) if c in _B85_ALPHABET else 255
                    for c in range(256))          # character -> its digit value
_B85_POWERS = np.array([85 ** 4, 85 ** 3, 85 ** 2, 85, 1], np.uint32)
_B85_TRANSLATE = _B85_ALPHABET + bytes(256 - 85)     # digit value -> its character
_B85_SMALL = 64     # bytes; below it a plain loop (`_b85encode_small`) is quicker
_B85_PAIR_TEXT = [_B85_ALPHABET[i // 85: i // 85 + 1].decode() + _B85_ALPHABET[i % 85:
                  i % 85 + 1].decode() for i in range(85 * 85)]
_B85_TEXT = [chr(c) for c in _B85_ALPHABET]
_UINT32_BE: dict[int, Callable] = {}     # struct unpackers of m big-endian uint32
_B85_MID = 1024     # bytes; below it one broadcast division is quicker than a loop of five


def _b85encode_small(raw: bytes) -> str:
    """`b85encode` by a loop over the groups (for a stream chunk's few bytes)."""
    full, rest = divmod(len(raw), 4)
    if rest:
        raw = bytes(raw) + bytes(4 - rest)
    groups = len(raw) // 4
    unpack = _UINT32_BE.get(groups)
    if unpack is None:
        unpack = _UINT32_BE.setdefault(groups, struct.Struct(f">{groups}I").unpack)
    pairs, single = _B85_PAIR_TEXT, _B85_TEXT
    parts: list[str] = []
    add = parts.append
    for word in unpack(raw):
        high, low = divmod(word, 85 ** 3)
        add(pairs[high])
        add(pairs[low // 85])
        add(single[low % 85])
    text = "".join(parts)
    return text[:5 * full + rest + 1] if rest else text


def b85encode(raw: bytes) -> str:
    """base85 text of `raw`: the same characters as `base64.b85encode(raw)`
    (unpadded); the compiled encoder's where it is built, else `_b85encode_py`."""
    if _packed_native is not None:
        return _packed_native.b85encode(raw)
    return _b85encode_py(raw)


def _b85encode_py(raw: bytes) -> str:
    """`b85encode` without the compiled encoder: with numpy past a few dozen
    bytes (the digits of each group's uint32 by division, as bytes 0..84, mapped to
    the alphabet by `bytes.translate`), a plain loop below."""
    if len(raw) < _B85_SMALL:
        return _b85encode_small(raw)
    full, rest = divmod(len(raw), 4)
    if rest:
        raw = bytes(raw) + bytes(4 - rest)
    if len(raw) < _B85_MID:
        digits = np.frombuffer(raw, ">u4")[:, None] // _B85_POWERS
        digits %= np.uint32(85)
        out = digits.astype(np.uint8).tobytes().translate(_B85_TRANSLATE)
    else:
        w = np.frombuffer(raw, ">u4").astype(np.uint32)
        text = np.empty((len(w), 5), np.uint8)
        for i in range(4, 0, -1):
            quotient = w // np.uint32(85)
            text[:, i] = w - quotient * np.uint32(85)
            w = quotient
        text[:, 0] = w
        out = text.tobytes().translate(_B85_TRANSLATE)
    if rest:
        out = out[:5 * full + rest + 1]
    return out.decode("ascii")


def b85decode(text: str) -> bytes:
    """The bytes of `b85encode` text; ValueError for a character outside the
    alphabet, a group worth 2**32 or more, or a length of 5m + 1."""
    if not isinstance(text, str):
        raise _error(f"expected base85 text, got {type(text).__name__}")
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise _error("the base85 text holds a non-ASCII character") from None
    if len(raw) % 5 == 1:
        raise _error("the base85 text has a length of 5m + 1, which no bytes encode to")
    if raw.translate(None, _B85_ALPHABET):
        raise _error("the base85 text holds a character outside its alphabet")
    pad = -len(raw) % 5
    if len(raw) < 5 * _B85_SMALL // 4:
        try:
            return base64.b85decode(raw)
        except ValueError:
            raise _error("a base85 group is worth 2**32 or more") from None
    digits = np.frombuffer((raw + b"~" * pad).translate(_B85_VALUES), np.uint8).reshape(-1, 5)
    words = digits[:, 0].astype(np.uint64)
    for i in range(1, 5):
        words *= np.uint64(85)
        words += digits[:, i]
    if len(words) and words.max() >= np.uint64(1 << 32):
        raise _error("a base85 group is worth 2**32 or more")
    out = words.astype(">u4").tobytes()
    return out[:len(out) - pad]


# -- LEB128 varints (v1's stream, v2's header) ------------------------------------

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
        raise _error("the varint stream ends inside a value")
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 9:       # ids and counts fit in 63 bits by far
        raise _error("a varint longer than 9 bytes")
    owner_start = np.repeat(starts, lengths)
    shift = (np.arange(len(b)) - owner_start).astype(np.uint64) * np.uint64(7)
    contrib = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(contrib, starts).astype(np.int64)


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _uleb128(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    _varint(value, out)
    return bytes(out)


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    """(value, next position) of the varint at raw[at]."""
    value = shift = 0
    while True:
        if at >= len(raw):
            raise _error("the data ends inside its header")
        byte = raw[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 35:
            raise _error("a header varint longer than 5 bytes")


# -- shared: the layout's inputs ------------------------------------------------

def offsets_of_counts(counts, ids: int | None = None, *,
                      owner: str = "packed sampling mask") -> np.ndarray:
    """The offsets (int64 [T + 1], from 0) of supports of `counts` ids each, back to
    back (`SamplingMask.offsets`). With `ids`, the counts must add up to that many:
    else a ValueError naming `owner`."""
    counts = np.asarray(counts).astype(np.int64, copy=False).reshape(-1)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    if ids is not None and offsets[-1] != ids:
        raise ValueError(f"{owner}: counts add up to {int(offsets[-1])}, not the {ids} ids "
                         "given")
    return offsets


def _offsets_of(ids: np.ndarray, counts, offsets) -> np.ndarray:
    """The mask's offsets from its `counts` or as given, checked against its ids."""
    if offsets is None:
        return offsets_of_counts(counts, len(ids))
    offsets = np.asarray(offsets).astype(np.int64, copy=False).reshape(-1)
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
        raise _error(f"the supports hold {int(offsets[-1]) if len(offsets) else 0} ids, "
                     f"{len(ids)} given")
    return offsets


def _gaps(ids: np.ndarray, offsets: np.ndarray, nonempty: np.ndarray) -> np.ndarray:
    """Each token's first id, then its gaps minus one (int32 for int32 ids);
    ValueError unless every support is strictly ascending and in [0, 2**31)."""
    n = len(ids)
    if ids.dtype != np.int32:
        if int(ids.max()) >= _ID_LIMIT:
            raise _error(f"id {int(ids.max())} is past 2**31 - 1")
        if int(ids.min()) >= 0:
            ids = ids.astype(np.int32)
    if int(ids.min()) < 0:
        raise _error("ids must be non-negative")
    gaps = np.empty(n, ids.dtype)
    gaps[0] = ids[0]
    np.subtract(ids[1:], ids[:-1], out=gaps[1:])
    np.subtract(gaps[1:], 1, out=gaps[1:])
    starts = offsets[:-1][nonempty]
    gaps[starts] = ids[starts]
    if int(gaps.min()) < 0:
        raise _error("each support must be strictly ascending")
    return gaps


# -- v2: writing ----------------------------------------------------------------

_U6, _U64, _U128 = (np.uint64(v) for v in (6, 64, 128))
_JOIN = 4096        # fields; from here on, neighbours are joined before placing
_ONE_PASS = 16384   # ids; below it A and B are placed in one pass (above, in two: memory)


def _join(values: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of neighbouring fields as one field, twice while every field is at
    most 16 bits (else once), so at most 64 bits: uint64 values, uint8 widths."""
    odd = widths[1::2]
    joined = np.left_shift(values[0::2], odd, dtype=np.uint64)
    joined |= values[1::2]
    widths = widths[0::2] + odd
    if int(widths.max()) > 32:
        return joined, widths
    odd = widths[1::2]
    values = joined[0::2] << odd
    values |= joined[1::2]
    return values, widths[0::2] + odd


def _pack_fields(values: np.ndarray, widths: np.ndarray) -> bytes:
    """The bit string of `values[i]` in `widths[i]` bits (most significant first),
    back to back, zero-padded to whole bytes. Unsigned values, each below
    2**widths[i]; uint8 widths, 0..32; a length that is a multiple of 4.

    Past a few thousand fields, neighbours are joined first (`_join`), which
    leaves fewer, wider fields (at most 64 bits). Each field lands in the 64-bit
    big-endian word holding its first bit, its low bits spilling into the next
    word when it crosses. Fields never share a bit, so a word is the sum of its
    fields' parts (`np.add.at`). Shift counts are uint64 and wrap below 0: numpy's
    shifts by 64 or more give 0, which drops the part a field lacks."""
    if len(values) >= _JOIN:
        values, widths = _join(values, widths)
    else:
        values = values.astype(np.uint64)
    ends = np.cumsum(widths, dtype=np.uint64)
    total = int(ends[-1])
    word = ends - widths
    del widths
    word >>= _U6
    ends -= word << _U6                                  # 1..127 past the word's start
    high = values << (_U64 - ends)
    high |= values >> (ends - _U64)
    values <<= _U128 - ends                              # the low part
    del ends
    word = word.view(np.int64)
    words = np.zeros(total // 64 + 2, np.uint64)     # a last empty field may start a word
    np.add.at(words, word, high)
    del high
    word += 1
    np.add.at(words, word, values)
    return words.astype(">u8").tobytes()[:(total + 7) // 8]


def _pack_unary(quotients: np.ndarray) -> bytes:
    """Each q as q zero bits and a one bit, back to back, zero-padded to whole
    bytes: fields of q + 1 bits worth 1 while every q is below 32, else a bit array."""
    n = len(quotients)
    if int(quotients.max()) < 32:
        widths = np.zeros(n + (-n % 4), np.uint8)
        np.add(quotients, 1, out=widths[:n], casting="unsafe")
        return _pack_fields(widths != 0, widths)
    ones = np.cumsum(quotients + 1)
    total = int(ones[-1])
    ones -= 1
    bits = np.zeros((total + 7) // 8 * 8, np.uint8)
    bits[ones] = 1
    return np.packbits(bits).tobytes()


# b from the float64 exponent e of R / (k + 1) (2**(e-1) <= R / (k + 1) < 2**e):
# max(0, e - 1); an e below 0 (R < (k + 1) / 2) clips to index 0
_RICE_OF_EXPONENT = np.maximum(np.arange(-1, 63), 0).astype(np.uint8)


def _rice_parameters(limit: int, counts: np.ndarray) -> np.ndarray:
    """b = max(0, floor(log2(R / (k + 1)))) per token, uint8, from the float64
    quotient: R <= 2**31 keeps a quotient that is not a power of two at least
    2**-31 (relative) away from one, far past float64's rounding (2**-53)."""
    return _RICE_OF_EXPONENT.take(np.frexp(limit / (counts + 1))[1], mode="clip")


def _count_order(n: int, tokens: int) -> int:
    return max(0, (n // tokens).bit_length() - 2)


def _encode_v2(ids: np.ndarray, offsets: np.ndarray) -> bytes:
    tokens, n = len(offsets) - 1, len(ids)
    if tokens == 0:
        return b""
    counts = np.diff(offsets)
    if int(counts.min()) < 0:
        raise _error("offsets must be non-decreasing")
    if n:
        gaps = _gaps(ids, offsets, counts > 0)
        limit = int(ids.max()) + 1
        # the ids: Rice codes, the parameter b = floor(log2(R / (k + 1))) per token
        shift = np.repeat(_rice_parameters(limit, counts), counts)
        quotients = gaps >> shift
        gaps -= quotients << shift
        one_pass = n < _ONE_PASS and int(quotients.max()) < 32
    else:
        limit = 0
        one_pass = False
    order = _count_order(n, tokens)
    header = _uleb128(order) + _uleb128(limit)
    # the fields: A1 (z zeros and a one), A2 (the counts' low bits), A3 (the ids'
    # remainders); in one pass also a padding field to A's byte boundary and B
    # (q zeros and a one); zero-width fields up to a multiple of 4
    a_end = 2 * tokens + n
    size = a_end + 1 + n if one_pass else a_end
    fields = np.zeros(size + (-size % 4), np.uint32)
    widths = np.zeros(size + (-size % 4), np.uint8)
    v = counts + (1 << order)
    width = np.frexp(v.astype(np.float64))[1]
    width -= 1                                                 # bit_length(v) - 1
    fields[:tokens] = 1
    np.subtract(width, order - 1, out=widths[:tokens], casting="unsafe")    # z + 1
    np.subtract(v, np.left_shift(1, width, dtype=np.int64), out=fields[tokens:2 * tokens],
                casting="unsafe")
    widths[tokens:2 * tokens] = width
    if n == 0:
        return header + _pack_fields(fields, widths)
    fields[2 * tokens:a_end] = gaps
    widths[2 * tokens:a_end] = shift
    del gaps, shift
    if one_pass:
        widths[a_end] = -(int(widths[:a_end].sum(dtype=np.int64))) % 8
        fields[a_end + 1:size] = 1
        np.add(quotients, 1, out=widths[a_end + 1:size], casting="unsafe")
        return header + _pack_fields(fields, widths)
    a = _pack_fields(fields, widths)
    del fields, widths
    return header + a + _pack_unary(quotients)


def _encode_v2_small(ids: list[int], bounds: list[int]) -> bytes:
    """`_encode_v2`'s bytes for a few ids, with Python integers only (A and B
    built most significant bit first, in one int each; B from a leading 1 that
    marks its length)."""
    tokens, n = len(bounds) - 1, len(ids)
    if tokens < 0 or bounds[0] != 0 or bounds[-1] != n:
        raise _error(f"the offsets do not span the {n} ids")
    if tokens == 0:
        return b""
    if tokens == 1:                              # a stream chunk: A1 and A2 are v's bits
        order = max(0, n.bit_length() - 2)
        v = n + (1 << order)
        acc = v
        nbits = 2 * v.bit_length() - order - 1
        limit = ids[-1] + 1 if n else 0
        if n and ids[0] < 0:
            raise _error("ids must be non-negative")
    else:
        order = _count_order(n, tokens)
        base = 1 << order
        a1 = a2 = bits1 = bits2 = limit = start = 0
        for end in bounds[1:]:                   # A1, A2 and the bound R
            k = end - start
            if k:
                if k < 0 or end > n:
                    raise _error("offsets must be non-decreasing")
                if ids[start] < 0:
                    raise _error("ids must be non-negative")
                if ids[end - 1] >= limit:
                    limit = ids[end - 1] + 1
            v = k + base
            width = v.bit_length() - 1
            a1 = (a1 << (width - order + 1)) | 1
            bits1 += width - order + 1
            a2 = (a2 << width) | (v - (1 << width))
            bits2 += width
            start = end
        acc = (a1 << bits2) | a2
        nbits = bits1 + bits2
    if limit > _ID_LIMIT:
        raise _error(f"id {limit - 1} is past 2**31 - 1")
    unary = 1
    start = 0
    for end in bounds[1:]:                       # A3 and B
        if end == start:
            continue
        rice = (limit // (end - start + 1)).bit_length() - 1
        if rice < 0:
            rice = 0
        low = (1 << rice) - 1
        nbits += rice * (end - start)
        following = 0                            # the least id the next may be
        for token_id in ids[start:end]:
            gap = token_id - following
            if gap < 0:
                raise _error("each support must be strictly ascending")
            following = token_id + 1
            acc = (acc << rice) | (gap & low)
            unary = (unary << ((gap >> rice) + 1)) | 1
        start = end
    pad = -nbits % 8
    out = _uleb128(order) + _uleb128(limit) + (acc << pad).to_bytes((nbits + pad) // 8, "big")
    if n:
        ubits = unary.bit_length() - 1
        pad = -ubits % 8
        out += ((unary - (1 << ubits)) << pad).to_bytes((ubits + pad) // 8, "big")
    return out


def encode_packed(ids: np.ndarray, counts: np.ndarray | None = None, *,
                  offsets: np.ndarray | None = None) -> dict:
    """The packed JSON object (`packed-rice-v2`) of a mask: `ids` every support
    concatenated in generation order (each strictly ascending, ids in
    [0, 2**31)), and either `counts` (the size of each support) or `offsets`
    (`SamplingMask.offsets`, length T + 1)."""
    if _packed_native is not None:
        if offsets is None and counts is not None:
            offsets = offsets_of_counts(counts)
        # None: not 1-D C-ordered int32 ids and int64 offsets (the arrays of a
        # `SamplingMask`), or not a valid mask: the encoders below take it
        data = _packed_native.encode_v2(ids, offsets)
        if data is not None:
            return {"format": PACKED_FORMAT, "tokens": len(offsets) - 1, "data": data}
    return _encode_packed_py(ids, counts, offsets=offsets)


def _encode_packed_py(ids: np.ndarray, counts: np.ndarray | None = None, *,
                      offsets: np.ndarray | None = None) -> dict:
    """`encode_packed` without the compiled encoder: numpy, or a plain loop for
    a mask of fewer than 128 ids."""
    if offsets is not None and len(ids) < _SMALL and len(offsets):
        bounds = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
        values = ids.reshape(-1).tolist() if isinstance(ids, np.ndarray) else list(ids)
        return {"format": PACKED_FORMAT, "tokens": len(bounds) - 1,
                "data": b85encode(_encode_v2_small(values, bounds))}
    ids = np.asarray(ids).reshape(-1)
    offsets = _offsets_of(ids, counts, offsets)
    return {"format": PACKED_FORMAT, "tokens": len(offsets) - 1,
            "data": b85encode(_encode_v2(ids, offsets))}


# -- v2: reading ----------------------------------------------------------------

def _windows(body: np.ndarray) -> np.ndarray:
    """The 64 bits from each 32-bit boundary of `body` on (zeros past its end),
    as uint64: window j holds bits 32j .. 32j + 63."""
    size = len(body)
    padded = np.zeros(4 * ((size + 3) // 4 + 2), np.uint8)
    padded[:size] = body
    words = padded.view(">u4").astype(np.uint64)
    windows = words[:-1] << np.uint64(32)
    windows |= words[1:]
    return windows


def _read_fields(windows: np.ndarray, starts: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """The `widths[i]`-bit values (0..32 bits) at bit positions `starts[i]`, from
    `_windows` of the bit string, int64."""
    word = windows[starts >> 5]
    word <<= (starts & 31).astype(np.uint64)
    word >>= (63 - widths).astype(np.uint64)
    word >>= np.uint64(1)
    return word.astype(np.int64)


def _first_ones(body: np.ndarray, count: int) -> np.ndarray:
    """Bit positions of the first `count` one bits of `body` (most significant bit
    of each byte first); ValueError when it holds fewer."""
    guess = min(len(body), count + 8)             # A1 takes about 2 to 4 bits a token
    ones = np.flatnonzero(np.unpackbits(body[:guess]))
    if len(ones) < count and guess < len(body):
        ones = np.flatnonzero(np.unpackbits(body))
    if len(ones) < count:
        raise _error(f"the data ends before the sizes of {count} tokens")
    return ones[:count]


_DECODE_SMALL = 256     # bytes; below it `_decode_v2_small` reads the bits as a str


def _decode_v2(raw: bytes, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    if tokens == 0:
        if raw:
            raise _error("a mask of 0 tokens carries data")
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    order, at = _read_varint(raw, 0)
    limit, at = _read_varint(raw, at)
    if order > _MAX_G:
        raise _error(f"count order {order} is past {_MAX_G}")
    if limit > _ID_LIMIT:
        raise _error(f"id bound {limit} is past 2**31")
    size = len(raw) - at
    if tokens > 8 * size:
        raise _error(f"the data ends before the sizes of {tokens} tokens")
    if size < _DECODE_SMALL:
        return _decode_v2_small(raw[at:], tokens, order, limit)
    body = np.frombuffer(raw, np.uint8, offset=at)
    windows = _windows(body)
    # A1: the first `tokens` one bits give each count's width
    ones = _first_ones(body, tokens)
    width = np.diff(ones, prepend=-1)
    width += order - 1                                   # z + g
    if int(width.max()) > _MAX_COUNT_WIDTH:
        raise _error(f"a support size past 2**{_MAX_COUNT_WIDTH}")
    # A2: the counts
    ends = np.cumsum(width)
    a2 = int(ones[-1]) + 1
    a3 = a2 + int(ends[-1])
    if a3 > 8 * size:
        raise _error("the data ends inside the support sizes")
    counts = _read_fields(windows, a2 + ends - width, width)
    counts += np.left_shift(1, width) - (1 << order)
    n = int(counts.sum())
    if n > 8 * size:
        raise _error(f"the supports claim {n} ids, more than the data can hold")
    if n and limit == 0:
        raise _error(f"{n} ids under an id bound of 0")
    # A3: the remainders
    rice = _rice_parameters(limit, counts).astype(np.int64)
    a_end = a3 + int(rice @ counts)
    b_start = (a_end + 7) // 8
    if b_start > size:
        raise _error("the data ends inside the id remainders")
    if a_end % 8 and _read_fields(windows, np.array([a_end]), np.array([8 - a_end % 8]))[0]:
        raise _error("non-zero padding after the id remainders")
    if n == 0:
        if b_start != size:
            raise _error(f"{size - b_start} bytes past the end of an empty mask")
        return np.zeros(0, np.int32), counts
    shift = np.repeat(rice, counts)
    ends = np.cumsum(shift)
    gaps = _read_fields(windows, a3 + ends - shift, shift)
    # B: n one bits, the quotients
    ones = np.flatnonzero(np.unpackbits(body[b_start:]))
    if len(ones) < n:
        raise _error(f"the data ends after {len(ones)} of {n} ids")
    if len(ones) > n or int(ones[-1]) // 8 != size - b_start - 1:
        raise _error("data past the last id")
    quotients = np.diff(ones, prepend=-1)
    quotients -= 1
    if int(quotients.max()) > limit:                     # keeps q << b below 2**62
        raise _error(f"a gap past the header's id bound {limit}")
    gaps += quotients << shift
    if int(gaps.max()) >= limit:
        raise _error(f"a gap past the header's id bound {limit}")
    ids = _ids_of_gaps(gaps, counts)
    top = int(ids.max())
    if top >= limit:
        raise _error(f"id {top} is not below the header's bound {limit}")
    return ids.astype(np.int32), counts


def _decode_v2_small(body: bytes, tokens: int, order: int,
                     limit: int) -> tuple[np.ndarray, np.ndarray]:
    """`_decode_v2` after the header, for a few bytes: the bits as a str of 0 and
    1, one bit's position found with `str.find`; the same checks."""
    size = len(body)
    bits = format(int.from_bytes(body, "big"), f"0{8 * size}b") if size else ""
    find = bits.find
    at = 0
    widths = []
    for _ in range(tokens):                                  # A1
        one = find("1", at)
        if one < 0:
            raise _error(f"the data ends before the sizes of {tokens} tokens")
        widths.append(one - at + order)
        at = one + 1
    if max(widths) > _MAX_COUNT_WIDTH:
        raise _error(f"a support size past 2**{_MAX_COUNT_WIDTH}")
    if at + sum(widths) > 8 * size:
        raise _error("the data ends inside the support sizes")
    counts = []
    for width in widths:                                     # A2
        counts.append((1 << width) - (1 << order) + (int(bits[at:at + width], 2) if width else 0))
        at += width
    n = sum(counts)
    if n > 8 * size:
        raise _error(f"the supports claim {n} ids, more than the data can hold")
    if n and limit == 0:
        raise _error(f"{n} ids under an id bound of 0")
    rices = [max(0, (limit // (k + 1)).bit_length() - 1) for k in counts]
    a_end = at + sum(k * b for k, b in zip(counts, rices))
    b_start = (a_end + 7) // 8
    if b_start > size:
        raise _error("the data ends inside the id remainders")
    if "1" in bits[a_end:8 * b_start]:
        raise _error("non-zero padding after the id remainders")
    if n == 0:
        if b_start != size:
            raise _error(f"{size - b_start} bytes past the end of an empty mask")
        return np.zeros(0, np.int32), np.array(counts, np.int64)
    ids = []
    unary = 8 * b_start                                      # B
    for k, rice in zip(counts, rices):                       # A3 and B, token by token
        following = 0
        for _ in range(k):
            one = find("1", unary)
            if one < 0:
                raise _error(f"the data ends after {len(ids)} of {n} ids")
            gap = ((one - unary) << rice) + (int(bits[at:at + rice], 2) if rice else 0)
            at += rice
            unary = one + 1
            following += gap
            if following >= limit:
                raise _error(f"id {following} is not below the header's bound {limit}")
            ids.append(following)
            following += 1
    if find("1", unary) >= 0 or (unary - 1) // 8 != size - 1:
        raise _error("data past the last id")
    return np.array(ids, np.int32), np.array(counts, np.int64)


def _ids_of_gaps(gaps: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each token's ids from its first id and gaps minus one (int64)."""
    steps = gaps + 1
    starts = np.cumsum(counts) - counts
    nonempty = counts > 0
    starts = starts[nonempty]
    steps[starts] = gaps[starts]                 # a token's first id is absolute
    running = np.cumsum(steps)
    base = running[starts] - gaps[starts]        # the running sum before each token
    return running - np.repeat(base, counts[nonempty])


# -- v1 -----------------------------------------------------------------------

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


def _encode_v1_small(ids: list[int], bounds: list[int]) -> bytes:
    """`encode_packed_v1`'s varint stream for a few ids, without numpy."""
    out = bytearray()
    for t in range(len(bounds) - 1):
        _varint(bounds[t + 1] - bounds[t], out)
    for t in range(len(bounds) - 1):
        previous = -1
        for token_id in ids[bounds[t]: bounds[t + 1]]:
            if token_id <= previous:
                raise _error("each support must be strictly ascending")
            _varint(token_id - previous - 1 if previous >= 0 else token_id, out)
            previous = token_id
    return bytes(out)


def encode_packed_v1(ids: np.ndarray, counts: np.ndarray | None = None, *,
                     offsets: np.ndarray | None = None) -> dict:
    """The earlier layout (`packed-varint-v1`), as the server wrote it before v2
    (a mask of fewer than 128 ids by a plain loop): for comparison and for tests
    of its decoder; the server now writes `encode_packed`'s."""
    if len(ids) < _SMALL and offsets is not None:
        bounds = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
        values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        if all(v >= 0 for v in values):
            return {"format": PACKED_FORMAT_V1, "tokens": len(bounds) - 1,
                    "data": base64.b64encode(_encode_v1_small(values, bounds)).decode("ascii")}
    ids = np.asarray(ids).reshape(-1)
    offsets = _offsets_of(ids, counts, offsets)
    tokens, n = len(offsets) - 1, len(ids)
    values = np.empty(tokens + n, np.int64)
    np.subtract(offsets[1:], offsets[:-1], out=values[:tokens])
    if tokens and int(values[:tokens].min()) < 0:
        raise _error("offsets must be non-decreasing")
    if n:
        values[tokens:] = _gaps(ids, offsets, values[:tokens] > 0)
    if len(values) and values.max() < _FAST_LIMIT:
        raw = _varints_3(values.astype(np.uint32))
    else:
        raw = encode_varints(values)
    return {"format": PACKED_FORMAT_V1, "tokens": tokens,
            "data": base64.b64encode(raw).decode("ascii")}


def _decode_v1(data: str, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise _error(f"invalid base64 ({exc})") from None
    values = decode_varints(raw)
    if len(values) < tokens:
        raise _error(f"{len(values)} values for {tokens} counts")
    counts = values[:tokens]
    gaps = values[tokens:]
    if int(counts.sum()) != len(gaps):
        raise _error(f"counts sum to {int(counts.sum())}, {len(gaps)} ids follow")
    if len(gaps) == 0:
        return np.zeros(0, np.int32), counts
    ids = _ids_of_gaps(gaps, counts)
    if int(ids.max()) >= _ID_LIMIT:
        raise _error(f"id {int(ids.max())} is past 2**31 - 1")
    return ids.astype(np.int32), counts


# -- the object -----------------------------------------------------------------

def encode_floats(values) -> str:
    """base85 (`b85encode`) of `values` as little-endian float32: the `logprobs`
    and `log_kept` of a `packed-rice-v2` object."""
    return b85encode(np.asarray(values, dtype="<f4").tobytes())


def decode_floats(data: str, expected: int, what: str,
                  format: str = PACKED_FORMAT) -> np.ndarray:
    """The float32 values of `encode_floats` (base64 ones for a `packed-varint-v1`
    object's `format`); ValueError unless there are `expected`."""
    if format == PACKED_FORMAT_V1:
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as exc:
            raise _error(f"{what}: invalid base64 ({exc})") from None
    else:
        raw = b85decode(data)
    if len(raw) != 4 * expected:
        raise _error(f"{what} holds {len(raw)} bytes, {4 * expected} expected "
                     f"({expected} float32)")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


def is_packed(value) -> bool:
    return isinstance(value, Mapping) and "format" in value


def decode_packed(obj: Mapping, vocab_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32, counts int64) of a packed mask object, either layout.

    ValueError for an unknown `format`, a malformed or truncated `data`, counts
    that disagree with it, or (given `vocab_size`) an id outside the vocabulary."""
    fmt = obj.get("format")
    if fmt not in PACKED_FORMATS:
        raise _error(f"unknown format {fmt!r} (this decoder reads "
                     f"{', '.join(map(repr, PACKED_FORMATS))})")
    tokens, data = obj.get("tokens"), obj.get("data")
    try:
        if isinstance(tokens, bool):
            raise TypeError
        tokens = operator.index(tokens)
    except TypeError:
        tokens = -1
    if tokens < 0:
        raise _error(f"'tokens' must be a non-negative integer, not {obj.get('tokens')!r}")
    if not isinstance(data, str):
        raise _error(f"'data' must be a string, not {type(data).__name__}")
    if fmt == PACKED_FORMAT:
        ids, counts = _decode_v2(b85decode(data), tokens)
    else:
        ids, counts = _decode_v1(data, tokens)
    if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
        raise _error(f"id {int(ids.max())} is outside the vocabulary of {vocab_size}")
    return ids, counts


# -- JSON text in one call (a stream chunk's mask) ----------------------------------

def packed_json(ids: np.ndarray, offsets: np.ndarray) -> str:
    """The compact JSON text of `encode_packed(ids, offsets=offsets)`'s object: by
    the compiled encoder when it is built and takes the arrays, else by json."""
    if _packed_native is not None:
        text = _packed_native.packed_json(ids, offsets)
        if text is not None:
            return text
    return json.dumps(encode_packed(ids, offsets=offsets), separators=(",", ":"))


def lists_json(ids: np.ndarray, offsets: np.ndarray) -> str | None:
    """The compact JSON text of a mask's supports as lists (`[[3,17],[5]]`), as
    `json.dumps(mask.token_ids, separators=(",", ":"))` writes it, by the compiled
    encoder; None where it is not built or does not take the arrays (then
    `SamplingMask.to_lists_json` has json write its `token_ids`)."""
    return None if LISTS_JSON is None else LISTS_JSON(ids, offsets)
