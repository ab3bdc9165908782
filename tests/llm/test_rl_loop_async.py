"""Masks through pause and resume with the engine in the trainer's process:
`AsyncLLM.pause_generation` / `resume_generation` / `is_paused`, the calls an RL
framework that embeds vLLM makes (the HTTP routes are tests/server/test_rl_loop.py).

One seeded request is paused mid-generation in each of upstream's three modes,
on the V1 runner: `keep` freezes it and it resumes with exactly the tokens and
masks of the same request run without a pause; `abort` ends it with the masks of
the tokens it got; `wait` returns once it has finished, with all its masks. The
engine serves on after each. (The offline `LLM` has no pause: its `generate`
returns only when every request has finished.)
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import ENGINE_KWARGS, PROMPTS, check_alignment, native_v1
from vllm import SamplingParams

TOKENS = 64


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop):
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def start():
        with native_v1():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(
                **dict(ENGINE_KWARGS, max_model_len=256, max_num_seqs=4)))
    engine = loop.run_until_complete(start())
    yield engine
    engine.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))   # let its output task see the cancel


class Request:
    """One seeded request consumed on the loop: the token count of its latest
    output, and its last output."""

    def __init__(self, engine, seed: int) -> None:
        self.tokens, self.last = 0, None
        params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=seed,
                                max_tokens=TOKENS, ignore_eos=True)
        self.task = asyncio.ensure_future(self._run(engine, params, f"req-{seed}-{id(self)}"))

    async def _run(self, engine, params, request_id):
        async for out in engine.generate(PROMPTS[0], params, request_id):
            self.last = out
            self.tokens = len(out.outputs[0].token_ids)

    async def reach(self, n: int) -> None:
        for _ in range(6000):
            if self.tokens >= n or self.task.done():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the request stalled")

    async def result(self):
        await asyncio.wait_for(self.task, 300)
        out = self.last.outputs[0]
        check_alignment(out, 4096)
        assert len(out.sampling_mask) == len(out.token_ids)
        return out


def test_keep_freezes_and_resumes_with_the_same_tokens_and_masks(engine, loop):
    async def scenario():
        alone = await Request(engine, seed=31).result()
        request = Request(engine, seed=31)
        await request.reach(8)
        await engine.pause_generation(mode="keep", clear_cache=False)
        assert await engine.is_paused()
        frozen = request.tokens
        await asyncio.sleep(1.0)
        assert request.tokens == frozen < TOKENS         # nothing while paused
        await engine.resume_generation()
        assert not await engine.is_paused()
        return alone, await request.result()

    alone, paused = loop.run_until_complete(scenario())
    assert paused.finish_reason == "length" and len(paused.token_ids) == TOKENS
    assert paused.token_ids == alone.token_ids
    assert paused.sampling_mask == alone.sampling_mask


def test_abort_ends_a_request_with_the_masks_it_got(engine, loop):
    async def scenario():
        request = Request(engine, seed=32)
        await request.reach(8)
        await engine.pause_generation(mode="abort")
        aborted = await request.result()
        await engine.resume_generation()
        return aborted, await Request(engine, seed=33).result()

    aborted, after = loop.run_until_complete(scenario())
    assert aborted.finish_reason == "abort" and 8 <= len(aborted.token_ids) < TOKENS
    assert after.finish_reason == "length" and len(after.sampling_mask) == TOKENS


def test_wait_lets_a_request_finish_with_its_masks(engine, loop):
    async def scenario():
        request = Request(engine, seed=34)
        await request.reach(8)
        await engine.pause_generation(mode="wait")
        finished_first = request.tokens == TOKENS
        await engine.resume_generation()
        return finished_first, await request.result()

    finished_first, out = loop.run_until_complete(scenario())
    assert finished_first                       # the pause returned once it had finished
    assert out.finish_reason == "length" and len(out.sampling_mask) == TOKENS
