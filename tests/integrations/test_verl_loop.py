"""verl 0.9.1's own GRPO loop, two steps, with and without sampling masks, on this host.

`examples/verl_cpu.py` runs verl's V1 trainer (`main_ppo`'s `TaskRunnerV1`,
`PPOTrainerSync` over TransferQueue) as `main_ppo` runs it: rollout through verl's
agent loop and `vLLMHttpServer` (an engine of the demo model, float32, TP 1, verl's
default `load_format: dummy`, so the engine holds the trainer's weights only through
verl's weight sync), `compute_log_prob`, GRPO advantages, the rollout correction,
the reference policy's log-probabilities (verl's ref worker, for a low-variance KL
loss), `update_actor` (FSDP2, gloo) and the weight sync before the second rollout.
Each run has a Ray head of its own (logical GPUs for verl's placement groups); the CPU
stand-ins are in examples/verl_cpu_host.py.

The metrics are verl's own dict of each step (its `file` logger): the rollout
correction's importance weights (`rollout_corr/rollout_is_*`, trainer old
log-probabilities against the engine's) and verl's training-vs-rollout probability
difference (`training/rollout_probs_diff_*`). With masks they read 1 and 0 within 1e-5
at step 1 and at step 2 (after an optimizer step with lr 1e-3 and the sync); without
(the control, verl's stock full softmax) they do not.

The masked run packs its micro-batches (`use_remove_padding`, verl's default) and
splits them by token count (`use_dynamic_bsz`); the control runs padded with fixed
micro-batches. The masked padded path runs in test_verl_integration.py on micro-batches
built by verl.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from ray_head import ray_head

pytestmark = pytest.mark.verl

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")


def _run(tmp_path, name, **settings):
    """One verl run in a Ray head of its own: verl's metrics dict of each step."""
    pytest.importorskip("verl", reason="verl is not installed (its environment: "
                        "requirements/verl-0.9.1-cpu.txt, docs/rl_recipes.md 'verl')")
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import verl_cpu
    from verl_cpu_host import ENV

    # verl_cpu.prepare_process()'s environment (verl's CPU platform, its module on this
    # run's path only), undone after the run: a later module's Ray head (the other
    # modules of the step may follow on this worker) copies os.environ
    with pytest.MonkeyPatch.context() as scope:
        for key, value in ENV.items():
            scope.setenv(key, value)
        return _train(verl_cpu, ray, tmp_path, name, settings)


def _train(verl_cpu, ray, tmp_path, name, settings):
    directory = tmp_path / name
    directory.mkdir()
    config = verl_cpu.compose(verl_cpu.overrides(str(directory), **settings))
    metrics_path = str(directory / "metrics.jsonl")
    # the V1 runner natively, as verl's server picks it on a CPU host (conftest's
    # defaults are for the interpreted runner)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    start = time.monotonic()
    with ray_head(ray, size=60, num_cpus=16, num_gpus=1, env=env, prefix="verl-loop-",
                  runtime_env=verl_cpu.runtime_env(config, metrics_path)):
        verl_cpu.train(config)
    metrics = verl_cpu.read_metrics(metrics_path)
    print(f"{name}: {time.monotonic() - start:.0f} s")
    verl_cpu.show(metrics)
    return metrics


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("verl-loop")
    masked = _run(tmp_path, "masked", masks=True, remove_padding=True, dynamic_bsz=True)
    stock = _run(tmp_path, "stock", masks=False, remove_padding=False, dynamic_bsz=False)
    return masked, stock


WEIGHTS = ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_min",
           "rollout_corr/rollout_is_max")
DIFFS = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean")


def test_both_runs_do_two_training_steps(runs):
    for metrics in runs:
        assert len(metrics) == 2
        for m in metrics:
            assert m["actor/grad_norm"] > 0 and m["actor/lr"] > 0   # an optimizer step
            assert m["response_length/mean"] > 0


def test_the_reference_policy_takes_part(runs):
    """verl's reference worker gives the KL term its log-probabilities: equal to the
    policy's at step 1 (the same weights), apart at step 2 (the policy stepped)."""
    for metrics in runs:
        first, second = (m["actor/kl_loss"] for m in metrics)
        assert abs(first) < 1e-6 and second > 1e-4, (first, second)


def test_with_masks_verls_importance_weights_are_1_before_and_after_the_weight_sync(runs):
    masked, _ = runs
    for step, m in enumerate(masked, 1):
        for key in WEIGHTS:
            assert abs(m[key] - 1) < 1e-5, (step, key, m[key])
        for key in DIFFS:
            assert m[key] < 1e-5, (step, key, m[key])


def test_without_masks_the_same_metrics_show_the_full_softmaxs_mismatch(runs):
    _, stock = runs
    for step, m in enumerate(stock, 1):
        assert m["rollout_corr/rollout_is_mean"] < 0.99, (step, m["rollout_corr/rollout_is_mean"])
        assert m["rollout_corr/rollout_is_min"] < 0.9
        assert m["training/rollout_probs_diff_max"] > 1e-2


def test_with_masks_verl_logs_the_supports_coverage(runs):
    """update_actor's metrics carry the coverage (verl prefixes them `actor/`); the
    control, without masks, has none."""
    masked, stock = runs
    for m in masked:
        assert 0.0 <= m["actor/sampling_mask/mass_outside_support"] < 1.0, m
        assert m["actor/sampling_mask/support_size"] >= 1.0, m
    for m in stock:
        assert "actor/sampling_mask/mass_outside_support" not in m
