"""The engines' idle polling, shortened for the side-by-side protocol.

vLLM's worker reads each step's input from a shared-memory queue, and the engine
core reads the worker's output from another. A reader keeps polling
(`sched_yield` in a loop) for `SpinCondition.busy_loop_s` after its last read,
1 s on 0.27.1 and 0.32.0, before it sleeps on a socket until the writer pings it.
One engine alone never sees this. `bench_step_cost.py` keeps two engines on two
cores, and vLLM's CPU build binds both workers to the same core (it reserves the
other for the engine core and the client): after a call, the engine that ran
polled on that core for a second, beside the other engine's next call.

With VSM_IDLE_POLL_S set, every reader in the process polls that long instead.
Within a call the worker reads a step's input every step, so at the default
0.25 s a step of up to that long runs as upstream's; after a call the engine is
idle within 0.25 s, and the bench's `Settle` waits for that before the next.
A release whose queue has no `SpinCondition` is left as it is."""

from __future__ import annotations

import os

ENV = "VSM_IDLE_POLL_S"
MODULE = "vllm.distributed.device_communicators.shm_broadcast"


def install() -> None:
    seconds = os.environ.get(ENV)
    if not seconds:
        return
    import wrapt

    def shorten(module) -> None:
        if not hasattr(module, "SpinCondition"):
            return

        def __init__(wrapped, instance, args, kwargs):
            wrapped(*args, **kwargs)
            if instance.is_reader:
                instance.busy_loop_s = float(seconds)

        wrapt.wrap_function_wrapper(module, "SpinCondition.__init__", __init__)

    wrapt.register_post_import_hook(shorten, MODULE)
