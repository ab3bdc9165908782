"""`StepPlan`: what one sampler call extracts, decided on the host before it runs.

A runner adapter plans per request (`plan`); a rejection sampler's adapter turns
that into one row per position of its verify step (`per_token`), and hands the
part of its batch it samples separately its own plan (`part`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
    # Under speculative decoding a request has a run of rows (its draft
    # positions, then the bonus position), one per token it may emit: the
    # number of rows of each request of the runner's batch, in batch order.
    # None: one row per request (a batch row is a request).
    request_rows: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return self.batch_rows if self.rows is None else len(self.rows)

    @property
    def masks_nothing(self) -> bool:
        """No row is extracted and none is idle, outside the profiling run: the
        step has no mask to carry (`transport.NO_MASKS`)."""
        return self.n_rows == 0 and not len(self.idle) and not self.worst_case

    @cached_property
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
    discarded = None if discarded is None else np.asarray(discarded, dtype=bool)
    if discarded is None or not np.count_nonzero(discarded):   # no partial prefill
        keep, idle = wants, _NONE
    else:
        keep = wants & ~discarded
        idle = np.flatnonzero(wants & discarded)
    rows = None if np.count_nonzero(keep) == len(keep) else np.flatnonzero(keep)
    top_k = np.asarray(top_k)
    asked = np.asarray(asked, dtype=bool)
    return StepPlan(len(wants), rows, top_k if rows is None else top_k[rows],
                    asked if rows is None else asked[rows], idle, normalise=normalise)


def worst_case(batch_rows: int, *, normalise: bool = False,
               request_rows: np.ndarray | None = None) -> StepPlan:
    """The memory-profiling run's plan: every row, widest layout, every row asked."""
    return StepPlan(batch_rows, None, np.zeros(batch_rows, dtype=np.int64),
                    np.ones(batch_rows, dtype=bool), _NONE, worst_case=True,
                    normalise=normalise, request_rows=request_rows)


def per_token(plan: StepPlan, request_rows, *, normalise: bool = False) -> StepPlan:
    """A request-level plan (one row per request) as the plan of a verify step,
    whose sampler batch has `request_rows[i]` rows for request i, back to back
    in batch order (draft positions, then the bonus position): each row takes
    its request's decision, top-k and support-logprobs switch. Vectorised."""
    request_rows = np.asarray(request_rows, dtype=np.int64)
    if len(request_rows) != plan.batch_rows:
        raise ValueError(f"a plan for {plan.batch_rows} requests cannot take rows for "
                         f"{len(request_rows)}")
    starts = np.zeros(len(request_rows) + 1, dtype=np.int64)
    np.cumsum(request_rows, out=starts[1:])

    def rows_of(requests: np.ndarray) -> np.ndarray:
        n = request_rows[requests]
        first = np.repeat(starts[requests] - np.cumsum(n) + n, n)
        return first + np.arange(int(n.sum()), dtype=np.int64)

    requests = (np.arange(plan.batch_rows, dtype=np.int64) if plan.rows is None
                else np.asarray(plan.rows, dtype=np.int64))
    rows = rows_of(requests)
    n = request_rows[requests]
    total = int(starts[-1])
    return StepPlan(total, None if len(rows) == total else rows,
                    np.repeat(plan.top_k, n), np.repeat(plan.asked, n),
                    rows_of(np.asarray(plan.idle, dtype=np.int64)),
                    worst_case=plan.worst_case, normalise=normalise,
                    request_rows=request_rows)


def part(whole: StepPlan, rows: np.ndarray) -> StepPlan:
    """The plan of a sub-batch of `whole`'s sampler batch: its batch rows `rows`
    (host ints, ascending), renumbered 0, 1, ... in order (a verify step's
    bonus positions, handed to the sampler as a batch of their own)."""
    n = whole.batch_rows
    extracted = np.zeros(n, dtype=bool)
    extracted[slice(None) if whole.rows is None else whole.rows] = True
    top_k = np.zeros(n, dtype=np.int64)
    top_k[extracted] = whole.top_k
    asked = np.zeros(n, dtype=bool)
    asked[extracted] = whole.asked
    idle = np.zeros(n, dtype=bool)
    idle[whole.idle] = True
    rows = np.asarray(rows, dtype=np.int64)
    if whole.worst_case:
        return worst_case(len(rows), normalise=whole.normalise)
    return plan(extracted[rows] | idle[rows], asked[rows], top_k[rows], idle[rows],
                normalise=whole.normalise)
