"""Where a step's time goes, measured in place: per function, wall and CPU time in
each process of an engine (the worker, the engine core, the client).

`bench_step_cost.py --timers` turns it on. Every process the engines start
imports `engine_site/sitecustomize.py` (put on PYTHONPATH, with the output
folder in VSM_STEP_TIMERS), which calls `install()`: post-import hooks that wrap
the functions below, outermost (registered after the overlay's own hooks, so a
function's figure includes what the overlay added to it). On SIGUSR2 a process
writes its totals to `<folder>/<pid>.json`; the bench asks each engine's
processes, and reads its own (the client's) with `totals()`.

These figures are what the overlay's code costs *in the step*, with the caches
the model's forward pass left behind and the other processes on the same cores:
several times a micro-benchmark's figure for the same call. A function's total
over a run divided by the steps (`GPUModelRunner.sample_tokens` calls in the
worker, `Scheduler.update_from_output` in the engine core, `LLMEngine.step` in
the client) is its time per step. Upstream's large functions (the forward pass,
the sampler) vary by more than the mask costs between two engines; read the
overlay's rows.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

ENV = "VSM_STEP_TIMERS"

# (module, function, the process it runs in): upstream's step, then the overlay's hops
TARGETS = [
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model", "worker"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens", "worker"),
    ("vllm.v1.sample.sampler", "Sampler.sample", "worker"),
    ("vllm_sampling_mask.worker.state", "SamplingMaskState.plan", "worker"),
    ("vllm_sampling_mask.worker.state", "SamplingMaskState.extract", "worker"),
    ("vllm_sampling_mask.worker.state", "extract_on_host", "worker"),
    ("vllm_sampling_mask.worker.transport", "MaskCopy.result", "worker"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.schedule", "engine core"),
    ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "engine core"),
    ("vllm_sampling_mask.patches.engine.feature.scheduler", "_attach", "engine core"),
    ("vllm_sampling_mask.patches.engine.feature.scheduler", "_attach_drawn", "engine core"),
    ("vllm_sampling_mask.worker.transport", "StepMasks.suspects", "engine core"),
    ("vllm.v1.engine.llm_engine", "LLMEngine.step", "client"),
    ("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs", "client"),
]
# the function whose calls count a process's steps, by role
STEPS = {"worker": "GPUModelRunner.sample_tokens", "engine core": "Scheduler.update_from_output",
         "client": "LLMEngine.step"}

_totals: dict[str, list[float]] = {}     # name -> [wall s, CPU s, calls]
_lock = threading.Lock()


def _timer(name: str):
    def wrapper(wrapped, instance, args, kwargs):
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return wrapped(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            with _lock:
                entry = _totals.setdefault(name, [0.0, 0.0, 0])
                entry[0] += wall
                entry[1] += cpu
                entry[2] += 1
    return wrapper


def install() -> None:
    import wrapt

    def hook_for(name):
        return lambda module: wrapt.wrap_function_wrapper(module, name, _timer(name))

    for module, name, _ in TARGETS:
        wrapt.register_post_import_hook(hook_for(name), module)
    folder = os.environ.get(ENV)
    if folder:
        signal.signal(signal.SIGUSR2, lambda *_: _write(folder))


def totals() -> dict[str, list[float]]:
    with _lock:
        return {name: list(entry) for name, entry in _totals.items()}


def _write(folder: str) -> None:
    path = os.path.join(folder, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(totals(), f)
    os.replace(path + ".tmp", path)


def collect(pids: list[int], folder: str) -> dict[str, list[float]]:
    """The summed totals of processes `pids`, asked for now."""
    stamp = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    summed: dict[str, list[float]] = {}
    for pid in pids:
        path = os.path.join(folder, f"{pid}.json")
        deadline = time.time() + 10
        while not (os.path.exists(path) and os.path.getmtime(path) >= stamp - 0.01):
            if time.time() > deadline:
                raise RuntimeError(f"step timers: process {pid} did not write {path}")
            time.sleep(0.05)
        with open(path) as f:
            for name, entry in json.load(f).items():
                into = summed.setdefault(name, [0.0, 0.0, 0])
                for i in range(3):
                    into[i] += entry[i]
    return summed


def difference(after: dict, before: dict) -> dict:
    return {name: [a - b for a, b in zip(entry, before.get(name, [0.0, 0.0, 0]))]
            for name, entry in after.items()}


def per_step(off: dict, on: dict, role: str) -> dict:
    """name -> {off_us, on_us, added_us}: wall microseconds per step of each arm,
    for the functions of `role`'s process (each arm's steps counted by
    `STEPS[role]`)."""
    steps = {arm: max(t.get(STEPS[role], [0, 0, 0])[2], 1) for arm, t in
             (("off", off), ("on", on))}
    names = {name for _, name, where in TARGETS if where == role} & (set(off) | set(on))
    report = {}
    for name in sorted(names):
        a = off.get(name, [0.0, 0.0, 0])[0] / steps["off"] * 1e6
        b = on.get(name, [0.0, 0.0, 0])[0] / steps["on"] * 1e6
        report[name] = {"off_us": a, "on_us": b, "added_us": b - a}
    return report
