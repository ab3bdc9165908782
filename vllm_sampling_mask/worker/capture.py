"""`ScaledCapture`: the scaled distribution's top logprob, for support logprobs.

log S needs, per row that asked, the largest logprob of the temperature-scaled
distribution, which exists only inside the sampler (min-p, top-k and top-p then
edit the logits in place). A sampler adapter hands a capture explicitly to the
call that holds the scaled logits, by shadowing that call on the object the
sampler calls it on for the duration of its own call (`shadowing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.worker.extraction import host_index
from vllm_sampling_mask.worker.support_logprobs import scaled_top_logprob


class ScaledCapture:
    """Records once, for the batch rows `rows`, `scaled_top_logprob` of the logits
    it is given (only [A] floats are kept, not the logits)."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.scaled_top = None

    @property
    def recorded(self) -> bool:
        return self.scaled_top is not None

    def record(self, scaled_logits):
        """Record (the first call only) and hand the logits back unchanged."""
        if self.scaled_top is None:
            self.scaled_top = scaled_top_logprob(scaled_logits, self.rows)
        return scaled_logits

    def result(self, hop: str):
        if self.scaled_top is None:
            raise MissingSamplingMaskError(
                hop, "rows asked for support logprobs but the sampler recorded no "
                "temperature-scaled logits")
        return self.scaled_top


def merged(batch_rows: int, parts, hop: str, device) -> torch.Tensor:
    """One step's scaled top logprobs ([batch rows], as `scaled_top_logprob`
    gives them) from the captures of its parts, each (the part's batch rows in
    the step, ascending; its capture or None), when a sampling path processes
    a step's rows in parts (a verify step's bonus and draft positions, or its
    chunks)."""
    out = torch.zeros(batch_rows, dtype=torch.float32, device=device)
    for rows, capture in parts:
        if capture is not None:
            out[host_index(rows, device)] = capture.result(hop)
    return out


def part_capture(whole: ScaledCapture | None, rows: np.ndarray) -> ScaledCapture | None:
    """The capture of the asked rows among the step's batch rows `rows`
    (ascending), numbered as that part's own batch; None when none asked."""
    if whole is None or not len(rows):
        return None
    asked = np.searchsorted(rows, whole.rows)
    inside = (asked < len(rows)) & (rows[np.minimum(asked, len(rows) - 1)] == whole.rows)
    return ScaledCapture(asked[inside]) if inside.any() else None


_ABSENT = object()


@contextmanager
def shadowing(owner, name: str, replacement: Callable) -> Iterator[None]:
    """Inside: `owner.<name>` is `replacement` (an instance attribute in front of
    the class's method), restored on the way out."""
    before = owner.__dict__.get(name, _ABSENT)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if before is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, before)
