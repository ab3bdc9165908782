"""The engine core's half of the state route (`debug_state`): per-request counts.

What it adds, in `vllm/v1/engine/core.py`, only with `VLLM_SAMPLING_MASK_DEBUG_STATE=1`
in the engine core's environment (nothing wrapped or replaced; without it nothing changes):

- `EngineCore.sampling_mask_debug_state()`: the scheduler's queues, the KV cache
  manager's per-request tables and blocks in use, and each worker's runner requests and
  mask state, as plain counts.

Why: a soak test must see that finished and aborted requests leave nothing behind in
the engine-core and worker processes, which a client cannot otherwise observe.
"""

from __future__ import annotations

import sys

from vllm_sampling_mask.config import DEBUG_STATE as ENV  # noqa: F401 (the tests set it)
from vllm_sampling_mask.config import debug_state_enabled as enabled
from vllm_sampling_mask.releases import Release

METHOD = "sampling_mask_debug_state"
WORK = "sampling_mask_work"   # work counters, not state: left out of the route's total


def _work(runner) -> dict:
    """The runner's mask work so far: not per-request state, so `debug_state.total`
    leaves it out (`WORK`). No state (flag off, or a rank whose output the executor
    drops): None."""
    state = runner.sampling_mask
    return None if state is None else {"extractions": state.extractions,
                                       "extracted_rows": state.extracted_rows,
                                       "idle_rows": state.idle_rows,
                                       "steps_without_masks": state.steps_without_masks}


def _pending(runner) -> int:
    # a step is open only while the call that samples runs: 1 here means one was left open
    state = runner.sampling_mask
    return int(state is not None and state.open is not None)


def worker_state(worker) -> dict:
    """Per-request state of one worker's model runner (runs in the worker)."""
    runner = worker.model_runner
    mrv2 = sys.modules.get("vllm.v1.worker.gpu.model_runner")
    v1 = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    if mrv2 is not None and isinstance(runner, mrv2.GPUModelRunner):
        return {"runner": "mrv2",
                "requests": runner.req_states.num_reqs,
                "pending_sampling_mask": _pending(runner), WORK: _work(runner)}
    if v1 is not None and isinstance(runner, v1.GPUModelRunner):
        return {"runner": "v1",
                "requests": len(runner.requests),
                "input_batch_requests": runner.input_batch.num_reqs,
                "pending_sampling_mask": _pending(runner), WORK: _work(runner)}
    return {"runner": type(runner).__name__}


# the scheduler's per-request containers, each counted where the release has it
# (`skipped_waiting` until 0.30; `kv_holding_waiting` and `deferred_waiting` from 0.31)
QUEUES = ("requests", "running", "waiting", "skipped_waiting", "kv_holding_waiting",
          "deferred_waiting", "finished_req_ids")


def engine_state(core) -> dict:
    """Per-request state of an `EngineCore` (runs in the engine-core process,
    between steps)."""
    sched = core.scheduler
    kv = sched.kv_cache_manager
    managers = kv.coordinator.single_type_managers
    pool = kv.block_pool
    return {
        # the queues the release has (0.32 folded `skipped_waiting` into `waiting`)
        "scheduler": {queue: len(getattr(sched, queue)) for queue in QUEUES
                      if hasattr(sched, queue)},
        "kv_cache": {
            "req_to_blocks": sum(len(m.req_to_blocks) for m in managers),
            "num_cached_block": sum(len(m.num_cached_block) for m in managers),
            # the null block is never free and never a request's
            "blocks_in_use": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(),
        },
        # `worker_state` is module-level: pickled by reference to the worker process
        "workers": core.collective_rpc(worker_state),
    }


def apply(module, release: Release) -> None:
    if not enabled():
        return

    def sampling_mask_debug_state(self) -> dict:
        return engine_state(self)

    # The API server calls it as a utility (`call_utility_async(METHOD)`), which upstream
    # dispatches by name, as for `is_sleeping`. The scheduler patch keeps no per-request
    # state of its own (it slices each step's masks in place): nothing of it to count.
    module.EngineCore.sampling_mask_debug_state = sampling_mask_debug_state

