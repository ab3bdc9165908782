"""OpenRLHF 0.11.2's whole PPO loop (`train_ppo_ray`) with sampling masks, on a CPU host.

Two module-scoped runs of examples/openrlhf_cpu.py's job on a loopback Ray head
(logical GPUs), each two steps: rollout on the demo model's vLLM engine (float32, top-p
0.7, temperature 0.8), OpenRLHF's experience maker with the policy's old and the
reference's log-probabilities (`PolicyModelActor.forward`,
`ReferenceModelActor.forward`), the loss and DeepSpeed's optimizer step
(`training_step`), the weight sync to the engine, and the second rollout on the new
weights:
- `train_ppo_ray` through the launcher (masks) with a two-turn agent script
  (`--train.agent_func_path`, OpenRLHF's `MultiTurnAgentExecutor`: each turn's tokens
  carry their request's supports, the environment's tokens between them none); the
  single-turn executor's rollout is tests/integrations/test_openrlhf_integration.py's;
- `train_ppo_ray` as shipped, single-turn (the control).
The figures are OpenRLHF's own: the status dict its `PPOTrainer` logs each step. The
CPU-host stand-ins for OpenRLHF's CUDA-only lines are the harness's (its docstring lists
each with the line it replaces); none touches the integration.
`python examples/openrlhf_cpu.py` runs the single-turn job with masks too.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import tempfile

import pytest

pytestmark = pytest.mark.openrlhf

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")


def _harness():
    for name in ("openrlhf", "deepspeed", "ray"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (OpenRLHF's environment: "
                        "requirements/openrlhf-0.11.2-cpu.txt, docs/rl_recipes.md 'OpenRLHF')")
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import openrlhf_cpu
    return openrlhf_cpu


@pytest.fixture(scope="module")
def head():
    harness = _harness()
    with tempfile.TemporaryDirectory(prefix="openrlhf-loop-") as work, \
            harness.head() as address:
        yield harness, address, work


@pytest.fixture(scope="module")
def runs(head):
    harness, address, work = head
    return {"masks": harness.run(True, address, work, multi_turn=True),
            "stock": harness.run(False, address, work)}


def test_two_steps_run_with_the_weight_sync_between(runs):
    for name, steps in runs.items():
        assert [s["global_step"] for s in steps] == [1, 2], name
        for s in steps:
            # the optimizer stepped (a learning rate from the first step on) and the
            # weights the sync sent to the engine are no longer the pretrained ones
            assert s["actor_lr"] > 0 and s["weights_change"] > 0, (name, s)
            assert s["timing/broadcast"] > 0, (name, s)
            assert math.isfinite(s["vllm_kl"]), (name, s)     # the correction ran


def test_openrlhfs_mismatch_reads_zero_with_masks_at_both_steps(runs):
    """With the masks the old log-probabilities are the engine's, before and after
    the weight sync: `vllm_kl` 0 and nothing filtered by the correction."""
    for s in runs["masks"]:
        assert abs(s["vllm_kl"]) < 1e-5, s
        assert s["is_filter_ratio"] == 0.0, s
    print("\nwith masks:", [(s["vllm_kl"], s["is_filter_ratio"]) for s in runs["masks"]])


def test_without_masks_the_same_loop_reads_the_mismatch(runs):
    """The control: OpenRLHF as shipped compares full-softmax log-probabilities with
    the engine's truncated ones."""
    for s in runs["stock"]:
        assert abs(s["vllm_kl"]) > 1e-3, s
    print("\nwithout masks:", [(s["vllm_kl"], s["is_filter_ratio"]) for s in runs["stock"]])


def test_multi_turn_each_turn_carries_its_supports(runs):
    """The masked job runs OpenRLHF's MultiTurnAgentExecutor (two answers with
    environment tokens between): every sample took both turns, so the zero mismatch
    above is over both turns' tokens."""
    for s in runs["masks"]:
        assert s["turns"] == 2.0, s


def test_the_support_coverage_is_in_the_status_with_masks_only(runs):
    """The masked job's status (OpenRLHF's PPOTrainer log, from the actor's
    training_step) carries the support's coverage; the stock job's does not."""
    for s in runs["masks"]:
        assert 0.0 <= s["sampling_mask/mass_outside_support"] < 1.0, s
        assert s["sampling_mask/support_size"] >= 1.0, s
    for s in runs["stock"]:
        assert "sampling_mask/mass_outside_support" not in s, s
    print("\ncoverage:", [(s["sampling_mask/mass_outside_support"],
                           s["sampling_mask/support_size"]) for s in runs["masks"]])
