"""SkyRL 0.4.0's own training entry point, two GRPO steps with sampling masks, on a CPU host.

    python examples/skyrl_cpu.py            # with masks, then without (the control)
    python examples/skyrl_cpu.py --masks    # with masks only

A loopback Ray head (tests/ray_head.py) with logical GPUs, so that SkyRL's GPU bundles
and `num_gpus=1` workers schedule; then SkyRL's `skyrl.train.entrypoints.main_base.main`
(validate_cfg, initialize_ray, the `skyrl_entrypoint` task: `BasePPOExp`,
`RayPPOTrainer.train`) in a driver process of its own, configured only through
SkyRL's own options: the demo model in float32 (`trainer.bf16=false`, FSDP2 mixed
precision fp32, `generator.inference_engine.model_dtype=float32`), four prompts, 2
prompts x 4 samples per step, 16 new tokens, top-k 8, top-p 0.7, temperature 0.8,
policy and reference FSDP workers, one vLLM server (vLLM's CPU worker), weight sync
through SkyRL's `delta` backend (checkpoint deltas on disk: no NCCL), and the token
TIS correction on (`trainer.algorithm.off_policy_correction.tis_ratio_type=token`),
whose `is_ratio_mean` compares the old log-probabilities with the engine's.

With masks the run turns on SkyRL's sample-support replay and this package's route
(`integrations.skyrl.engine_init_kwargs()`); without them SkyRL's replay is off
(full-softmax trainer log-probabilities against the engine's truncated ones).
Each step's log payload, as SkyRL's trainer hands it to its tracker
(`Tracking.log`), is written as a JSON line; the script prints each step's
`policy/loss_metrics/is_ratio_mean` and `policy/rollout_train_logprobs_abs_diff_mean`.

Stand-ins for SkyRL's CUDA-only lines, for this harness's processes only (every
process started with examples/skyrl_cpu_site on PYTHONPATH runs its `sitecustomize`,
which calls `install_stand_ins`: the driver, Ray's workers, vLLM's engine-core
process); each is installed only where torch has no CUDA and replaces the line named,
nothing of SkyRL's logic:

- `skyrl/backends/skyrl_train/workers/model_wrapper.py:13` imports
  `flash_attn.bert_padding`, which does not build without CUDA: flash-attn's pure
  tensor functions (tests/flash_attn_stand_in.py; `sdpa` attention never calls them).
- `torch.cuda.current_device()` (workers/worker.py:1090, :1384, :1473, :1636, :1708,
  :1782; distributed/strategy.py:84, :111-112; distributed/fsdp_strategy.py:144;
  distributed/fsdp_utils.py:52, :83), `torch.cuda.set_device`
  (fsdp_strategy.py:109), `torch.cuda.synchronize` and `torch.cuda.empty_cache`
  (fsdp_strategy.py:132-133, :146; fsdp_utils.py:53): the CPU device, no-ops.
- workers/worker.py:124-126 `init_process_group(backend="cpu:gloo,cuda:nccl")`
  (NCCL refuses a host without GPUs): gloo.
- workers/worker.py:134-136 and distributed/fsdp_utils.py:256, :259
  `init_device_mesh("cuda", ...)`: a CPU mesh.
- distributed/fsdp_utils.py:125, :127 (`buf.detach().cuda()`,
  `torch.empty(..., device="cuda")`, the broadcast of non-persistent buffers at
  FSDP2 load): the CPU.

- weight_sync/delta/engine.py:83 (`finalize_layerwise_reload`): vLLM's CPU LM head
  tied to the embedding (the demo model's) keeps its prepacked GEMM on the old
  weights through that reload, so the rollout after a sync came from the new body
  times the old embedding; after it, the harness re-runs the head's
  `process_weights_after_loading`, as the overlay's `cpu_reload_tied_lm_head` does
  after `Worker.reload_weights` (on CUDA the head reads its weight at call time).

Not a CUDA line, on every host: inference_servers/vllm_router.py:128 (a log line,
after the router is up) reads `RouterArgs.pd_disaggregation`, which vllm-router
0.1.17 (the newest release) lacks; the harness gives the class that field (False).

No stand-in touches `vllm_sampling_mask.integrations.skyrl`; the masked run turns it
on through SkyRL's configuration exactly as on a CUDA host.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
SITE = os.path.join(HERE, "skyrl_cpu_site")     # its sitecustomize installs the stand-ins
METRICS_ENV = "SKYRL_CPU_METRICS_FILE"   # SkyRL passes SKYRL_* to its job
ENV_ID = "skyrl_cpu_reward"

PROMPTS = ["The cat sat on the", "Once upon a time", "1 2 3 4", "The weather today is"]


# -- the stand-ins -------------------------------------------------------------------------


def _on_import(module_name, cpu_only=True):
    """Run the decorated hook when `module_name` is imported, once per module object;
    a stand-in (`cpu_only`) only where torch has no CUDA."""
    def register(hook):
        import wrapt

        def once(module):
            done = module.__dict__.setdefault("_skyrl_cpu_stand_ins", set())
            if hook.__name__ in done:
                return
            done.add(hook.__name__)
            if cpu_only:
                import torch
                if torch.cuda.is_available():
                    return
            hook(module)
        wrapt.register_post_import_hook(once, module_name)
        return hook
    return register


_stand_ins_installed = False


def install_stand_ins() -> None:
    """The CPU-host stand-ins listed in the module docstring, and the harness's two
    pieces that are not stand-ins (the reward environment, the metrics reader)
    (idempotent)."""
    global _stand_ins_installed
    if _stand_ins_installed:
        return
    _stand_ins_installed = True

    @_on_import("skyrl", cpu_only=False)
    def _flash_attn(module):
        if TESTS not in sys.path:
            sys.path.append(TESTS)
        import flash_attn_stand_in

        flash_attn_stand_in.install()

    @_on_import("torch")
    def _cuda(torch):
        torch.cuda.current_device = lambda: "cpu"
        torch.cuda.set_device = lambda device: None
        torch.cuda.synchronize = lambda device=None: None
        torch.cuda.empty_cache = lambda: None
        init_process_group = torch.distributed.init_process_group

        @functools.wraps(init_process_group)
        def gloo_only(*args, backend=None, **kwargs):
            if backend == "cpu:gloo,cuda:nccl":
                backend = "gloo"
            return init_process_group(*args, backend=backend, **kwargs)
        torch.distributed.init_process_group = gloo_only

    @_on_import("torch.distributed.device_mesh")
    def _mesh(module):
        original = module.init_device_mesh

        @functools.wraps(original)
        def init_device_mesh(device_type, *args, **kwargs):
            return original("cpu" if device_type == "cuda" else device_type, *args, **kwargs)
        module.init_device_mesh = init_device_mesh

    @_on_import("skyrl.backends.skyrl_train.distributed.fsdp_utils")
    def _buffers(module):
        import torch

        original = module._sync_non_persistent_buffers

        @functools.wraps(original)
        def _sync_non_persistent_buffers(*args, **kwargs):
            cuda, empty = torch.Tensor.cuda, torch.empty

            def cpu_empty(*a, device=None, **k):
                return empty(*a, device="cpu" if device == "cuda" else device, **k)
            torch.Tensor.cuda = lambda self, *a, **k: self.cpu()
            torch.empty = cpu_empty
            try:
                return original(*args, **kwargs)
            finally:
                torch.Tensor.cuda, torch.empty = cuda, empty
        module._sync_non_persistent_buffers = _sync_non_persistent_buffers

    @_on_import("skyrl.backends.skyrl_train.weight_sync.delta.engine")
    def _tied_lm_head(module):
        # vLLM's CPU LM head tied to the embedding keeps a prepacked copy of the old
        # weights through a layerwise reload; the overlay's `cpu_reload_tied_lm_head`
        # rebuilds it after `Worker.reload_weights`, but SkyRL's delta engine reloads
        # through `finalize_layerwise_reload` (delta/engine.py:83): the same rebuild
        # there (on CUDA the head reads its weight at call time)
        cls = module.DeltaWeightTransferEngine
        original = cls.finish_weight_update

        @functools.wraps(original)
        def finish_weight_update(self):
            original(self)
            from vllm.model_executor.layers.vocab_parallel_embedding import (
                UnquantizedEmbeddingMethod)

            from vllm_sampling_mask.patches.worker.fixes.cpu_reload_tied_lm_head import (
                tied_embedding_layers)
            model = self.model
            head = getattr(model, "lm_head", None)
            embed = getattr(getattr(model, "model", None), "embed_tokens", None)
            if (getattr(getattr(model, "config", None), "tie_word_embeddings", False)
                    and head is not None and embed is not None
                    and head.weight is not embed.weight):
                # the reload put the head's own old kernel tensors back
                # (layerwise.py:262-268, "Failed to load weights"): tie it again
                head.tie_weights(embed)
            for layer in tied_embedding_layers(model, UnquantizedEmbeddingMethod):
                layer.quant_method.process_weights_after_loading(layer)
        cls.finish_weight_update = finish_weight_update

    @_on_import("vllm_router.router_args", cpu_only=False)
    def _router_args(module):
        # not a CUDA stand-in: SkyRL's vllm_router.py:128 (a log line, after the
        # router is up) reads `RouterArgs.pd_disaggregation`, which vllm-router 0.1.17,
        # the newest release, does not have (AttributeError on every host)
        if not hasattr(module.RouterArgs, "pd_disaggregation"):
            module.RouterArgs.pd_disaggregation = False

    @_on_import("skyrl_gym.envs", cpu_only=False)
    def _reward_env(module):
        # not a stand-in: the task's environment (a reward that differs between answers)
        module.register(id=ENV_ID, entry_point="skyrl_cpu:RewardEnv")

    @_on_import("skyrl.train.utils.tracking", cpu_only=False)
    def _metrics(module):
        # not a stand-in: the harness's reader of what SkyRL's trainer logs each step
        original = module.Tracking.log

        @functools.wraps(original)
        def log(self, data, step, commit=False):
            path = os.environ.get(METRICS_ENV)
            if path and data:
                row = {k: float(v) for k, v in data.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
                row["step"] = step
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            return original(self, data, step, commit=commit)
        module.Tracking.log = log


def reward(answer: str) -> float:
    """The task's score: one that differs between answers (any signal will do for two
    steps)."""
    return (sum(map(ord, answer)) % 97) / 97.0


def _reward_env_class():
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class RewardEnv(BaseTextEnv):
        """One turn, scored by `reward`."""

        def __init__(self, env_config=None, extras=None):
            super().__init__()

        def step(self, action: str) -> BaseTextEnvStepOutput:
            return BaseTextEnvStepOutput(observations=[], reward=reward(action), done=True,
                                         metadata={})
    return RewardEnv


def __getattr__(name):
    if name == "RewardEnv":
        return _reward_env_class()
    raise AttributeError(name)


# -- a run -----------------------------------------------------------------------------


def overrides(masks: bool, work: str, name: str) -> list[str]:
    """SkyRL's configuration for one run (its `key=value` command-line overrides)."""
    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.integrations import skyrl as adapter

    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt": [{"role": "user", "content": p}],
                                "env_class": ENV_ID}) + "\n")
    engine = {"worker_cls": "vllm.v1.worker.cpu_worker.CPUWorker",
              "kv_cache_memory_bytes": 1 << 30}
    if masks:
        engine.update(adapter.engine_init_kwargs())
    engine_kwargs = "{" + ", ".join(
        f"{k}: [{', '.join(v)}]" if isinstance(v, list) else f"{k}: {str(v).lower()}"
        if isinstance(v, bool) else f"{k}: {v}" for k, v in engine.items()) + "}"
    fp32 = "{param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}"
    args = [
        f"data.train_data=['{data}']",
        "data.dataloader.num_workers=0",      # no 8 spawned loader processes
        f"trainer.policy.model.path={DEMO_MODEL}",
        f"trainer.run_name={name}", "trainer.logger=console",
        "trainer.strategy=fsdp",
        "trainer.placement.colocate_all=false",
        "trainer.placement.colocate_policy_ref=false",
        "trainer.placement.policy_num_gpus_per_node=1",
        "trainer.placement.ref_num_gpus_per_node=1",
        "trainer.bf16=false", "trainer.flash_attn=false",
        "trainer.remove_microbatch_padding=false",
        f"trainer.policy.fsdp_config.mixed_precision={fp32}",
        f"trainer.ref.fsdp_config.mixed_precision={fp32}",
        "trainer.epochs=1", "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "trainer.micro_train_batch_size_per_gpu=4",
        "trainer.micro_forward_batch_size_per_gpu=4",
        "trainer.max_prompt_length=64", "trainer.eval_interval=-1",
        "trainer.eval_before_train=false", "trainer.ckpt_interval=-1",
        "trainer.hf_save_interval=-1", "trainer.enable_ray_gpu_monitor=false",
        f"trainer.ckpt_path={work}/ckpt", f"trainer.export_path={work}/export",
        f"trainer.log_path={work}/logs", "trainer.seed=7",
        # 1e-3 made one step's policy so sharp that top-p 0.7 kept one token at every
        # position of the next rollout: with masks each log-probability over a one-token
        # support is 0, and that step trained nothing (docs/rl_recipes.md, SkyRL)
        "trainer.policy.optimizer_config.lr=1e-4",
        "trainer.policy.optimizer_config.num_warmup_steps=0",
        "trainer.algorithm.advantage_estimator=grpo",
        "trainer.algorithm.use_kl_loss=true",
        "trainer.algorithm.off_policy_correction.tis_ratio_type=token",
        # four answers per prompt: a GRPO group whose rewards all tie has no advantage,
        # and at step 1 no KL gradient either (benchmarks/skyrl_reward_ties.py counts
        # the ties; docs/rl_recipes.md, SkyRL)
        "generator.n_samples_per_prompt=4",
        "generator.sampling_params.max_generate_length=16",
        "generator.sampling_params.temperature=0.8",
        "generator.sampling_params.top_p=0.7",
        "generator.sampling_params.top_k=8",
        "generator.sampling_params.logprobs=0",
        "generator.inference_engine.num_engines=1",
        # vLLM's CPU platform has no Ray executor
        "generator.inference_engine.distributed_executor_backend=mp",
        "generator.inference_engine.model_dtype=float32",
        "generator.inference_engine.enforce_eager=true",
        "generator.inference_engine.enable_ray_prometheus_stats=false",
        "generator.inference_engine.enable_prefix_caching=false",
        "generator.inference_engine.weight_sync_backend=delta",
        f"generator.inference_engine.delta_weight_sync.sync_dir={work}/delta-{name}",
        "generator.inference_engine.delta_weight_sync.publish_num_workers=1",
        f"generator.inference_engine.delta_weight_sync.local_checkpoint_dir={work}/delta-ckpt-{name}",
        f"generator.inference_engine.delta_weight_sync.publish_staging_dir={work}/delta-staging-{name}",
        f"generator.inference_engine.engine_init_kwargs={engine_kwargs}",
        f"environment.env_class={ENV_ID}",
    ]
    if masks:
        args += ["trainer.algorithm.enable_sample_support_replay=true",
                 "generator.inference_engine.enable_return_sample_support_set=true"]
    return args


def _driver(argv: list[str]) -> None:
    """SkyRL's own `main` (a process of its own, connected to the head through
    RAY_ADDRESS, which SkyRL's `initialize_ray` joins)."""
    from skyrl.train.entrypoints import main_base

    sys.argv = ["skyrl.train.entrypoints.main_base", *argv]
    main_base.main()


def run(masks: bool, address: str, work: str, timeout: float = 1500) -> list[dict]:
    """One SkyRL training job against the head at `address`; its steps' log payloads."""
    name = "masks" if masks else "stock"
    metrics = os.path.join(work, f"{name}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ)
    env["RAY_ADDRESS"] = address
    env[METRICS_ENV] = metrics
    # SkyRL's rollout servers take ports from here on (past the head's own block)
    env["SKYRL_VLLM_START_PORT"] = str(int(address.rsplit(":", 1)[1]) + 50)
    cmd = [sys.executable, os.path.abspath(__file__), "--driver", "--",
           *overrides(masks, work, name)]
    log = os.path.join(work, f"driver-{name}.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            proc.wait(60)
            raise RuntimeError(f"SkyRL's main ran past {timeout} s; its log: {log}")
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-8000:]
        raise RuntimeError(f"SkyRL's main exited {rc}; its log {log} ends:\n{tail}")
    with open(metrics) as f:
        return [json.loads(line) for line in f if "trainer/global_step" in line]


def _head_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([SITE, HERE, TESTS, ROOT] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(VLLM_USE_V2_MODEL_RUNNER="0", TOKENIZERS_PARALLELISM="false")
    # this interpreter's environment first (its `ray` starts the head)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return env


@contextlib.contextmanager
def head(num_cpus: int = 8, num_gpus: int = 4):
    """A loopback Ray head with logical GPUs, every process of it with the stand-ins;
    yields its address."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    from ray_head import ray_head   # first: it keeps Ray on loopback (LOOPBACK_ENV)
    import ray

    env = _head_env()
    os.environ.update({k: env[k] for k in ("PYTHONPATH", "PATH", "VLLM_USE_V2_MODEL_RUNNER",
                                           "TOKENIZERS_PARALLELISM")})
    with ray_head(ray, num_cpus=num_cpus, num_gpus=num_gpus, env=env,
                  prefix="skyrl-cpu-") as base:
        ray.shutdown()                  # the jobs connect from their own drivers
        yield f"127.0.0.1:{base}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--masks", action="store_true", help="the masked run only")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        _driver(args.rest)
        return
    plan = [True] + ([] if args.masks else [False])
    with tempfile.TemporaryDirectory(prefix="skyrl-cpu-") as work, head() as address:
        for masks in plan:
            start = time.monotonic()
            steps = run(masks, address, work)
            took = time.monotonic() - start
            print(f"{'with masks' if masks else 'without masks'}: {len(steps)} steps, "
                  f"{took:.0f} s")
            for s in steps:
                print(f"  step {s['step']}: is_ratio_mean "
                      f"{s.get('policy/loss_metrics/is_ratio_mean', float('nan')):.6g}, "
                      f"rollout/train |logprob diff| mean "
                      f"{s.get('policy/rollout_train_logprobs_abs_diff_mean', float('nan')):.3g}, "
                      f"policy_loss {s.get('policy/policy_loss', float('nan')):.4g}, "
                      f"grad_norm {s.get('policy/grad_norm', float('nan')):.3g}, "
                      f"entropy {s.get('policy/policy_entropy', float('nan')):.3g}, "
                      f"kl {s.get('policy/policy_kl', float('nan')):.3g}, "
                      f"reward {s.get('reward/avg_raw_reward', float('nan')):.3g}")


if __name__ == "__main__":
    main()
