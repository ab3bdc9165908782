"""The step-cost protocol's verdict, shared by the benchmarks that judge by it.

A point is a list of pair ratios (mask on over mask off, each measured side by side
in one pair); reported are their median and interquartile range. A point whose
range is wider than `max_iqr` (3%) is "inconclusive", else "met" when the median
reaches `goal` (0.97), else "not met" (docs/sampling_mask.md, "Cost")."""

from __future__ import annotations

import statistics

GOAL = 0.97
MAX_IQR = 0.03


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def verdict(ratios: list[float], goal: float = GOAL, max_iqr: float = MAX_IQR) -> dict:
    q1, median, q3 = quartiles(ratios)
    if q3 - q1 > max_iqr:
        status = "inconclusive"
    else:
        status = "met" if median >= goal else "not met"
    return {"median": median, "q1": q1, "q3": q3, "iqr": q3 - q1, "status": status,
            "ratios": ratios}
