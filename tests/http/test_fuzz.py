"""Property-based fuzzing of sampling masks over HTTP, against the shared real
`vllm serve` (conftest's `mask_server`: V1 runner, `--max-num-seqs 8
--max-sampling-mask-size 128`, float32).

The generator and the invariants live in `fuzz_support.py` (shared with the long
run, `scripts/fuzz_masks.py`); here hypothesis drives them, derandomized, so the
CI slice is bounded and the same on every run. `FUZZ_EXAMPLES` (default 30) sets
the number of concurrent batches; the seeded-crowd property gets a sixth of it.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_support as fs
from vllm_sampling_mask import DEMO_MODEL

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
CROWDS = max(3, EXAMPLES // 6)


def fuzz_settings(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    print_blob=True, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def checker(hf_model, tokenizer):
    return fs.Checker(hf_model, tokenizer)


def test_concurrent_batches_over_every_route_keep_the_mask_invariants(mask_server, checker):
    """Batches of 1-8 requests at once over the three routes, streamed or not, some
    aborted by the client; every outcome checked (`fuzz_support.Checker.check`),
    then the server is healthy and idle."""
    stats = checker.stats
    start = stats.examples, stats.supports_checked

    @fuzz_settings(EXAMPLES)
    @given(st.data())
    def batches(data):
        violations = fs.fuzz_example(mask_server, checker, fs.HypothesisDraw(data))
        assert not violations, "\n".join(violations)

    batches()
    # and one request wide from its first step on: a size-limit error whatever paths
    # the drawn examples sampled (they depend on the release's CPU sampler)
    wide = {**fs.draw_sampling(fs.RandomDraw(0), seeded=True, greedy=False),
            "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.002, "n": 1,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "logit_bias": {}, "bad_words": [], "stop": [], "stop_token_ids": [],
            "min_tokens": 0, "max_tokens": 16, "ignore_eos": True, "logprobs": None}
    errors, drops = stats.size_limit_errors, stats.size_limit_drops
    fs.run_example(mask_server, checker, [fs.Req("generate", False, [5, 6, 7], wide,
                                                 mask_field=True)])
    assert stats.size_limit_errors == errors + 1, stats.violations[-3:]
    # the same request with the switch unset: served to its end, the mask dropped
    fs.run_example(mask_server, checker, [fs.Req("generate", False, [5, 6, 7], wide)])
    assert stats.size_limit_drops == drops + 1, stats.violations[-3:]
    assert stats.size_limit_errors == errors + 1
    print("\n" + stats.report())
    # the slice was not vacuous: masks were checked, against the reference too,
    # and refusals, size-limit errors and aborts all happened
    assert stats.examples - start[0] >= EXAMPLES
    assert stats.supports_checked - start[1] >= 5 * EXAMPLES
    assert stats.supports_vs_reference > 0 and stats.logprobs_vs_reference > 0
    if EXAMPLES >= 20:
        assert stats.refusals and stats.size_limit_errors and stats.aborts


def test_a_seeded_request_replays_alone_and_in_an_all_seeded_crowd(mask_server, checker):
    """Each request of an all-seeded crowd alone, then all at once: same tokens, same
    masks (or the same size-limit error). All seeded because the V1 CPU sampler
    honours seeds only when every row of the batch has one (see the next test)."""
    stats = checker.stats
    start = stats.replays

    @fuzz_settings(CROWDS)
    @given(st.data())
    def crowds(data):
        violations = fs.fuzz_example(mask_server, checker, fs.HypothesisDraw(data),
                                     crowd=True)
        assert not violations, "\n".join(violations)

    crowds()
    print("\n" + stats.report())
    assert stats.replays - start >= 2 * CROWDS


def _generate(client, base, body):
    return client.post(base + fs.ROUTES["generate"], json={"model": DEMO_MODEL, **body})


async def _alone_then_beside(base, target: dict, companion: dict) -> tuple[dict, dict]:
    """`target` alone, then again while `companion` streams (so that they share
    the decoding steps of `target`): the two choices."""
    async with httpx.AsyncClient(timeout=300) as client:
        alone = (await _generate(client, base, target)).json()["choices"][0]
        async with client.stream("POST", base + fs.ROUTES["generate"],
                                 json={"model": DEMO_MODEL, "stream": True,
                                       **companion}) as r:
            # one iterator, read to the end: a dropped one closes the connection
            # once collected, which aborts the companion
            lines = r.aiter_lines()
            async for line in lines:
                if line:
                    break        # the companion is running
            task = asyncio.create_task(_generate(client, base, target))
            overlapped = False
            async for line in lines:
                overlapped = overlapped or (task.done() and line != "data: [DONE]")
            beside = (await task).json()["choices"][0]
    assert overlapped, "the companion ended before the target: they did not share steps"
    return alone, beside


LONG = dict(max_tokens=480, ignore_eos=True)
TARGET = {"token_ids": [5, 6, 7], "sampling_params": dict(
    temperature=1.0, top_k=50, seed=7, max_tokens=24, ignore_eos=True)}


def test_seeds_hold_beside_seeded_and_unseeded_requests(mask_server):
    """A seeded request replays beside a seeded and beside an unseeded companion
    (upstream vLLM's V1 CPU sampler, `TopKTopPSampler.forward_cpu`, drew every row
    from the global generator once a row had no generator; `cpu_seeded_sampling`
    fixes it). The crowd above stays all-seeded: fuzz coverage of mixed crowds is
    in tests/llm/test_seeded_replay_v1.py."""
    seeded = {"token_ids": [8, 9, 10],
              "sampling_params": dict(temperature=1.0, top_k=50, seed=8, **LONG)}
    unseeded = {"token_ids": [8, 9, 10],
                "sampling_params": dict(temperature=1.0, top_k=50, **LONG)}
    for companion in (seeded, unseeded):
        alone, beside = asyncio.run(_alone_then_beside(mask_server, TARGET, companion))
        assert beside["token_ids"] == alone["token_ids"]
        assert beside["sampling_mask"] == alone["sampling_mask"]
    assert fs.settle(mask_server) is None


def test_a_top_p_1_rows_mask_does_not_depend_on_the_other_rows_top_p(mask_server):
    target = {"token_ids": [5, 6, 7], "return_sampling_mask": True,
              "sampling_params": dict(temperature=0.05, top_k=50, seed=11, max_tokens=12,
                                      ignore_eos=True)}
    companion = {"token_ids": [8, 9, 10],
                 "sampling_params": dict(temperature=1.0, top_p=0.5, seed=12, **LONG)}
    alone, beside = asyncio.run(_alone_then_beside(mask_server, target, companion))
    assert beside["token_ids"] == alone["token_ids"]     # holds: same draws
    assert fs.settle(mask_server) is None
    # upstream cut this row's ids of float32 probability 0 beside a top_p < 1 row
    # (50 ids alone, 20-26 beside); patches/worker/fixes/top_p_one_rows keeps them
    assert beside["sampling_mask"] == alone["sampling_mask"]
    assert all(len(s) == 50 for s in alone["sampling_mask"])
