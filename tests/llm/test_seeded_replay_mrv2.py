"""Seeded replay on Model Runner V2 (under Triton's interpreter on this CPU host):
a seeded request returns the same tokens and masks alone and beside greedy,
unseeded and other seeded requests, mask on and off. MRv2 seeds each row in its
Gumbel sampler, so this holds without a patch; kept short (the interpreter is slow)."""

from __future__ import annotations

import pytest
from conftest import ENGINE_KWARGS
from seeded_replay import check_seeded_replay
from vllm import LLM

pytestmark = pytest.mark.mrv2


@pytest.fixture(scope="module")
def llm():
    engine = LLM(**ENGINE_KWARGS, max_num_seqs=8)
    yield engine
    del engine


def test_seeded_request_replays_in_any_batch(llm):
    (module,) = llm.collective_rpc(lambda worker: type(worker.model_runner).__module__)
    assert module != "vllm.v1.worker.cpu_model_runner"
    check_seeded_replay(llm, tokens=6)
