"""The API server's own CPU profile, for `bench_serving.py --cprofile`.

With VSM_API_PROFILE set (a path prefix), the API server (`vllm serve`'s own
process; not the engine core or the worker) profiles its main thread between two
signals: SIGUSR1 starts a `cProfile.Profile` clocked by `time.thread_time` (the
thread's CPU time, so a wait for the core the server shares is no function's time),
SIGUSR2 stops it and writes its stats to `<prefix>.<pid>`. `read` sends both around
a call and gives, per function, its own CPU microseconds and its calls per
generated token. Installed by `engine_site/sitecustomize.py`."""

from __future__ import annotations

import os
import signal
import sys
import time

ENV = "VSM_API_PROFILE"


def install() -> None:
    prefix = os.environ.get(ENV)
    if not prefix or sys.argv[1:2] != ["serve"]:
        return
    import cProfile

    running: list[cProfile.Profile] = []

    def start(_signum, _frame):
        running.append(cProfile.Profile(time.thread_time))
        running[-1].enable()

    def stop(_signum, _frame):
        profile = running.pop()
        profile.disable()
        profile.dump_stats(f"{prefix}.{os.getpid()}.tmp")
        os.replace(f"{prefix}.{os.getpid()}.tmp", f"{prefix}.{os.getpid()}")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


async def read(pid: int, prefix: str, call) -> tuple[object, dict[str, tuple[float, float]]]:
    """(what `await call()` returned, {function: (own CPU seconds, calls)}) of the API
    server `pid` while `call` ran; functions named `name (file:line)`, the file from
    its package folder on."""
    import asyncio
    import pstats

    path = f"{prefix}.{pid}"
    if os.path.exists(path):
        os.remove(path)
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(0.2)
    got = await call()
    await asyncio.sleep(0.2)
    os.kill(pid, signal.SIGUSR2)
    while not os.path.exists(path):
        await asyncio.sleep(0.1)
    stats = pstats.Stats(path).stats
    os.remove(path)
    functions = {}
    for (file, line, name), (_, calls, own, _, _) in stats.items():
        place = file.split("site-packages/")[-1].split("/vllm_sampling_mask/")[-1]
        functions[f"{name} ({place}:{line})"] = (own, calls)
    return got, functions
