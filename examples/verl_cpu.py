"""verl 0.9.1's own GRPO trainer, two steps with sampling masks, on a CPU host.

    python examples/verl_cpu.py            # with masks
    python examples/verl_cpu.py --no-mask  # the control: verl's stock full softmax

verl's V1 trainer (`verl.trainer.main_ppo`'s `TaskRunnerV1`, `trainer.v1.trainer_mode=
sync`: `PPOTrainerSync` over TransferQueue) runs as `main_ppo` runs it: rollout through
its agent loop and `vLLMHttpServer` (an engine of the demo model, float32, TP 1, with
`return_sampling_mask` in `engine_kwargs.vllm`), old log-probabilities
(`compute_log_prob`), GRPO advantages, the rollout correction, the loss and an
optimizer step (`update_actor`), then verl's weight sync into the engine and the next
rollout on the new weights. The data set (a few prompts) is written to a temporary
directory; the reward is `compute_score` below. Each step's metrics are verl's own
dict, as its `file` logger writes them.

On a CPU host verl needs a device platform for the CPU and Ray GPUs to place its
workers: examples/verl_cpu_host.py registers the platform (verl's platform registry),
the Ray head gets logical GPUs (no code change), and verl's own settings do the rest
(`trainer.device=cpu`, `VERL_ENGINE_DEVICE`, gloo). Nothing here changes
`vllm_sampling_mask`; on a CUDA host run `verl.trainer.main_ppo` with the
`MASK_OVERRIDES` below.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# the settings that turn the masks on (docs/rl_recipes.md, verl)
MASK_OVERRIDES = [
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.return_sampling_mask=true",
    "actor_rollout_ref.rollout.logprobs_mode=processed_logprobs",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "actor_rollout_ref.model.use_fused_kernels=false",
    "algorithm.rollout_correction.rollout_is=token",
]

PROMPTS = ["count to five", "name a colour", "say hello", "spell cat"]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The reward: more distinct characters score higher (any score will do)."""
    return float(len(set(solution_str))) / 10.0


def write_dataset(directory: str) -> str:
    """The prompts as verl's RLHFDataset reads them: a parquet of chat prompts."""
    import pandas as pd

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": p}],
             "ability": "toy", "reward_model": {"style": "rule", "ground_truth": ""},
             "extra_info": {"index": i}} for i, p in enumerate(PROMPTS)]
    path = os.path.join(directory, "train.parquet")
    pd.DataFrame(rows).to_parquet(path)
    return path


def overrides(directory: str, *, masks: bool = True, remove_padding: bool = True,
              dynamic_bsz: bool = False, steps: int = 2) -> list[str]:
    """verl's configuration for the smallest real GRPO run on the demo model."""
    from vllm_sampling_mask import DEMO_MODEL

    data = write_dataset(directory)
    rollout = "actor_rollout_ref.rollout"
    actor = "actor_rollout_ref.actor"
    ref = "actor_rollout_ref.ref"
    lines = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}", f"data.val_files={data}",
        "data.train_batch_size=2", "data.max_prompt_length=32",
        "data.max_response_length=8", "data.dataloader_num_workers=0", "data.shuffle=false",
        f"actor_rollout_ref.model.path={DEMO_MODEL}",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.ppo_mini_batch_size=2", f"{actor}.ppo_micro_batch_size_per_gpu=4",
        f"{actor}.use_dynamic_bsz={dynamic_bsz}", f"{actor}.ppo_max_token_len_per_gpu=96",
        f"{actor}.strategy=fsdp2", f"{actor}.fsdp_config.strategy=fsdp2",
        # float32 throughout, as the engine: no bfloat16 mixed precision (its default)
        f"+{actor}.fsdp_config.mixed_precision.param_dtype=fp32",
        f"+{actor}.fsdp_config.mixed_precision.reduce_dtype=fp32",
        f"+{actor}.fsdp_config.mixed_precision.buffer_dtype=fp32",
        f"{actor}.use_torch_compile=false",
        f"{actor}.fsdp_config.use_torch_compile=false",
        f"{actor}.optim.lr=1e-3",
        # a KL term to a reference policy (verl's ref worker: its own log-probabilities)
        f"{actor}.use_kl_loss=true", f"{actor}.kl_loss_coef=0.01",
        f"{actor}.kl_loss_type=low_var_kl",
        f"{ref}.log_prob_micro_batch_size_per_gpu=4", f"{ref}.use_torch_compile=false",
        f"{ref}.fsdp_config.strategy=fsdp2", f"{ref}.fsdp_config.dtype=float32",
        f"{ref}.fsdp_config.use_torch_compile=false",
        f"+{ref}.fsdp_config.mixed_precision.param_dtype=fp32",
        f"+{ref}.fsdp_config.mixed_precision.reduce_dtype=fp32",
        f"+{ref}.fsdp_config.mixed_precision.buffer_dtype=fp32",
        f"{rollout}.name=vllm", f"{rollout}.n=4",
        f"{rollout}.temperature=0.8", f"{rollout}.top_k=8", f"{rollout}.top_p=0.7",
        f"{rollout}.tensor_model_parallel_size=1", f"{rollout}.dtype=float32",
        f"{rollout}.enforce_eager=true", f"{rollout}.free_cache_engine=false",
        f"+{rollout}.enable_sleep_mode=false", f"{rollout}.max_model_len=64",
        f"{rollout}.max_num_batched_tokens=256", f"{rollout}.max_num_seqs=8",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=4",
        f"{rollout}.agent.num_workers=1",
        f"+{rollout}.engine_kwargs.vllm.kv_cache_memory_bytes={1 << 29}",
        f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes=64",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={os.path.abspath(__file__)}",
        "reward.custom_reward_function.name=compute_score",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=[console,file]", f"trainer.default_local_dir={directory}/ckpt",
    ]
    if masks:
        lines += MASK_OVERRIDES
    else:
        lines += [m for m in MASK_OVERRIDES if "return_sampling_mask" not in m]
    return lines


def compose(lines: list[str]):
    """verl's `ppo_trainer` configuration with `lines` applied, as `main_ppo` gets it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    import verl.trainer.main_ppo as main_ppo

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=lines)


def runtime_env(config, metrics_path: str) -> dict:
    """Ray's runtime environment for the run: verl's own (`get_ppo_ray_runtime_env`)
    plus the CPU platform module and the metrics file."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    env = OmegaConf.to_container(OmegaConf.create(get_ppo_ray_runtime_env(config)))
    env_vars = env.setdefault("env_vars", {})
    from verl_cpu_host import ENV

    env_vars.update(ENV)
    env_vars["TRANSFER_QUEUE_ENABLE"] = "1"   # run_ppo's line for a Ray it starts itself
    env_vars["VERL_FILE_LOGGER_PATH"] = metrics_path
    env_vars["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def prepare_process() -> None:
    """This process's environment: the CPU platform, before verl picks one."""
    from verl_cpu_host import ENV

    os.environ.update(ENV)


def train(config) -> None:
    """verl's `main_ppo.main` after its Hydra parse: validate, then `run_ppo` (Ray is
    already connected)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    run_ppo(config, task_runner_class=TaskRunnerV1)


def read_metrics(path: str) -> list[dict]:
    """verl's metrics dict of each step, as its file logger wrote them."""
    with open(path) as f:
        return [json.loads(line)["data"] for line in f if line.strip()]


KEYS = ["training/rollout_probs_diff_max", "training/rollout_probs_diff_mean",
        "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_min",
        "rollout_corr/rollout_is_max", "rollout_corr/kl", "actor/pg_loss", "actor/kl_loss",
        "actor/grad_norm", "critic/score/mean", "timing_s/step"]


def show(metrics: list[dict]) -> None:
    for step, m in enumerate(metrics, 1):
        found = {k: m[k] for k in KEYS if k in m}
        print(f"step {step}: " + "  ".join(f"{k} {v:.6g}" for k, v in found.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-mask", action="store_true", help="the control run")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    prepare_process()
    # the local cluster and the engine on loopback: Ray and vLLM take the host's interface
    # address otherwise (Ray reads its switch at import)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    import ray

    with tempfile.TemporaryDirectory(prefix="verl-cpu-") as tmp:
        config = compose(overrides(tmp, masks=not args.no_mask, steps=args.steps))
        metrics_path = os.path.join(tmp, "metrics.jsonl")
        # logical GPUs: one per verl worker (see examples/verl_cpu_host.py)
        ray.init(num_cpus=16, num_gpus=1, include_dashboard=False,
                 runtime_env=runtime_env(config, metrics_path))
        start = time.monotonic()
        try:
            train(config)
        finally:
            ray.shutdown()
        show(read_metrics(metrics_path))
        print(f"wall time {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
