"""The packed wire (`packed_wire`) and `SamplingMask.from_response` reading it:
round trips over hostile shapes, the documented byte layout, refusals."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from vllm_sampling_mask.packed_wire import (PACKED_FORMAT, decode_packed, decode_varints,
                                            encode_packed, encode_varints)
from vllm_sampling_mask.sampling_mask import SamplingMask


def _random_mask(rng, tokens, vocab, max_size):
    sizes = rng.integers(0, min(vocab, max_size) + 1, tokens)
    return SamplingMask.from_lists(
        [np.sort(rng.choice(vocab, s, replace=False)) for s in sizes])


@pytest.mark.parametrize("vocab", [1, 2, 127, 128, 4096, 151_936, 262_208, 2**31 - 1])
def test_round_trip(vocab):
    rng = np.random.default_rng(vocab)
    for tokens in (0, 1, 2, 17):
        mask = _random_mask(rng, tokens, vocab, 300)
        obj = mask.to_packed()
        assert obj["format"] == PACKED_FORMAT and obj["tokens"] == tokens
        ids, counts = decode_packed(obj)
        assert ids.dtype == np.int32
        assert SamplingMask.from_counts(ids, counts) == mask


def test_edge_supports_round_trip():
    rows = [[], [0], [0, 1, 2], [], [151_935], [0, 151_935], [5], []]
    mask = SamplingMask.from_lists(rows)
    assert SamplingMask.from_counts(*decode_packed(mask.to_packed())).token_ids == rows
    empty = SamplingMask.from_lists([])
    assert empty.to_packed()["data"] == ""
    assert SamplingMask.from_counts(*decode_packed(empty.to_packed())) == empty


def test_the_documented_layout():
    """Counts first, then each support's first id and its gaps minus one, LEB128."""
    obj = encode_packed(np.array([3, 4, 300, 7]), np.array([3, 1]))
    raw = base64.b64decode(obj["data"])
    # counts 3, 1; token 0: 3, 4-3-1=0, 300-4-1=295 (0xA7 0x02); token 1: 7
    assert raw == bytes([3, 1, 3, 0, 0xA7, 0x02, 7])


def test_varints_at_their_boundaries():
    values = np.array([0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**31 - 1, 2**35,
                       2**62], dtype=np.int64)
    raw = encode_varints(values)
    assert len(raw) == 1 + 1 + 1 + 2 + 2 + 3 + 3 + 4 + 5 + 6 + 9
    assert np.array_equal(decode_varints(raw), values)


def test_refusals():
    good = encode_packed(np.array([1, 2]), np.array([2]))
    with pytest.raises(ValueError, match="unknown format"):
        decode_packed({**good, "format": "packed-varint-v2"})
    with pytest.raises(ValueError, match="ends inside a value"):
        decode_packed({**good, "data": base64.b64encode(bytes([2, 0x81])).decode()})
    with pytest.raises(ValueError, match="counts sum"):
        decode_packed({**good, "tokens": 1, "data": base64.b64encode(bytes([3, 1])).decode()})
    with pytest.raises(ValueError):   # not base64
        decode_packed({**good, "data": "!!"})
    with pytest.raises(ValueError, match="strictly ascending"):
        encode_packed(np.array([5, 5]), np.array([2]))


def test_from_response_reads_both_formats_streamed_and_not():
    rng = np.random.default_rng(3)
    mask = _random_mask(rng, 12, 151_936, 80)
    token_ids = list(range(12))
    lists = {"choices": [{"index": 0, "token_ids": token_ids,
                          "sampling_mask": mask.token_ids}]}
    packed = {"choices": [{"index": 0, "token_ids": token_ids,
                           "sampling_mask": mask.to_packed()}]}
    assert SamplingMask.from_response(lists) == mask
    assert SamplingMask.from_response(packed) == mask
    # a stream: one chunk per token, formats may even differ chunk to chunk
    chunks = [{"choices": [{"index": 0, "token_ids": [t],
                            "sampling_mask": (SamplingMask.from_lists([mask.token_ids[t]])
                                              .to_packed() if t % 2 else
                                              [mask.token_ids[t]])}]}
              for t in range(12)]
    assert SamplingMask.from_response(chunks) == mask
    bad = {"choices": [{"index": 0, "token_ids": token_ids[:5],
                        "sampling_mask": mask.to_packed()}]}
    with pytest.raises(ValueError, match="12 supports for 5 token_ids"):
        SamplingMask.from_response(bad)


def test_the_packed_wire_is_smaller_than_lists_at_a_large_vocabulary():
    rng = np.random.default_rng(0)
    mask = _random_mask(rng, 64, 151_936, 80)
    import json
    lists = len(json.dumps(mask.token_ids, separators=(",", ":")))
    packed = len(json.dumps(mask.to_packed(), separators=(",", ":")))
    assert packed < 0.5 * lists


def test_the_fast_encoder_writes_the_general_encoders_bytes():
    """Values below 2**21 take the 3-byte table; at and past it, the general one."""
    edges = [0, 1, 127, 128, 16383, 16384, 2**21 - 2, 2**21 - 1]
    for top in (2**21 - 1, 2**21, 2**21 + 5):
        ids = np.array(sorted(set(edges + [top])), np.int64)
        counts = np.array([len(ids)])
        raw = base64.b64decode(encode_packed(ids, counts)["data"])
        deltas = np.concatenate([ids[:1], np.diff(ids) - 1])
        assert raw == encode_varints(np.concatenate([counts, deltas]))
        assert np.array_equal(decode_packed(encode_packed(ids, counts))[0], ids)


@pytest.mark.parametrize("vocab", [2, 128, 4096, 151_936, 2**31 - 1])
def test_a_few_ids_are_encoded_without_numpy_to_the_same_bytes(vocab):
    """A stream chunk's few ids take the plain loop; its bytes are the vectorised
    encoder's (given counts, which always takes the vectorised path)."""
    rng = np.random.default_rng(vocab)
    for tokens in (0, 1, 2, 5):
        mask = _random_mask(rng, tokens, vocab, max_size=25)
        assert len(mask.ids) < 128
        small = encode_packed(mask.ids, offsets=mask.offsets)
        assert small == encode_packed(mask.ids, np.diff(mask.offsets))
        ids, counts = decode_packed(small)
        assert np.array_equal(ids, mask.ids) and np.array_equal(counts, np.diff(mask.offsets))
    with pytest.raises(ValueError, match="strictly ascending"):
        encode_packed(np.array([5, 5]), offsets=np.array([0, 2]))
