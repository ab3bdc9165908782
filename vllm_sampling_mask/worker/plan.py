"""`StepPlan`: what one sampler call extracts, decided on the host before it runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class StepPlan:
    """One sampler call's mask plan; host arrays only (no device read sizes it).

    Rows are the sampler batch's. A row is extracted when its request wants a
    mask and the runner keeps its sample; a row whose sample the runner discards
    (a partial prefill chunk) is `idle`: not extracted, it decodes as sampled
    nothing. The profiling run (`worst_case`) extracts every row at the widest."""

    batch_rows: int
    rows: np.ndarray | None     # batch rows to extract, ascending; None: every row
    top_k: np.ndarray           # the extracted rows' top-k (0 or >= V: none)
    asked: np.ndarray           # bool per extracted row: gather its support logprobs
    idle: np.ndarray            # batch rows that want a mask, sample discarded
    worst_case: bool = False
    normalise: bool = False     # the sampler hands processed logits, not logprobs

    @property
    def n_rows(self) -> int:
        return self.batch_rows if self.rows is None else len(self.rows)

    @property
    def capture_rows(self) -> np.ndarray:
        """The batch rows whose scaled distribution must be recorded (they asked)."""
        picked = np.flatnonzero(self.asked)
        return picked if self.rows is None else self.rows[picked]


def plan(wants: np.ndarray, asked: np.ndarray, top_k: np.ndarray,
         discarded: np.ndarray | None = None, *, normalise: bool = False) -> StepPlan:
    """The plan of a served step from per-batch-row host arrays: `wants` a mask,
    `asked` for support logprobs, `top_k`, and `discarded` (the runner drops the
    row's sample). Vectorised: no loop over rows."""
    wants = np.asarray(wants, dtype=bool)
    keep = wants if discarded is None else wants & ~np.asarray(discarded, dtype=bool)
    idle = _NONE if discarded is None else np.flatnonzero(wants & ~keep)
    rows = None if keep.all() else np.flatnonzero(keep)
    top_k = np.asarray(top_k)
    asked = np.asarray(asked, dtype=bool)
    return StepPlan(len(wants), rows, top_k if rows is None else top_k[rows],
                    asked if rows is None else asked[rows], idle, normalise=normalise)


def worst_case(batch_rows: int, *, normalise: bool = False) -> StepPlan:
    """The memory-profiling run's plan: every row, widest layout, every row asked."""
    return StepPlan(batch_rows, None, np.zeros(batch_rows, dtype=np.int64),
                    np.ones(batch_rows, dtype=bool), _NONE, worst_case=True,
                    normalise=normalise)
