"""OpenRLHF 0.11.2's own `train_ppo_ray`, two PPO steps with sampling masks, on a CPU host.

    python examples/openrlhf_cpu.py               # with masks, then without (the control)
    python examples/openrlhf_cpu.py --masks       # with masks only
    python examples/openrlhf_cpu.py --multi-turn  # and a masked run of a two-turn agent

A loopback Ray head (tests/ray_head.py) with logical GPUs, so that OpenRLHF's GPU
bundles and `@ray.remote(num_gpus=1)` actors schedule; then `train_ppo_ray` started
through the launcher (`python -m vllm_sampling_mask.integrations.openrlhf`), in a
driver process of its own, with OpenRLHF's own arguments: the demo model, four local
prompts, a reward script, 2 prompts x 2 samples per step, top-p 0.7, temperature 0.8,
`--algo.advantage.is_correction_level token`, `--vllm.sync_backend gloo`, DeepSpeed's
CPU accelerator (`DS_ACCELERATOR=cpu`). Each step's status dict, as OpenRLHF's
`PPOTrainer` hands it to its logger (`save_logs_and_checkpoints`), is written as a
JSON line; the script prints each step's `vllm_kl` and `is_filter_ratio` (OpenRLHF's
train/rollout mismatch: with masks `vllm_kl` within 1e-5 of 0, without them about 0.3;
the correction filters nothing in either run).

Stand-ins for OpenRLHF's CUDA-only lines, for this harness's processes only (every
process started with this directory on PYTHONPATH runs `sitecustomize` below, which
calls `install_stand_ins`: the driver, Ray's workers, vLLM's engine-core process).
Each replaces the line named, nothing of OpenRLHF's logic; the one setting beyond CUDA
lines is the precision (float32 in place of bf16, in both runs, below):

- `openrlhf/models/ring_attn_utils.py:3-4` imports flash-attn, which does not build
  without CUDA: flash-attn's pure tensor functions (tests/flash_attn_stand_in.py).
- `torch.cuda.current_device()` (trainer/ray/launcher.py:136 and :190,
  trainer/ray/ppo_actor.py:171 and :627, utils/deepspeed/deepspeed.py:614 and :633),
  `torch.cuda.set_device` (deepspeed.py:97), `torch.cuda.synchronize` and
  `torch.cuda.empty_cache` (utils/distributed_util.py:10, launcher.py:64-65,
  ppo_actor.py:417 and :489): the CPU device, no-ops.
- `trainer/ppo_utils/replay_buffer.py:40` `torch.device(f"cuda:{...}")`: the CPU.
- `utils/deepspeed/deepspeed.py:105` `init_device_mesh("cuda", ...)`: a CPU mesh.
- `--ds.param_dtype` takes bf16 or fp16 only (cli/train_ppo_ray.py:334): the harness
  passes bf16 and runs float32, as the engine does: `utils/utils.py:17`
  (`convert_to_torch_dtype`) gives float32, and DeepSpeed's `"bf16": {"enabled"}`
  (utils/deepspeed/deepspeed_utils.py:50 and :104) is off.
- `trainer/ray/vllm_engine.py:273` `"dtype": "bfloat16"` and `gpu_memory_utilization`
  (vllm_engine.py:276): the rollout actor's engine runs float32 with a 1 GiB KV cache
  (a CPU engine needs its size).
- `trainer/ray/vllm_worker_wrap.py:40` `torch.empty(..., device="cuda")`: the weight
  buffer of `update_weight` on the CPU.
- `utils/distributed_util.py:13-26` `stateless_init_process_group` (vLLM's
  `StatelessProcessGroup` and a `PyNcclCommunicator`, used by ppo_actor.py:147 and
  vllm_worker_wrap.py:20): the same rendezvous with a gloo group (vLLM's
  `stateless_init_torch_distributed_process_group`), and `torch.cuda.current_stream()`
  (ppo_actor.py:436, vllm_worker_wrap.py:46) None. OpenRLHF's other route,
  `--vllm.sync_with_ray --vllm.sync_backend gloo` (Ray's collectives), fails with Ray
  2.55: `TorchGLOOGroup.__init__` (ray/util/collective/collective_group/
  torch_gloo_collective_group.py:61) skips the rendezvous where the process already
  has a default torch.distributed group (DeepSpeed's) and :107
  `dist.new_group(ranks=ranks, backend="gloo")` raises "ValueError: the new group's
  world size should be less or equal to the world size set by init_process_group".

No stand-in touches `vllm_sampling_mask.integrations.openrlhf`; the masked run installs
it exactly as the launcher does on a CUDA host.
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
SITE = os.path.join(HERE, "openrlhf_cpu_site")     # its sitecustomize installs the stand-ins
STATUS_ENV = "OPENRLHF_CPU_STATUS_FILE"

PROMPTS = ["The cat sat on the", "Once upon a time", "1 2 3 4", "The weather today is"]

REWARD = '''\
import torch


def reward_func(queries, prompts, labels, **kwargs):
    """A score that differs between answers (any signal will do for two steps)."""
    rewards = torch.tensor([(sum(map(ord, q[len(p):])) % 97) / 97.0
                            for q, p in zip(queries, prompts)])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''

AGENT = '''\
"""A two-turn environment for `--train.agent_func_path`, run by OpenRLHF's own
MultiTurnAgentExecutor: after each answer it appends a line of feedback (environment
tokens: no sampling support, no action), and ends after the second answer."""
import torch

from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

TURN_TOKENS = 6


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        self.turns = 0

    async def reset(self, states, **kwargs):
        return {"observation": states["observation"]}

    async def step(self, states, **kwargs):
        self.turns += 1
        reward = torch.tensor((sum(map(ord, states["action_text"])) % 97) / 97.0)
        return {"rewards": reward, "scores": reward, "environment_feedback": " Then:",
                "done": self.turns >= 2, "extra_logs": {"turns": float(self.turns)}}


class _TurnBudget:
    """The engine as the executor sees it, each turn at most TURN_TOKENS tokens
    (MultiTurnAgentExecutor gives a turn all the room left up to --data.max_len)."""

    def __init__(self, engine):
        self.engine = engine

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        sampling_params.max_tokens = min(sampling_params.max_tokens, TURN_TOKENS)
        return await self.engine.generate(prompt_token_ids, sampling_params,
                                          multi_modal_data=multi_modal_data)


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(AgentInstance)

    async def execute(self, *args, llm_engine, **kwargs):
        return await super().execute(*args, llm_engine=_TurnBudget(llm_engine), **kwargs)
'''


# -- the stand-ins -------------------------------------------------------------------------


def _on_import(module_name, cpu_only=True):
    """Run the decorated hook when `module_name` is imported, once per module object
    (the driver runs this file as __main__ beside the `openrlhf_cpu` its
    sitecustomize imports); a stand-in (`cpu_only`) only where torch has no CUDA."""
    def register(hook):
        import wrapt

        def once(module):
            done = module.__dict__.setdefault("_openrlhf_cpu_stand_ins", set())
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


def _ray_class(obj):
    meta = getattr(obj, "__ray_metadata__", None)
    return obj if meta is None else meta.modified_class


_stand_ins_installed = False


def install_stand_ins() -> None:
    """The CPU-host stand-ins listed in the module docstring (idempotent)."""
    global _stand_ins_installed
    if _stand_ins_installed:
        return
    _stand_ins_installed = True

    @_on_import("openrlhf", cpu_only=False)
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
        torch.cuda.current_stream = lambda device=None: None

    @_on_import("openrlhf.utils.distributed_util")
    def _weight_sync(module):
        original = module.stateless_init_process_group
        module.stateless_init_process_group = functools.wraps(original)(_gloo_weight_group)

    @_on_import("openrlhf.trainer.ray.ppo_actor")
    def _weight_sync_actor(module):
        module.stateless_init_process_group = _gloo_weight_group

    @_on_import("openrlhf.trainer.ppo_utils.replay_buffer")
    def _replay_buffer(module):
        import torch

        cls = module.NaiveReplayBuffer
        original = cls.__init__

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            current = torch.cuda.current_device
            torch.cuda.current_device = lambda: 0     # replay_buffer.py:40 builds "cuda:N"
            try:
                original(self, *args, **kwargs)
            finally:
                torch.cuda.current_device = current
            self.target_device = torch.device("cpu")
        cls.__init__ = __init__

    @_on_import("openrlhf.utils.deepspeed.deepspeed")
    def _deepspeed(module):
        mesh = module.init_device_mesh

        def init_device_mesh(device_type, *args, **kwargs):
            return mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)
        module.init_device_mesh = init_device_mesh

        for name in ("get_train_ds_config", "get_eval_ds_config"):
            original = getattr(module, name)

            def float32(*args, _original=original, **kwargs):
                config = _original(*args, **kwargs)
                config["bf16"] = {"enabled": False}
                return config
            setattr(module, name, functools.wraps(original)(float32))

    @_on_import("openrlhf.utils.utils")
    def _dtype(module):
        import torch

        original = module.convert_to_torch_dtype
        module.convert_to_torch_dtype = functools.wraps(original)(
            lambda param_dtype: torch.float32)

    @_on_import("openrlhf.trainer.ray.vllm_engine")
    def _engine(module):
        cls = _ray_class(module.RolloutRayActor)
        original = cls.__init__

        @functools.wraps(original)
        async def __init__(self, *args, **kwargs):
            kwargs["dtype"] = "float32"
            kwargs.pop("gpu_memory_utilization", None)
            kwargs["kv_cache_memory_bytes"] = 1 << 30
            await original(self, *args, **kwargs)
        cls.__init__ = __init__

    @_on_import("openrlhf.trainer.ray.vllm_worker_wrap")
    def _worker(module):
        import torch

        original = module.WorkerWrap.update_weight

        @functools.wraps(original)
        def update_weight(self, *args, **kwargs):
            empty = torch.empty

            def cpu_empty(*a, device=None, **k):
                return empty(*a, device="cpu" if device == "cuda" else device, **k)
            torch.empty = cpu_empty
            try:
                return original(self, *args, **kwargs)
            finally:
                torch.empty = empty
        module.WorkerWrap.update_weight = update_weight

    @_on_import("openrlhf.trainer.ppo_trainer", cpu_only=False)
    def _status(module):
        # not a stand-in: the harness's reader of the status OpenRLHF logs each step,
        # on the class whose method the Ray actor calls (Ray's subclass may hold a copy)
        cls = next(c for c in (_ray_class(module.PPOTrainer), module.PPOTrainer,
                               module.BasePPOTrainer)
                   if "save_logs_and_checkpoints" in c.__dict__)
        original = cls.__dict__["save_logs_and_checkpoints"]

        @functools.wraps(original)
        def save_logs_and_checkpoints(self, global_step, logs_dict=None, *args, **kwargs):
            path = os.environ.get(STATUS_ENV)
            if path and logs_dict:
                row = {k: float(v) for k, v in logs_dict.items()
                       if isinstance(v, (int, float)) or getattr(v, "ndim", 1) == 0}
                row["global_step"] = global_step
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            return original(self, global_step, logs_dict, *args, **kwargs)
        cls.save_logs_and_checkpoints = save_logs_and_checkpoints


    @_on_import("openrlhf.trainer.ray.ppo_actor", cpu_only=False)
    def _sync_reader(module):
        # not a stand-in: how far the weights sent to the engine are from the
        # pretrained ones (one line per weight sync)
        import torch

        original = module.ActorPPOTrainer.broadcast_to_vllm

        @functools.wraps(original)
        def broadcast_to_vllm(self):
            path = os.environ.get(STATUS_ENV)
            if path and torch.distributed.get_rank() == 0:
                from safetensors.torch import load_file

                from vllm_sampling_mask import DEMO_MODEL
                start = load_file(os.path.join(DEMO_MODEL, "model.safetensors"))
                change = max((float((p.detach().float() - start[n].float()).abs().max())
                              for n, p in self.actor.model.module.named_parameters()
                              if n in start), default=-1.0)
                with open(path + ".sync", "a") as f:
                    f.write(json.dumps({"weights_change": change}) + "\n")
            return original(self)
        module.ActorPPOTrainer.broadcast_to_vllm = broadcast_to_vllm


class _GlooBroadcast:
    """The weight-sync group's one call, `broadcast(tensor, src, stream)`, over gloo."""

    def __init__(self, group):
        self.group = group

    def broadcast(self, tensor, src, stream=None):
        self.group.broadcast(tensor, src).wait()


def _gloo_weight_group(master_address, master_port, rank, world_size, device):
    """Stands in for utils/distributed_util.py:13-26 (vLLM's StatelessProcessGroup with
    a PyNcclCommunicator): the same rendezvous, a gloo group."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return _GlooBroadcast(stateless_init_torch_distributed_process_group(
        master_address, master_port, rank, world_size, backend="gloo"))


def setup_masked() -> None:
    """Every worker of the masked job: the stand-ins, then the integration's own hook."""
    install_stand_ins()
    from vllm_sampling_mask.integrations import openrlhf as adapter
    adapter.install()


# -- a run -----------------------------------------------------------------------------


def train_args(work: str, multi_turn: bool = False) -> list[str]:
    """`train_ppo_ray`'s arguments: two steps of two prompts x two samples, 8 new
    tokens (or two turns of at most 6 with `multi_turn`: the agent script above)."""
    from vllm_sampling_mask import DEMO_MODEL

    prompts = os.path.join(work, "prompts.jsonl")
    with open(prompts, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"input": p}) + "\n")
    script = os.path.join(work, "agent.py" if multi_turn else "reward.py")
    with open(script, "w") as f:
        f.write(AGENT if multi_turn else REWARD)
    return [
        "--actor.model_name_or_path", DEMO_MODEL,
        "--data.prompt_dataset", prompts, "--data.input_key", "input",
        "--data.max_len", "64", "--rollout.max_new_tokens", "8",
        "--train.agent_func_path" if multi_turn else "--reward.remote_url", script,
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1",
        "--vllm.enforce_eager", "--vllm.sync_backend", "gloo",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", "1",
        "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2",
        "--rollout.micro_batch_size", "4", "--train.batch_size", "4",
        "--train.micro_batch_size", "4", "--train.max_epochs", "1",
        "--train.num_episodes", "1",
        "--rollout.temperature", "0.8", "--rollout.top_p", "0.7",
        "--algo.advantage.estimator", "group_norm",
        "--algo.advantage.is_correction_level", "token",
        "--algo.kl.init_coef", "0.01", "--actor.adam.lr", "1e-3",
        "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--ds.zero_stage", "0", "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", "eager",
        "--ckpt.path", os.path.join(work, "ckpt"), "--ckpt.output_dir",
        os.path.join(work, "out"), "--train.seed", "7",
    ]


def _driver(masks: bool, address: str, status: str, argv: list[str]) -> None:
    """One training job (a process of its own: the integration patches its process)."""
    import openrlhf_cpu      # the module its sitecustomize installed (this is __main__)

    openrlhf_cpu.install_stand_ins()
    import ray

    env = {STATUS_ENV: status, "PYTHONPATH": os.pathsep.join([SITE, HERE, TESTS] + [
               p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
           "DS_ACCELERATOR": "cpu", "VLLM_USE_V2_MODEL_RUNNER": "0",
           "TOKENIZERS_PARALLELISM": "false"}
    if masks:
        from vllm_sampling_mask.integrations import openrlhf as adapter

        runtime_env = adapter.runtime_env(env)
        runtime_env["worker_process_setup_hook"] = "openrlhf_cpu.setup_masked"
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
        adapter.main(argv)          # connected: it keeps this job's runtime environment
    else:
        import runpy

        ray.init(address=address, runtime_env={"env_vars": env}, logging_level="WARNING")
        sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
    ray.shutdown()


def run(masks: bool, address: str, work: str, multi_turn: bool = False,
        timeout: float = 1500) -> list[dict]:
    """One `train_ppo_ray` job against the head at `address`; its steps' status dicts."""
    name = ("masks" if masks else "stock") + ("-multi-turn" if multi_turn else "")
    status = os.path.join(work, f"status-{name}.jsonl")
    for path in (status, status + ".sync"):
        if os.path.exists(path):
            os.remove(path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SITE, HERE, TESTS] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(DS_ACCELERATOR="cpu", VLLM_USE_V2_MODEL_RUNNER="0")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--driver",
           "masks" if masks else "stock", "--address", address, "--status", status,
           "--", *train_args(work, multi_turn)]
    log = os.path.join(work, f"driver-{name}.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            proc.wait(60)
            raise RuntimeError(f"train_ppo_ray ran past {timeout} s; its log: {log}")
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-6000:]
        raise RuntimeError(f"train_ppo_ray exited {rc}; its log {log} ends:\n{tail}")
    with open(status) as f:
        steps = [json.loads(line) for line in f]
    with open(status + ".sync") as f:       # one weight sync per step, after its update
        for step, line in zip(steps, f):
            step.update(json.loads(line))
    return steps


@contextlib.contextmanager
def head(num_cpus: int = 8, num_gpus: int = 4):
    """A loopback Ray head with logical GPUs; yields its address."""
    sys.path.insert(0, TESTS)
    from ray_head import ray_head   # first: it keeps Ray on loopback (LOOPBACK_ENV)
    import ray

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with ray_head(ray, num_cpus=num_cpus, num_gpus=num_gpus, env=env,
                  prefix="openrlhf-cpu-") as base:
        ray.shutdown()                  # the jobs connect from their own drivers
        yield f"127.0.0.1:{base}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--masks", action="store_true", help="the masked run only")
    parser.add_argument("--multi-turn", action="store_true",
                        help="then a masked run with the two-turn agent script")
    parser.add_argument("--driver", choices=["masks", "stock"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--status", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        _driver(args.driver == "masks", args.address, args.status, args.rest)
        return
    plan = [(True, False)] + ([] if args.masks else [(False, False)])
    plan += [(True, True)] if args.multi_turn else []
    with tempfile.TemporaryDirectory(prefix="openrlhf-cpu-") as work, head() as address:
        for masks, multi_turn in plan:
            start = time.monotonic()
            steps = run(masks, address, work, multi_turn)
            took = time.monotonic() - start
            print(f"{'with masks' if masks else 'without masks'}"
                  f"{', two turns' if multi_turn else ''}: {len(steps)} steps, {took:.0f} s")
            for s in steps:
                print(f"  step {s['global_step']}: vllm_kl {s.get('vllm_kl'):.3g}, "
                      f"is_filter_ratio {s.get('is_filter_ratio'):.3g}, "
                      f"policy_loss {s.get('policy_loss'):.4g}, reward {s.get('reward'):.3g}, "
                      f"weights moved {s.get('weights_change', 0):.2g}"
                      + (f", turns {s['turns']:.2g}" if "turns" in s else ""))


if __name__ == "__main__":
    main()
