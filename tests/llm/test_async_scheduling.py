"""Asynchronous scheduling (several steps in flight) on this CPU host.

vLLM turns it off on CPU: `CpuPlatform.check_and_update_config`
(vllm/platforms/cpu.py:144) sets `scheduler_config.async_scheduling = False`
unconditionally, and `VllmConfig.__post_init__` calls it (vllm/config/vllm.py:1488)
after it has already accepted `async_scheduling=True` (vllm.py:1064, the executor,
UniProcExecutor or MultiprocExecutor, supports it). Nothing else on the path refuses
it: MRv2 always returns an `AsyncOutput`, and the CPU shims make its copy event a
no-op. So the test wraps `check_and_update_config` to keep the value the caller set,
and nothing more; the engine then builds an `AsyncScheduler` and a batch queue of
`max_concurrent_batches` = 2 (`EngineCore.step_with_batch_queue`).

Each engine runs in its own subprocess with VLLM_ENABLE_V1_MULTIPROCESSING=0, so
the engine core, UniProcExecutor and MRv2 all live in that process, where the
patch and the instrumentation apply. (In the pytest process an in-process engine
would freeze `vllm.envs` for later tests, `EngineCore.__init__` calls
`enable_envs_cache()`.) The reference is the stock engine asked for the same
`async_scheduling=True`: the platform forces it off, so it runs one step at a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import functools, json, sys
    sys.path.insert(0, sys.argv[1])
    force_async = sys.argv[2] == "1"
    from conftest import ENGINE_KWARGS

    import vllm.platforms.cpu as cpu_platform
    import vllm.v1.engine.core as engine_core
    import vllm.v1.worker.gpu.async_utils as async_utils
    import vllm.v1.worker.gpu.model_runner as model_runner

    if force_async:
        # The only patch: keep the async_scheduling the config already accepted.
        original = cpu_platform.CpuPlatform.check_and_update_config.__func__
        def check_and_update_config(cls, vllm_config):
            keep = vllm_config.scheduler_config.async_scheduling
            original(cls, vllm_config)
            vllm_config.scheduler_config.async_scheduling = keep
        cpu_platform.CpuPlatform.check_and_update_config = classmethod(
            check_and_update_config)

    # Instrumentation: forward passes started, and for each AsyncOutput how many
    # forward passes started after it was created but before it was resolved, and
    # how many steps were in flight (the batch queue plus the one being resolved).
    state = dict(forwards=0, core=None, resolved=[])
    run_model = model_runner.GPUModelRunner.execute_model
    def execute_model(self, scheduler_output, *args, **kwargs):
        if scheduler_output.total_num_scheduled_tokens > 0:
            state["forwards"] += 1
        return run_model(self, scheduler_output, *args, **kwargs)
    model_runner.GPUModelRunner.execute_model = execute_model

    make_output = async_utils.AsyncOutput.__init__      # already wrapped by the overlay
    def init(self, *args, **kwargs):
        self._forward_at_creation = state["forwards"]
        make_output(self, *args, **kwargs)
    async_utils.AsyncOutput.__init__ = init

    resolve = async_utils.AsyncOutput.get_output
    def get_output(self):
        queue = state["core"].batch_queue if state["core"] is not None else None
        state["resolved"].append(dict(
            later_forwards=state["forwards"] - self._forward_at_creation,
            in_flight=1 + (len(queue) if queue is not None else 0)))
        return resolve(self)
    async_utils.AsyncOutput.get_output = get_output

    step_with_batch_queue = engine_core.EngineCore.step_with_batch_queue
    @functools.wraps(step_with_batch_queue)
    def step(self):
        state["core"] = self
        return step_with_batch_queue(self)
    engine_core.EngineCore.step_with_batch_queue = step

    from vllm import LLM, SamplingParams
    llm = LLM(**ENGINE_KWARGS, async_scheduling=True)
    core = llm.llm_engine.engine_core.engine_core   # InprocClient -> EngineCore
    config = llm.llm_engine.vllm_config
    state["resolved"].clear()                         # keep only generation steps
    prompts = ["def main():\\n    ", "import os\\nimport sys\\n\\n",
               "class Parser:\\n    def __init__(self", "    for i in range(",
               "# Copyright 2001 Python Software Foundation\\n", "        return self.",
               "if __name__ == '__main__':\\n", "    raise ValueError("]
    params = [SamplingParams(temperature=1.0, top_k=20, max_tokens=16, seed=1000 + i,
                             logprobs=0) for i in range(len(prompts))]
    outs = llm.generate(prompts, params)
    result = dict(
        client=type(llm.llm_engine.engine_core).__name__,
        async_scheduling=config.scheduler_config.async_scheduling,
        scheduler=type(core.scheduler).__name__,
        batch_queue_size=core.batch_queue_size,
        step_fn=core.step_fn.__name__,
        resolved=state["resolved"],
        completions=[dict(tokens=list(o.outputs[0].token_ids),
                          mask=[list(map(int, s)) for s in o.outputs[0].sampling_mask.token_ids])
                     for o in outs])
    print("RESULT " + json.dumps(result), flush=True)
""")


def _run(force_async: bool) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", SCRIPT, here, "1" if force_async else "0"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    line = next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def runs():
    """The same seeded requests on the forced-async engine and on the stock one."""
    return _run(force_async=True), _run(force_async=False)


def test_stock_cpu_engine_turns_async_scheduling_off(runs):
    _, stock = runs
    assert stock["client"] == "InprocClient"
    assert stock["async_scheduling"] is False       # asked for True; cpu.py:144
    assert stock["scheduler"] == "Scheduler"
    assert stock["batch_queue_size"] == 1 and stock["step_fn"] == "step"
    assert stock["resolved"] and all(r["in_flight"] == 1 and r["later_forwards"] == 0
                                     for r in stock["resolved"])


def test_forced_async_scheduling_keeps_two_steps_in_flight(runs):
    forced, _ = runs
    assert forced["client"] == "InprocClient"
    assert forced["async_scheduling"] is True
    assert forced["scheduler"] == "AsyncScheduler"
    assert forced["batch_queue_size"] == 2 and forced["step_fn"] == "step_with_batch_queue"
    resolved = forced["resolved"]
    assert len(resolved) >= 16
    # Every step's output was resolved while the next step was already in the queue,
    # its forward pass run: the runner executed step N+1 before the engine read step N.
    overlapped = [r for r in resolved if r["in_flight"] == 2 and r["later_forwards"] >= 1]
    assert len(overlapped) >= 15, resolved
    assert max(r["in_flight"] for r in resolved) == 2


def test_forced_async_tokens_and_masks_equal_the_stock_run(runs):
    forced, stock = runs
    assert len(forced["completions"]) == len(stock["completions"]) == 8
    for got, want in zip(forced["completions"], stock["completions"]):
        assert len(got["tokens"]) == 16
        assert got["tokens"] == want["tokens"]
        assert got["mask"] == want["mask"]
        assert len(got["mask"]) == len(got["tokens"])
        for token, support in zip(got["tokens"], got["mask"]):
            assert token in support
            assert support == sorted(set(support))
            assert len(support) >= 20          # top_k=20 (more only on a tie)
