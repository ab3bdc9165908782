"""Seeded replay on vLLM's V1 runner, native on this CPU host: a seeded request
returns the same tokens and masks alone and beside greedy, unseeded and other
seeded requests, mask on and off (needs the `cpu_seeded_sampling` patch: upstream's
`forward_cpu` drew every row from the global generator once a row had no seed)."""

from __future__ import annotations

import pytest
from conftest import ENGINE_KWARGS, native_v1
from seeded_replay import check_seeded_replay
from vllm import LLM


@pytest.fixture(scope="module")
def llm():
    with native_v1():
        engine = LLM(**ENGINE_KWARGS, max_num_seqs=8)
    yield engine
    del engine


def test_seeded_request_replays_in_any_batch(llm):
    (module,) = llm.collective_rpc(lambda worker: type(worker.model_runner).__module__)
    assert module == "vllm.v1.worker.cpu_model_runner"
    check_seeded_replay(llm, tokens=24)
