"""The V1 runner's memory-profiling run through the real upstream `RejectionSampler`:
its dummy sampler run ends with a verify step in which every request is greedy, where
upstream processes no draft position; the profiling step still extracts every row of
the verify batch at the widest layout, as its sizing needs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import skip_without_v1_runner

from vllm_sampling_mask.worker.extraction import ExtractionSettings, MaskLayout
from vllm_sampling_mask.worker.state import SamplingMaskState

VOCAB = 96
MAX_SIZE = 64
REQUESTS = 3   # one draft each, as upstream's dummy run drafts: 6 verify rows
FORMS = {"host form": ExtractionSettings(),
         "block": ExtractionSettings(implementation="host")}


def _upstream():
    skip_without_v1_runner()   # (V1's rejection sampler and sampler)
    from vllm.v1.sample import rejection_sampler, sampler
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    return rejection_sampler, sampler, LogitsProcessors, SamplingMetadata, SpecDecodeMetadata


def _sampling_metadata(SamplingMetadata, LogitsProcessors, *, greedy: bool):
    """The dummy run's metadata for REQUESTS requests (temperature 0.5, top-p 0.9,
    top-k vocab - 1), or its all-greedy variant; fields this release lacks left out."""
    full = lambda v: torch.full((REQUESTS,), v)
    values = dict(
        temperature=None if greedy else full(0.5), all_greedy=greedy, all_random=False,
        top_p=full(0.9), top_k=full(VOCAB - 1), generators={}, max_num_logprobs=None,
        logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=full(0.1), presence_penalties=full(0.1),
        repetition_penalties=full(0.1), output_token_ids=[[] for _ in range(REQUESTS)],
        spec_token_ids=[[] for _ in range(REQUESTS)], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    names = {f.name for f in dataclasses.fields(SamplingMetadata)}
    return SamplingMetadata(**{k: v for k, v in values.items() if k in names})


@pytest.mark.parametrize("form", FORMS)
def test_the_profiling_runs_all_greedy_verify_step_extracts_every_row_at_the_widest(form):
    """Upstream's dummy run: a sampled verify step, then an all-greedy one (in which
    `apply_sampling_constraints` returns before `apply_top_k_top_p`), in one profiling
    step. Each extracts every verify row (drafts and bonus positions) at the widest
    layout, with the support logprobs every row asks for in that run."""
    rejection_sampler, sampler, LogitsProcessors, SamplingMetadata, SpecDecodeMetadata = \
        _upstream()
    state = SamplingMaskState(REQUESTS, MAX_SIZE, FORMS[form])
    target = sampler.Sampler(logprobs_mode="processed_logprobs")
    target.sampling_mask = state      # as `runner_v1` sets it
    verify = rejection_sampler.RejectionSampler(target)
    metadata = SpecDecodeMetadata.make_dummy([[0] for _ in range(REQUESTS)],
                                             torch.device("cpu"))
    rows = 2 * REQUESTS
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0))
    widest = MaskLayout(rows, MAX_SIZE, 0, VOCAB, MAX_SIZE)
    with state.profiling() as step:
        for greedy in (False, True):
            verify(metadata, None, logits.clone(),
                   _sampling_metadata(SamplingMetadata, LogitsProcessors, greedy=greedy))
            mask = step.result("test")
            assert mask.batch_rows == rows and mask.rows is None    # every row
            assert mask.request_rows.tolist() == [2] * REQUESTS
            if mask.host is None:                   # the block form's layout
                assert mask.layout == widest
                assert mask.support_logprobs is not None
            else:                                   # the host form: every row's support
                assert len(mask.host.counts) == rows and (mask.host.counts > 0).all()
                assert mask.host.asked.all()
    assert state.extractions == 0       # the profiling run is not served work
