"""Masks through the RL loop's pause and resume (`/pause`, `/resume`, `/is_paused`,
vLLM's RL routes, served with VLLM_SERVER_DEV_MODE=1), on the V1 runner: conftest's
shared `mask_server`.

A trainer pauses the engine between or during rollouts. Here one seeded streamed
request is paused mid-generation in each of upstream's three modes:

- `keep`: the request is frozen (no chunk while paused) and resumes where it was;
  its tokens and masks equal the same seeded request run without a pause, one
  mask per token, nothing lost or doubled;
- `abort`: the request ends (finish reason "abort") with the masks of the tokens
  it got, aligned;
- `wait`: the request runs to its end before the pause returns, with its masks.

After each, the server keeps serving and no per-request mask state is left behind.
"""

from __future__ import annotations

import time

import pytest
from rl_http import TOKENS, Stream, no_state_left, paused, post

pytestmark = pytest.mark.release_tier  # CI runs it on every release


@pytest.fixture
def server(mask_server):
    """conftest's shared server (dev mode: the RL routes), resumed after each test
    whatever its outcome, so that no later test meets a paused engine."""
    yield mask_server
    post(mask_server, "/resume")


def test_keep_freezes_and_resumes_with_the_same_tokens_and_masks(server):
    want_ids, want_masks, finish = Stream(server, seed=11).join()
    assert finish == "length" and len(want_ids) == TOKENS
    stream = Stream(server, seed=11)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="keep")
    assert paused(server)
    frozen_at, frozen = time.monotonic(), stream.tokens()
    time.sleep(1.5)
    assert stream.tokens() == frozen < TOKENS      # nothing generated while paused
    post(server, "/resume")
    assert not paused(server)
    ids, masks, finish = stream.join()
    assert finish == "length"
    assert ids == want_ids and masks == want_masks
    assert any(t > frozen_at + 1.5 for t, *_ in stream.chunks)   # it went on after
    no_state_left(server)


def test_abort_ends_a_request_with_the_masks_it_got(server):
    stream = Stream(server, seed=12)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="abort")
    ids, masks, finish = stream.join()
    post(server, "/resume")
    assert finish == "abort" and 8 <= len(ids) < TOKENS and len(masks) == len(ids)
    no_state_left(server)
    after, _, finish = Stream(server, seed=13).join()     # and the server serves on
    assert finish == "length" and len(after) == TOKENS


def test_wait_lets_a_request_finish_with_its_masks(server):
    stream = Stream(server, seed=14)
    stream.wait_for_tokens(8)
    post(server, "/pause", mode="wait")
    assert stream.tokens() == TOKENS        # the pause returned once it had finished
    post(server, "/resume")
    ids, masks, finish = stream.join()
    assert finish == "length" and len(ids) == len(masks) == TOKENS
    no_state_left(server)
