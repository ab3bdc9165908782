"""The `SamplingMask` type: per generated token, the ids the sampler could draw.

Plain module: numpy only, no torch, no vLLM. The engine builds one per
completion; the trainer consumes it (see `vllm_sampling_mask.training`).

Packed form (what travels and what the trainer op reads):
    ids      1-D int32,  every support concatenated in generation order
    offsets  1-D int64,  length T + 1, offsets[0] == 0, offsets[-1] == len(ids)
Support t is ids[offsets[t]:offsets[t + 1]], ascending.

Support logprobs (only for requests that said `return_sampling_mask_logprobs`;
None otherwise):
    logprobs  1-D float32, aligned with `ids`: each support id's processed
              logprob (the distribution sampled from; per token they sum to 1)
    log_kept  1-D float32, length T: log S, the log of the probability mass the
              support kept under the temperature-scaled distribution
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from vllm_sampling_mask.formats.packed_wire import (decode_floats, decode_packed, encode_floats,
                                            encode_packed, is_packed, lists_json,
                                            offsets_of_counts, packed_json)

__all__ = ["SamplingMask"]


class SamplingMask:
    """The sampling support of each generated token of one completion."""

    __slots__ = ("ids", "offsets", "logprobs", "log_kept")

    def __init__(self, ids=None, offsets=None, logprobs=None, log_kept=None, *,
                 token_ids: Iterable[Sequence[int]] | None = None) -> None:
        if offsets is None:
            # vLLM's own `SamplingMask(token_ids)` (0.28 on): one list per token
            lists = token_ids if token_ids is not None else ids
            if lists is None:
                raise TypeError("SamplingMask needs ids and offsets, or token_ids "
                                "(one list of ids per generated token)")
            ids, offsets = _flatten(lists)
        elif token_ids is not None:
            raise TypeError("SamplingMask: give ids and offsets, or token_ids, not both")
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if ids.ndim != 1 or offsets.ndim != 1:
            raise ValueError("SamplingMask: ids and offsets must be 1-D arrays")
        if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(
                "SamplingMask: offsets must start at 0 and end at len(ids) "
                f"(got len(offsets)={len(offsets)}, len(ids)={len(ids)})")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("SamplingMask: offsets must be non-decreasing")
        if (logprobs is None) != (log_kept is None):
            raise ValueError("SamplingMask: logprobs and log_kept come together")
        if logprobs is not None:
            logprobs = np.ascontiguousarray(logprobs, dtype=np.float32).reshape(-1)
            log_kept = np.ascontiguousarray(log_kept, dtype=np.float32).reshape(-1)
            if len(logprobs) != len(ids) or len(log_kept) != len(offsets) - 1:
                raise ValueError(
                    f"SamplingMask: {len(logprobs)} logprobs for {len(ids)} ids and "
                    f"{len(log_kept)} log_kept values for {len(offsets) - 1} tokens")
        self.ids = ids
        self.offsets = offsets
        self.logprobs = logprobs
        self.log_kept = log_kept

    # -- constructors -------------------------------------------------------
    @classmethod
    def _of(cls, ids: np.ndarray, offsets: np.ndarray, logprobs: np.ndarray | None = None,
            log_kept: np.ndarray | None = None) -> SamplingMask:
        """A mask of arrays that already are what `__init__` checks for (1-D
        C-ordered int32 ids, int64 offsets from 0 to len(ids), non-decreasing;
        float32 logprobs and log_kept aligned with them, or None): the output
        processor's per-step hand-off and `concat`, where `__init__`'s checks would
        be most of the cost."""
        mask = object.__new__(cls)
        mask.ids, mask.offsets, mask.logprobs, mask.log_kept = ids, offsets, logprobs, log_kept
        return mask

    @classmethod
    def from_lists(cls, token_ids: Iterable[Sequence[int]], logprobs=None,
                   log_kept=None) -> SamplingMask:
        """Build from one list of ids per generated token (and, optionally, one
        list of support logprobs per token and log S per token)."""
        ids, offsets = _flatten(token_ids)
        flat = None
        if logprobs is not None:
            values = [np.asarray(r, dtype=np.float32).reshape(-1) for r in logprobs]
            if [len(v) for v in values] != np.diff(offsets).tolist():
                raise ValueError("SamplingMask.from_lists: the support logprobs differ "
                                 "in shape from the supports")
            flat = np.concatenate(values) if values else np.zeros(0, np.float32)
        return cls(ids, offsets, flat, log_kept)

    @classmethod
    def from_counts(cls, ids, counts, logprobs=None, log_kept=None) -> SamplingMask:
        """Build from packed ids and the size of each support."""
        return cls(ids, offsets_of_counts(counts), logprobs, log_kept)

    @classmethod
    def concat(cls, masks: Sequence[SamplingMask]) -> SamplingMask:
        """Join masks of consecutive token spans into one (support logprobs kept
        when every part has them). One part is returned as it is (a stream
        chunk's usual case), not copied."""
        if not masks:
            return cls.from_lists([])
        if len(masks) == 1:
            return masks[0]
        with_logprobs = all(m.logprobs is not None for m in masks)
        ids = np.concatenate([m.ids for m in masks])
        offsets = np.zeros(1 + sum(len(m.offsets) - 1 for m in masks), dtype=np.int64)
        at = base = 0
        for m in masks:
            tokens = len(m.offsets) - 1
            offsets[at + 1: at + 1 + tokens] = m.offsets[1:] + base
            at += tokens
            base += len(m.ids)
        if with_logprobs:
            return cls._of(ids, offsets, np.concatenate([m.logprobs for m in masks]),
                           np.concatenate([m.log_kept for m in masks]))
        return cls._of(ids, offsets)

    @classmethod
    def from_response(cls, response, index: int | None = None) -> SamplingMask:
        """The mask of one choice from the HTTP server, streamed or not.

        `response` is what `/inference/v1/generate`, `/v1/completions` or
        `/v1/chat/completions` returned, as JSON dicts or as the `openai`
        client's objects: one choice (`response["choices"][i]`), a whole
        response, or, for a streamed request, the list of its chunks or of their
        choices (chunks without choices, like the usage chunk, are skipped).
        Each choice's (or chunk's) `sampling_mask` may be JSON lists or the packed
        object (`sampling_mask_format: "packed"`, see `packed_wire`); both decode
        to the same mask. `index` picks the choice where there are several (n > 1, several
        prompts); without it there must be only one. A streamed choice's mask is
        its chunks' masks joined in order, so it equals the non-streamed one.

        A choice that carries support logprobs (`sampling_mask_logprobs` and
        `sampling_mask_log_kept` beside a lists mask, or `logprobs` / `log_kept`
        inside the packed object) gives a mask with `logprobs` and `log_kept`.

        Raises ValueError when the choice has no mask (`sampling_mask: null`:
        the request was served without one, or, with `sampling_mask_reason`, lost
        it at a step and the message gives that reason; no field: a server without
        this overlay) or when a mask and its `token_ids` differ in length: never a
        partial mask.
        """
        if isinstance(response, (list, tuple)):
            parts = [_plain(item) for item in response]
        else:
            parts = [_plain(response)]
        choices = []
        for part in parts:
            if "choices" in part and "index" not in part:   # a response or a chunk
                choices.extend(_plain(c) for c in part["choices"])
            else:
                choices.append(part)
        indices = sorted({c["index"] for c in choices})
        if not indices:
            raise ValueError("SamplingMask.from_response: the response has no choice")
        if index is None:
            if len(indices) > 1:
                raise ValueError(f"SamplingMask.from_response: choices {indices} in the "
                                 "response; pass index= to pick one")
            index = indices[0]
        elif index not in indices:
            raise ValueError(f"SamplingMask.from_response: no choice with index {index} "
                             f"(choices {indices})")
        pieces: list[SamplingMask] = []
        for k, choice in enumerate(c for c in choices if c["index"] == index):
            if "sampling_mask" not in choice:
                raise ValueError(
                    f"SamplingMask.from_response: choice {index} (part {k}) has no "
                    "'sampling_mask' field: the server does not run vllm_sampling_mask")
            lists = choice["sampling_mask"]
            if lists is None and choice.get("sampling_mask_reason"):
                raise ValueError(
                    f"SamplingMask.from_response: choice {index} (part {k}) has "
                    f"sampling_mask null: {choice['sampling_mask_reason']}")
            if lists is None:
                raise ValueError(
                    f"SamplingMask.from_response: choice {index} (part {k}) has "
                    "sampling_mask null: it was served without a mask (the request "
                    "said return_sampling_mask false, or null with an untruncated "
                    "distribution, or the server runs without --return-sampling-mask)")
            if is_packed(lists):
                packed = _plain(lists)
                ids, counts = decode_packed(packed)
                logprobs = log_kept = None
                if "logprobs" in packed:
                    logprobs = decode_floats(packed["logprobs"], len(ids), "logprobs",
                                             packed["format"])
                    log_kept = decode_floats(packed["log_kept"], len(counts), "log_kept",
                                             packed["format"])
                piece = cls.from_counts(ids, counts, logprobs, log_kept)
            else:
                values = choice.get("sampling_mask_logprobs")
                piece = cls.from_lists(lists, values, None if values is None
                                       else choice.get("sampling_mask_log_kept"))
            token_ids = choice.get("token_ids")
            if token_ids is not None and len(token_ids) != len(piece):
                raise ValueError(
                    f"SamplingMask.from_response: choice {index} (part {k}) has "
                    f"{len(piece)} supports for {len(token_ids)} token_ids")
            pieces.append(piece)
        return cls.concat(pieces)

    def to_packed(self) -> dict:
        """The packed wire object of this mask (`packed_wire.encode_packed`), with
        its support logprobs as base85 float32 (`packed_wire.encode_floats`)."""
        packed = encode_packed(self.ids, offsets=self.offsets)
        if self.logprobs is not None:
            packed["logprobs"] = encode_floats(self.logprobs)
            packed["log_kept"] = encode_floats(self.log_kept)
        return packed

    def to_packed_json(self) -> str:
        """`to_packed()` as compact JSON text, in one call where the compiled
        encoder is built (`packed_wire.packed_json`): a stream chunk's packed mask.
        The support logprobs' fields are base85 text, which needs no escaping."""
        text = packed_json(self.ids, self.offsets)
        if self.logprobs is None:
            return text
        return (f'{text[:-1]},"logprobs":"{encode_floats(self.logprobs)}",'
                f'"log_kept":"{encode_floats(self.log_kept)}"}}')

    def to_lists_json(self) -> str:
        """`token_ids` as compact JSON text (`[[3,17],[5]]`), written without
        building the lists where the compiled encoder is built
        (`packed_wire.lists_json`): a stream chunk's mask."""
        text = lists_json(self.ids, self.offsets)
        return json.dumps(self.token_ids, separators=(",", ":")) if text is None else text

    def logprob_lists(self) -> list[list[float]] | None:
        """One list of support logprobs per token (aligned with `token_ids`), or None."""
        if self.logprobs is None:
            return None
        flat = self.logprobs.tolist()
        bounds = self.offsets.tolist()
        return [flat[bounds[t]:bounds[t + 1]] for t in range(len(bounds) - 1)]

    def logprobs_of(self, t: int) -> np.ndarray:
        """Token t's support logprobs, float32, aligned with `self[t]`."""
        if self.logprobs is None:
            raise ValueError("SamplingMask: this mask carries no support logprobs "
                             "(ask with return_sampling_mask_logprobs=true)")
        n = len(self)
        if t < 0:
            t += n
        return self.logprobs[self.offsets[t]:self.offsets[t + 1]]

    # -- views ---------------------------------------------------------------
    @property
    def token_ids(self) -> list[list[int]]:
        """One list of ids per generated token (`token_ids[t]` is token t's support)."""
        flat = self.ids.tolist()
        bounds = self.offsets.tolist()
        return [flat[bounds[t]:bounds[t + 1]] for t in range(len(bounds) - 1)]

    @property
    def sizes(self) -> np.ndarray:
        """Support size of each generated token, int64 [T]."""
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, t: int) -> np.ndarray:
        n = len(self)
        if t < 0:
            t += n
        if not 0 <= t < n:
            raise IndexError(f"SamplingMask index {t} out of range for {n} tokens")
        return self.ids[self.offsets[t]:self.offsets[t + 1]]

    def __iter__(self):
        return (self[t] for t in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplingMask):
            return NotImplemented
        same_logprobs = (self.logprobs is None) == (other.logprobs is None) and (
            self.logprobs is None
            or (np.array_equal(self.logprobs, other.logprobs, equal_nan=True)
                and np.array_equal(self.log_kept, other.log_kept, equal_nan=True)))
        return (np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.ids, other.ids) and same_logprobs)

    __hash__ = None  # mutable arrays inside

    def __reduce__(self):
        return (SamplingMask, (self.ids, self.offsets, self.logprobs, self.log_kept))

    def __repr__(self) -> str:
        sizes = self.sizes
        if len(sizes):
            return (f"SamplingMask(tokens={len(self)}, ids={len(self.ids)}, "
                    f"size min/max={int(sizes.min())}/{int(sizes.max())})")
        return "SamplingMask(tokens=0)"


def _flatten(token_ids: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets) of one list of ids per token."""
    rows = [np.asarray(r, dtype=np.int32).reshape(-1) for r in token_ids]
    offsets = offsets_of_counts([len(r) for r in rows])
    if not rows:
        return np.zeros(0, dtype=np.int32), offsets
    return np.concatenate(rows), offsets


def _plain(obj) -> Mapping:
    """A JSON object as a mapping: a dict as it is, a client object (the `openai`
    package's pydantic models, extra fields included) through `model_dump()`."""
    if isinstance(obj, Mapping):
        return obj
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    raise TypeError("SamplingMask.from_response: expected JSON dicts or client objects "
                    f"(with model_dump), got {type(obj).__name__}")
