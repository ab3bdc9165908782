"""A request that never asked for a mask (switch null) is never failed by the mask
path (issue 27, item 4): the plain-module rules, without an engine. The engine and
HTTP sides are in tests/llm/test_engine.py and tests/http/."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_sampling_mask import SamplingMask
from vllm_sampling_mask.frontend.accumulator import MaskAccumulator
from vllm_sampling_mask.errors import SamplingMaskRequestError
from vllm_sampling_mask.patches.frontend.feature.request_validation import decide_all
from vllm_sampling_mask.frontend.validation import (OPTIONAL_ARG, dropped_reason, mask_is_optional,
                                           resolve_request)

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def params(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0, **extra):
    return SimpleNamespace(top_k=top_k, top_p=top_p, min_p=min_p,
                           temperature=temperature, extra_args=extra or None)


def test_a_top_k_above_the_limit_is_served_without_a_mask_unless_asked():
    def resolve(requested, top_k):
        return resolve_request(engine_on=True, requested=requested, temperature=1.0,
                               top_k=top_k, top_p=1.0, min_p=0.0, max_size=64,
                               vocab_size=4096)
    assert resolve(None, 100) == (False, None)          # known up front: no mask
    assert resolve(None, 64) == (True, None)            # at the limit: a mask
    wants, (param, message) = resolve(True, 100)        # asked: the clear 400, as before
    assert not wants and param == "top_k" and "--max-sampling-mask-size 64" in message
    with pytest.raises(SamplingMaskRequestError, match="max-sampling-mask-size 64"):
        decide_all(params(top_k=100, return_sampling_mask=True), max_size=64,
                   vocab_size=4096)
    assert decide_all(params(top_k=100), max_size=64, vocab_size=4096) == (False, False,
                                                                           False)


def test_only_a_mask_decided_by_default_is_optional():
    assert decide_all(params(top_p=0.99)) == (True, False, True)        # switch null
    assert decide_all(params(top_p=0.99, return_sampling_mask=True)) == (True, False,
                                                                         False)
    # asking for the support logprobs asks for the mask
    assert decide_all(params(top_p=0.99, return_sampling_mask_logprobs=True)) == (
        True, True, False)
    assert decide_all(params(top_p=0.99, return_sampling_mask=False)) == (False, False,
                                                                          False)
    assert mask_is_optional(params(**{OPTIONAL_ARG: True}))
    assert not mask_is_optional(params()) and not mask_is_optional(params(top_k=5))


def _append(acc, *supports):
    for s in supports:
        acc.append(np.array(s, np.int32), np.array([len(s)], np.int32))


def test_a_stopped_mask_is_none_from_that_token_on_never_partial():
    acc = MaskAccumulator()
    _append(acc, [1, 2], [3])
    reason = dropped_reason("the support of a step had 100 ids, more than "
                            "--max-sampling-mask-size 64 allows")
    acc.stop(reason)
    acc.skip(1)                        # the token of the step that lost it
    acc.skip(2)                        # and later ones
    assert len(acc) == 5 and acc.stopped_at == 2 and acc.reason == reason
    assert acc.mask(0, 2).token_ids == [[1, 2], [3]]    # a stream's earlier chunks
    assert acc.mask(0, 5) is None and acc.mask(2, 3) is None and acc.mask(1, 3) is None
    assert acc.mask(5, 5) is None      # a chunk without tokens after the stop
    with pytest.raises(ValueError, match="stopped"):
        _append(acc, [4])
    acc.stop("another reason")         # the first reason stays
    assert acc.reason == reason
    with pytest.raises(ValueError, match="not stopped"):
        MaskAccumulator().skip(1)
    assert "--max-sampling-mask-size 64" in reason and "return_sampling_mask" in reason


def test_from_response_raises_naming_the_reason_for_a_choice_or_a_stream():
    reason = dropped_reason("the support of a step had 100 ids, more than "
                            "--max-sampling-mask-size 64 allows")
    choice = {"index": 0, "token_ids": [5, 6], "sampling_mask": None,
              "sampling_mask_reason": reason}
    with pytest.raises(ValueError, match="more than --max-sampling-mask-size 64"):
        SamplingMask.from_response(choice)
    chunks = [{"choices": [{"index": 0, "token_ids": [5], "sampling_mask": [[4, 5]],
                            "sampling_mask_reason": None}]},
              {"choices": [{"index": 0, "token_ids": [6], "sampling_mask": None,
                            "sampling_mask_reason": reason}]}]
    with pytest.raises(ValueError, match="sampling mask dropped from this token on"):
        SamplingMask.from_response(chunks)
    # the earlier chunks alone still read as their mask
    assert SamplingMask.from_response(chunks[:1]).token_ids == [[4, 5]]
