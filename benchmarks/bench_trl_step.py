"""TRL's GRPO step with the integration on and off, and the log-prob hook's peak memory.

    python benchmarks/bench_trl_step.py [--pairs 11] [--port 18020] [--json out.json]

Needs TRL (the `trl` extra, vLLM 0.31). Two parts, the demo model on CPU:

Step time. One `trl vllm-serve --return-sampling-mask` server (float32, 1 GiB KV
cache, eager) and two `MaskedGRPOTrainer`s on it: masks on, and masks off
(`sampling_masks=False`: stock TRL's loss, same client and weight sync). Each
sample is one optimizer step, `trainer.train()` with `max_steps=1`, timed by TRL's
own metric `step_time` (its `training_step`: weight sync by checkpoint and
`reload_weights`, rollout, scoring, the old log-probabilities, loss and backward;
not the optimizer step). The arms alternate in pairs (on-off, then off-on), after one
unmeasured step each; reported: each arm's median and interquartile range, and the
median and IQR of the per-pair ratio on / off.

Peak memory of the hook. In a fresh subprocess per variant (glibc returns blocks of
128 KiB or more to the OS on free): a trainer without vLLM, a batch of B completions
of L tokens with supports of about `--support` ids, and one call of
`_get_per_token_logps_and_entropies` (forward with autograd, then backward of the
sum): the masked hook (`nucleus_logprobs_from_hidden`) against TRL's stock hook
(its fused LM head), at `compute_entropy` False (the old log-probabilities) and True
(the loss). The figure is VmHWM - VmRSS before the call (the kernel's peak-RSS
counter reset first), i.e. every byte the call touched beyond the model and batch.
The largest single tensor the call made (bytes) is read with a dispatch mode.

Other jobs may share the cores: the step-time spread says how much.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROMPTS = ["def main():\n    ", "class Parser:\n    def __init__(self",
           "    for i in range(", "if __name__ == '__main__':\n"]


def _reward(completions, **kwargs):
    return [float(len(set(c))) for c in completions]


def _quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": round(statistics.median(xs), 4), "q1": round(q[0], 4),
            "q3": round(q[2], 4), "iqr": round(q[2] - q[0], 4)}


def _trainer(masks: bool, base: str, tokens: int):
    from datasets import Dataset
    from trl import GRPOConfig

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_vllm=True, vllm_mode="server",
        vllm_server_base_url=base, per_device_train_batch_size=16, num_generations=4,
        max_completion_length=tokens, max_steps=1, learning_rate=1e-4, temperature=0.9,
        top_k=50, top_p=0.9, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
        save_strategy="no", seed=0, disable_tqdm=True)
    return MaskedGRPOTrainer(model=DEMO_MODEL, reward_funcs=_reward, args=args,
                             train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
                             sampling_masks=masks)


def _step(trainer) -> float:
    trainer._last_loaded_step = -1          # a weight sync in every step, both arms
    trainer.train()
    return [h["step_time"] for h in trainer.state.log_history if "step_time" in h][-1]


def step_times(args) -> dict:
    import requests

    from vllm_sampling_mask import DEMO_MODEL
    trl_cli = os.path.join(os.path.dirname(sys.executable), "trl")
    server = subprocess.Popen(
        [trl_cli, "vllm-serve", "--model", DEMO_MODEL, "--dtype", "float32",
         "--kv-cache-memory-bytes", "1G", "--return-sampling-mask", "--enforce-eager",
         "--port", str(args.port)],
        env=dict(os.environ, VLLM_SERVER_DEV_MODE="1"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                if requests.get(base + "/health", timeout=5).ok:
                    break
            except requests.RequestException:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError("trl vllm-serve did not start")
            time.sleep(2)
        arms = {"on": _trainer(True, base, args.tokens), "off": _trainer(False, base, args.tokens)}
        for trainer in arms.values():
            _step(trainer)                  # unmeasured
        times = {"on": [], "off": []}
        for i in range(args.pairs):
            for arm in (("on", "off") if i % 2 == 0 else ("off", "on")):
                times[arm].append(_step(arms[arm]))
            print(f"pair {i}: on {times['on'][-1]:.3f} s, off {times['off'][-1]:.3f} s",
                  flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    ratios = [a / b for a, b in zip(times["on"], times["off"])]
    return {"pairs": args.pairs, "seconds": times, "on": _quartiles(times["on"]),
            "off": _quartiles(times["off"]), "ratio_on_off": _quartiles(ratios)}


# ---------------------------------------------------------------------------
# the hook's memory, one variant per subprocess
# ---------------------------------------------------------------------------

def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def hook_memory(variant: str, entropy: bool, batch: int, tokens: int, support: int) -> dict:
    import numpy as np
    import torch
    from datasets import Dataset
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from trl import GRPOConfig, GRPOTrainer

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    from vllm_sampling_mask.frontend.sampling_mask import SamplingMask

    torch.manual_seed(0)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_vllm=False,
                      per_device_train_batch_size=batch, num_generations=4,
                      max_completion_length=tokens, report_to="none", use_cpu=True,
                      bf16=False, save_strategy="no", temperature=0.9)
    trainer = MaskedGRPOTrainer(model=DEMO_MODEL, reward_funcs=_reward, args=args,
                                train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    V = trainer.model.config.vocab_size
    prompt = 16
    ids = torch.randint(3, V, (batch, prompt + tokens))
    attention = torch.ones_like(ids)
    rng = np.random.default_rng(0)
    masks = []
    for row in ids[:, prompt:].tolist():
        lists = []
        for token in row:
            ids_t = set(rng.choice(V, size=support, replace=False).tolist()) | {token}
            lists.append(sorted(ids_t))
        masks.append(SamplingMask.from_lists(lists))

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    if t.layout != torch.strided:     # sparse: its stored values only
                        t = t.values()
                    Largest.largest = max(Largest.largest, t.numel() * t.element_size())
            return out

    def call():
        if variant == "masked":
            trainer._active_masks = masks
            fn = trainer._get_per_token_logps_and_entropies
        else:
            trainer._active_masks = None
            fn = lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k)  # noqa: E731
        logps, _, _ = fn(trainer.model, ids, attention, tokens, compute_entropy=entropy)
        logps.sum().backward()

    trainer.model.train()
    call()                                   # warm: lazy inits, first-touch pages
    trainer.model.zero_grad(set_to_none=False)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss("VmRSS")
    t0 = time.perf_counter()
    call()
    seconds = time.perf_counter() - t0
    peak = _rss("VmHWM") - base
    with Largest():
        call()
    return {"variant": variant, "entropy": entropy, "peak_extra_bytes": peak,
            "largest_tensor_bytes": Largest.largest, "seconds": round(seconds, 4),
            "batch": batch, "tokens": tokens, "vocab": V,
            "logits_BLV_bytes": batch * (prompt + tokens) * V * 4}


def memory_table(args) -> list[dict]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    rows = []
    for entropy in (False, True):
        for variant in ("stock", "masked"):
            r = subprocess.run([sys.executable, __file__, "--memory-variant", variant,
                                "--entropy", str(int(entropy)), "--batch", str(args.batch),
                                "--hook-tokens", str(args.hook_tokens),
                                "--support", str(args.support)],
                               env=env, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-2000:])
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--tokens", type=int, default=32, help="completion tokens (step time)")
    ap.add_argument("--port", type=int, default=18020)
    ap.add_argument("--batch", type=int, default=16, help="hook memory: completions")
    ap.add_argument("--hook-tokens", type=int, default=256, help="hook memory: tokens each")
    ap.add_argument("--support", type=int, default=50, help="hook memory: ids a support")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--memory-variant", help=argparse.SUPPRESS)
    ap.add_argument("--entropy", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_variant:
        print(json.dumps(hook_memory(args.memory_variant, bool(args.entropy), args.batch,
                                     args.hook_tokens, args.support)))
        return
    figures = {"hook_memory": memory_table(args)}
    if not args.skip_steps:
        figures["step_time"] = step_times(args)
    print(json.dumps(figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
