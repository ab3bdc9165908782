"""The output processor's per-step take of each request's supports (the
`output_processor` patch's `process_outputs` wrapper), without an engine: the
patch applied to stand-ins of upstream's two classes, fed engine-core outputs of
every kind the engine core sends. (End to end: tests/llm/test_engine.py,
tests/frontend/test_requests_without_a_mask_never_fail.py.)"""

from __future__ import annotations

import types
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches.frontend.feature import output_processor


@pytest.fixture(scope="module")
def processor():
    """`OutputProcessor` and `RequestState` stand-ins, patched: upstream's
    `process_outputs` records what it was handed."""
    from vllm.sampling_params import RequestOutputKind

    class RequestState:
        def __init__(self, output_kind):
            self.output_kind = output_kind

        @classmethod
        def from_new_request(cls, request):
            return cls(request.sampling_params.output_kind)

        def _new_completion_output(self, token_ids):
            return SimpleNamespace(token_ids=token_ids, sampling_mask=None,
                                   sampling_mask_reason=None, sampling_mask_error=None)

    class OutputProcessor:
        def __init__(self):
            self.request_states = {}
            self.handed = []

        def process_outputs(self, engine_core_outputs):
            self.handed.append(engine_core_outputs)

    module = types.ModuleType("output_processor_stand_in")
    module.RequestState, module.OutputProcessor = RequestState, OutputProcessor
    output_processor.apply(module, None)

    def make(*requests):
        """A processor holding one request state per (id, wants a mask,
        support logprobs, kind) of `requests`."""
        proc = OutputProcessor()
        for request_id, mask, logprobs, kind in requests:
            extra = {"return_sampling_mask": True,
                     "return_sampling_mask_logprobs": True} if logprobs else \
                {"return_sampling_mask": mask}
            params = SimpleNamespace(output_kind=kind, extra_args=extra, logprobs=0)
            proc.request_states[request_id] = RequestState.from_new_request(
                SimpleNamespace(sampling_params=params))
        return proc
    return make, RequestOutputKind


def out(request_id, tokens=1, ids=None, reason=None, error=None, logprobs=False):
    """An engine-core output of `tokens` tokens whose supports are `ids` (one list
    per token; None: no mask on it)."""
    counts = None if ids is None else np.array([len(s) for s in ids], "<i4").tobytes()
    flat = None if ids is None else np.array([i for s in ids for i in s], "<i4").tobytes()
    return SimpleNamespace(
        request_id=request_id, new_token_ids=list(range(tokens)),
        sampling_mask_ids=flat, sampling_mask_counts=counts,
        sampling_mask_logprobs=(np.full(len(flat) // 4, -1.0, "<f4").tobytes()
                                if logprobs and flat is not None else None),
        sampling_mask_log_kept=(np.zeros(tokens, "<f4").tobytes()
                                if logprobs and flat is not None else None),
        sampling_mask_reason=reason, sampling_mask_error=error)


def test_each_step_of_every_kind_reaches_its_request_then_upstream(processor):
    make, kind = processor
    proc = make(("a", True, False, kind.FINAL_ONLY), ("b", True, False, kind.FINAL_ONLY),
                ("c", True, True, kind.DELTA), ("off", False, False, kind.FINAL_ONLY))
    steps = [
        [out("a", ids=[[3, 9]]), out("b", ids=[[1]]), out("c", ids=[[4]], logprobs=True),
         out("off"), out("gone", ids=[[7]])],
        # b's mask stops (the size limit): that token and later ones carry none
        [out("a", ids=[[2]]), out("b", reason="wider than the limit"),
         out("c", tokens=0)],
        [out("a", tokens=0), out("b", ids=[[5]]), out("b", tokens=2)],
    ]
    for step in steps:
        proc.process_outputs(step)
    assert proc.handed == steps                    # upstream gets every output, as sent
    a, b, c = (proc.request_states[r].sampling_masks for r in "abc")
    assert proc.request_states["off"].sampling_masks is None
    assert a.mask().token_ids == [[3, 9], [2]]
    assert len(b) == 5 and b.stopped_at == 1 and b.reason == "wider than the limit"
    assert b.mask(0, 1).token_ids == [[1]] and b.mask(0, 2) is None
    first = c.newest(1)
    assert first.token_ids == [[4]] and first.logprobs.tolist() == [-1.0]


def test_a_mask_error_is_kept_on_its_request(processor):
    make, kind = processor
    proc = make(("a", True, False, kind.FINAL_ONLY))
    proc.process_outputs([out("a", tokens=0, error="sampling mask: no slot")])
    state = proc.request_states["a"]
    assert state.sampling_mask_error == "sampling mask: no slot"
    assert len(state.sampling_masks) == 0


@pytest.mark.parametrize("logprobs", [False, True])
def test_tokens_without_their_mask_raise_naming_the_hop(processor, logprobs):
    make, kind = processor
    proc = make(("a", True, logprobs, kind.FINAL_ONLY))
    missing = out("a", ids=None if not logprobs else [[3]])   # no logprobs on it
    with pytest.raises(MissingSamplingMaskError, match="OutputProcessor.process_outputs"):
        proc.process_outputs([missing])
    assert proc.handed == []
