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

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.support_logprobs import scaled_top_logprob


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
