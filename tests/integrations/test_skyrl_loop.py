"""SkyRL 0.4.0's own training entry point with sampling masks, on a CPU host.

Two module-scoped runs of examples/skyrl_cpu.py's job on a loopback Ray head (logical
GPUs), each SkyRL's `skyrl.train.entrypoints.main_base.main` for two GRPO steps:
rollout on the demo model's vLLM server (float32, top-k 8, top-p 0.7, temperature
0.8), SkyRL's own batching (`convert_to_training_input`), the policy's old and the
reference's log-probabilities (`fwd_logprobs_values_reward`), the loss and the
optimizer step (`train_critic_and_policy`), the weight sync to the server (SkyRL's
`delta` backend), and the second rollout on the new weights:
- with masks: SkyRL's sample-support replay fed by this package's route
  (`integrations.skyrl.engine_init_kwargs()` in SkyRL's `engine_init_kwargs`);
- without them: SkyRL's replay off (the control).
Both have the package's fix for SkyRL's tied LM head
(`integrations.skyrl.patch_fsdp_strategy`, from the site hook).
The figures are SkyRL's own: the payload its trainer logs each step
(`policy/loss_metrics/is_ratio_mean`, from its off-policy correction, and
`policy/rollout_train_logprobs_abs_diff_mean`). The CPU-host stand-ins for SkyRL's
CUDA-only lines are the harness's (its docstring lists each with the line it
replaces); none touches the integration.
`python examples/skyrl_cpu.py` runs the same two jobs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import tempfile

import pytest

pytestmark = pytest.mark.skyrl

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")

IS_RATIO = "policy/loss_metrics/is_ratio_mean"
ABS_DIFF = "policy/rollout_train_logprobs_abs_diff_mean"


def _harness():
    for name in ("skyrl", "skyrl_gym", "ray"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed (SkyRL's environment: "
                        "requirements/skyrl-0.4.0-cpu.txt, docs/rl_recipes.md 'SkyRL')")
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import skyrl_cpu
    return skyrl_cpu


@pytest.fixture(scope="module")
def runs():
    harness = _harness()
    with tempfile.TemporaryDirectory(prefix="skyrl-loop-") as work, \
            harness.head() as address:
        yield {"masks": harness.run(True, address, work),
               "stock": harness.run(False, address, work)}


def test_two_steps_run_with_the_weight_sync_between(runs):
    for name, steps in runs.items():
        assert [int(s["trainer/global_step"]) for s in steps] == [1, 2], name
        for s in steps:
            # the loss was taken and the optimizer stepped, then the weights went to
            # the server (SkyRL times each phase of its step)
            assert s["policy/grad_norm"] > 0, (
                name, s["trainer/global_step"], s["policy/grad_norm"],
                "mean |advantage| (zero where every group's rewards tie):",
                s.get("loss/avg_raw_advantages_abs"), "rewards:", s.get("reward/avg_raw_reward"))
            assert s["timing/train_critic_and_policy"] > 0, (name, s)
            assert s["timing/sync_weights"] > 0, (name, s)
            assert math.isfinite(s[IS_RATIO]), (name, s)        # the correction ran


def test_skyrls_off_policy_ratio_reads_one_with_masks_at_step_1(runs):
    """With the masks the trainer's old log-probabilities are taken over each token's
    support, as the engine's were."""
    first = runs["masks"][0]
    assert abs(first[IS_RATIO] - 1.0) < 1e-5, first
    assert first[ABS_DIFF] < 1e-4, first
    print("\nwith masks:", [(s[IS_RATIO], s[ABS_DIFF]) for s in runs["masks"]])


def test_skyrls_off_policy_ratio_reads_one_with_masks_after_the_weight_sync(runs):
    """After the delta sync the engine samples from the weights the trainer stepped
    (its tied LM head kept tied: `integrations.skyrl.patch_fsdp_strategy`)."""
    second = runs["masks"][1]
    assert abs(second[IS_RATIO] - 1.0) < 1e-5, second
    assert second[ABS_DIFF] < 1e-4, second


def test_without_masks_the_same_loop_reads_the_mismatch(runs):
    """The control: without replay SkyRL compares full-softmax log-probabilities with the
    engine's truncated ones."""
    for s in runs["stock"]:
        assert abs(s[IS_RATIO] - 1.0) > 1e-3, s
        assert s[ABS_DIFF] > 1e-2, s
    print("\nwithout masks:", [(s[IS_RATIO], s[ABS_DIFF]) for s in runs["stock"]])
