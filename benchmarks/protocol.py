"""The step-cost protocol's verdict, shared by the benchmarks that judge by it.

A point is a list of pair ratios (mask on over mask off, each measured side by side
in one pair); reported are their median and interquartile range. A point whose
range is wider than `max_iqr` (3%) is "inconclusive", else "met" when the median
reaches `goal` (0.97), else "not met" (docs/sampling_mask.md, "Cost"). Before each
timed call the engines' processes are let go quiet (`Settle`), so that no call runs
beside the other arm's idle polling."""

from __future__ import annotations

import os
import statistics
import time

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


def cpu_seconds(proc) -> float:
    """A process's CPU time so far (psutil), user and system."""
    times = proc.cpu_times()
    return times.user + times.system


class Settle:
    """Before each timed call, waits until no engine process uses the CPU.

    After a call, vLLM's worker keeps polling its shared-memory queue
    (`sched_yield` in a loop) for a while: 1 s on 0.32 (`SpinCondition`'s
    `busy_loop_s`), then it sleeps on a socket. On two cores, the other engine's
    next call ran beside that poller, so in every pair the second call paid for
    the first's: the on arm in one pair, the off arm in the next. Waiting for
    quiet makes every call start alike. Quiet: the processes' CPU time over
    `window` seconds is under `quiet` of one core (the kernel counts it in
    10 ms ticks); at most `limit` seconds, and the calls that reach it are
    counted."""

    def __init__(self, processes, window: float = 0.1, quiet: float = 0.15,
                 limit: float = 5.0) -> None:
        self.processes = list(processes)
        self.window, self.quiet, self.limit = window, quiet, limit
        self.waited: list[float] = []
        self.timeouts = 0

    def _cpu(self) -> float:
        return sum(cpu_seconds(p) for proc in self.processes
                   for p in [proc] + proc.children(recursive=True))

    def __call__(self) -> None:
        start = time.perf_counter()
        while True:
            before = self._cpu()
            time.sleep(self.window)
            if (self._cpu() - before) / self.window < self.quiet:
                break
            if time.perf_counter() - start > self.limit:
                self.timeouts += 1
                break
        self.waited.append(time.perf_counter() - start)

    def report(self) -> dict:
        return {"calls": len(self.waited), "median_wait_s": statistics.median(self.waited),
                "max_wait_s": max(self.waited), "timeouts": self.timeouts}


def pin_beside_workers(processes, client: bool = True) -> list[int] | None:
    """Binds every thread of the engines' processes other than their workers, and
    of this (the client) process where `client`, to the CPUs no worker is bound
    to, so that both arms' processes sit alike. vLLM's CPU build binds each
    worker's threads to cores (both engines' workers to the same one on this
    machine); the engine core, which polls for the worker's output, and the
    client are left to the kernel, which placed them anew for each engine: on the
    workers' core for one engine, beside it for the other, for the engine's whole
    life. A worker is a process whose affinity is a strict subset of the
    machine's. Returns the CPUs the rest were bound to, or None where the workers
    leave none (nothing is bound then). Threads started later inherit it."""
    machine = os.sched_getaffinity(0)
    everything = [p for proc in processes for p in [proc] + proc.children(recursive=True)]
    workers = [p for p in everything if set(p.cpu_affinity()) < machine]
    free = sorted(machine - {c for w in workers for c in w.cpu_affinity()})
    if not workers or not free:
        return None
    import psutil
    rest = [p for p in everything if p not in workers]
    for proc in rest + ([psutil.Process()] if client else []):
        for thread in proc.threads():
            try:
                os.sched_setaffinity(thread.id, free)
            except (ProcessLookupError, PermissionError):
                pass              # a thread that ended meanwhile
    return free
