"""What the sampling mask changes in a GRPO run: TRL, the demo model, CPU (issue 64).

    python benchmarks/train_effect.py            # the pre-registered experiment
    python benchmarks/train_effect.py --quick    # the pipeline only (claims nothing)
    python benchmarks/train_effect.py --plot-only [--out DIR]

Needs the `trl` and `bench` extras (TRL 1.16, vLLM 0.31, matplotlib). Everything
below is fixed in code before any full run (pre-registration); the command line
chooses only the output folder and --quick.

Task ("digits"). Prompts: the 16 Python openings in ``PROMPTS``. Reward: the share of
the completion's characters that are ASCII digits (0 to 1; an empty completion
scores 0). It is checked by one line of code (verifiable), dense (every completion
scores, so GRPO's group advantages are rarely all zero) and reachable by the demo
model, which was trained on Python code and writes digits in ``range(...)``,
indices and literals at a low base rate: untruncated GRPO raises it within a few
dozen steps (the probe, docs/training_effect.md). Digits are ordinary tokens that
top-k / top-p keep or cut like any others, so the task does not favour an arm.

Arms (``ARMS``). Same model, prompts, reward, optimiser, seeds and steps; all but
the reference sample with temperature 1, top-k 50, top-p 0.9 (``TRUNCATED``):
- ``reference``: no truncation (temperature 1, top-k 0, top-p 1), stock TRL (its
  default importance correction, which is about 1 here);
- ``masks``: ``MaskedGRPOTrainer``: the loss's log-probabilities over the supports
  the engine drew from (TRL's default correction then compares like with like);
- ``stock_is``: stock TRL's loss (full softmax) with its default vLLM importance
  correction (``sequence_mask``, clip_max 3: each completion weighted by the product
  of its kept masses, measured-2026-12-07);
- ``stock_no_is``: stock TRL's loss with the correction off;
- ``token_truncate``: stock TRL's loss, the correction per token, clamped at 3.
Stock arms run ``MaskedGRPOTrainer(sampling_masks=False)``: TRL's own loss and
correction; the subclass only passes the CPU engine arguments (float32, 1 GiB KV
cache, eager) that TRL's colocated ``LLM(...)`` has no option for.

Lengths (``LENGTHS``): max_completion_length 16 and 128. Seeds (``SEEDS``): 0, 1, 2
(TRL's ``seed``: model init is the checkpoint; the seed drives sampling and
shuffling). Budget (``STEPS``): 30 optimizer steps per run at length 16, 15 at 128;
5 arms x 2 lengths x 3 seeds = 30 runs. Estimate, from steps measured on this host
while other jobs loaded it (load average 8-14 on 2 cores): a step costs about 5 s of
CPU at length 16 (wall: median 7 s loaded, 0.5 s at best) and about 10 s at 128
(wall 12, 9, 6 s after the first, 42 s, warm-up), each run's trainer and engine
build about 20 s, each process's imports about 40 s: 15 x 30 x 5 + 15 x 15 x 10 +
30 x 20 + 6 x 40 = 5,340 s, about 89 minutes.
GRPO (``GRPO``): 2 prompts x 8 generations per step, one optimizer step per
generation, learning rate 1e-3, beta 0 (TRL's default), colocated vLLM.

Each length and seed is one subprocess, its arms run one after another (each
run builds its own trainer and colocated engine and frees them) and writes
``<out>/<arm>-L<length>-s<seed>.json``: the configuration, ``quick``, and per logged
step TRL's metrics (reward, ``sampling/importance_sampling_ratio/*``,
``sampling/sampling_logp_difference/*``, ...), the share of sequences / tokens the
correction masked or clipped in that step's batch (``is_masked_share``,
``is_clipped_share``, computed from TRL's own weights in the batch), the masks arm's
``sampling_mask/mass_outside_support`` and ``support_size``, and the wall time.
Then ``plot`` draws ``<out>/train_effect.png`` and ``table`` writes
``<out>/train_effect.md``.

``--quick``: 2 steps at length 16, seed 0, each arm, into
``benchmarks/results/train_effect/quick/``: it checks that every arm runs and that
the JSON, plot and table are written. Its numbers mean nothing and are marked
``"quick": true``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROMPTS = [
    "def main():\n    ", "class Parser:\n    def __init__(self", "    for i in range(",
    "if __name__ == '__main__':\n", "import os\nimport sys\n\n", "x = [",
    "def test_parse():\n    assert ", "    return self.", "for key, value in ",
    "# compute the total\ntotal = ", "with open(path) as f:\n    ", "while True:\n    ",
    "try:\n    ", "def __repr__(self):\n        return ", "    if not ", "result = {",
]
TRUNCATED = dict(temperature=1.0, top_k=50, top_p=0.9)
UNTRUNCATED = dict(temperature=1.0, top_k=0, top_p=1.0)
# arm -> (sampling, MaskedGRPOTrainer keywords, GRPOConfig overrides)
ARMS = {
    "reference": (UNTRUNCATED, dict(sampling_masks=False), {}),
    "masks": (TRUNCATED, dict(sampling_masks=True), {}),
    "stock_is": (TRUNCATED, dict(sampling_masks=False), {}),
    "stock_no_is": (TRUNCATED, dict(sampling_masks=False),
                    dict(vllm_importance_sampling_correction=False)),
    "token_truncate": (TRUNCATED, dict(sampling_masks=False),
                       dict(vllm_importance_sampling_mode="token_truncate")),
}
LENGTHS = (16, 128)
SEEDS = (0, 1, 2)
STEPS = {16: 30, 128: 15}           # optimizer steps per run, by length
THRESHOLD = 0.2                     # "steps to reward": first step at or above it
GRPO = dict(per_device_train_batch_size=16, num_generations=8, learning_rate=1e-3,
            beta=0.0, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
            save_strategy="no", use_vllm=True, vllm_mode="colocate")
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=1 << 30, enforce_eager=True)
QUICK = dict(lengths=(16,), seeds=(0,), steps=2)
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "train_effect")
PANELS = [
    ("reward", "reward"),
    ("sampling/importance_sampling_ratio/mean", "TRL importance ratio (mean)"),
    ("is_masked_share", "share TRL's correction masked (seq or token)"),
    ("is_clipped_share", "share TRL's correction clipped"),
    ("sampling_mask/mass_outside_support", "mass outside the support (masks arm)"),
    ("sampling/sampling_logp_difference/mean", "|trainer - engine| log-prob (mean)"),
]


def digits_reward(completions, **kwargs):
    """Share of each completion's characters that are ASCII digits."""
    return [sum(c in "0123456789" for c in text) / len(text) if text else 0.0
            for text in completions]


def run_name(arm: str, length: int, seed: int) -> str:
    return f"{arm}-L{length}-s{seed}"


# ---------------------------------------------------------------------------
# One run (in its own process)
# ---------------------------------------------------------------------------

def _weights_share(output: dict, args) -> tuple[float, float]:
    """Share of the batch's sequences (sequence modes) or tokens (token modes) whose
    importance weight TRL's correction set to 0 (``*_mask``) or clamped (``*_truncate``),
    read from the weights TRL put in the batch."""
    weights = output.get("importance_sampling_ratio")
    if weights is None or not args.vllm_importance_sampling_correction:
        return 0.0, 0.0
    mode = args.vllm_importance_sampling_mode
    completion = output["completion_mask"].bool()
    w = weights.squeeze(-1) if weights.dim() == 2 and weights.size(-1) == 1 else weights
    if mode.startswith("sequence"):
        values = w.reshape(-1)
    else:
        values = w[completion]
    if values.numel() == 0:
        return 0.0, 0.0
    hi = args.vllm_importance_sampling_clip_max
    lo = args.vllm_importance_sampling_clip_min
    if mode.endswith("mask"):
        return float((values == 0).float().mean()), 0.0
    clipped = values >= hi * (1 - 1e-6)
    if lo is not None:
        clipped |= values <= lo * (1 + 1e-6)
    return 0.0, float(clipped.float().mean())


def run_one(arm: str, length: int, seed: int, steps: int, out: str, quick: bool) -> str:
    from datasets import Dataset
    from trl import GRPOConfig

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer

    sampling, trainer_kwargs, overrides = ARMS[arm]
    scratch = tempfile.mkdtemp(prefix="train-effect-")     # TRL's output_dir, unused
    config = dict(GRPO, **sampling, **overrides, max_completion_length=length, seed=seed,
                  max_steps=steps, output_dir=scratch)
    shares: list[tuple[float, float]] = []

    class Trainer(MaskedGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            shares.append(_weights_share(output, self.args))
            return output

    args = GRPOConfig(**config)
    dataset = Dataset.from_dict({"prompt": PROMPTS * max(1, steps)})
    start = time.time()
    trainer = Trainer(model=DEMO_MODEL, reward_funcs=digits_reward, args=args,
                      train_dataset=dataset, vllm_engine_kwargs=ENGINE, **trainer_kwargs)
    built = time.time() - start
    trainer.train()
    wall = time.time() - start
    rows = []
    for entry in trainer.state.log_history:
        if "reward" not in entry:
            continue
        row = {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        i = len(rows)
        if i < len(shares):
            row["is_masked_share"], row["is_clipped_share"] = shares[i]
        rows.append(row)
    record = dict(arm=arm, length=length, seed=seed, steps=steps, quick=quick,
                  sampling=sampling, trainer_kwargs=trainer_kwargs,
                  grpo={k: v for k, v in config.items() if k != "output_dir"},
                  task="digits", wall_s=round(wall, 1), build_s=round(built, 1),
                  step_s=round((wall - built) / max(steps, 1), 2), log=rows)
    path = os.path.join(out, run_name(arm, length, seed) + ".json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    _release(trainer)
    shutil.rmtree(scratch, ignore_errors=True)
    return path


def _release(trainer) -> None:
    """Free the run's colocated engine so that the next run in this process builds its own."""
    import gc
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and getattr(generation, "llm", None) is not None:
        del generation.llm
    del trainer
    gc.collect()


# ---------------------------------------------------------------------------
# Plot and table
# ---------------------------------------------------------------------------

def load_runs(out: str) -> list[dict]:
    runs = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".json") and "-L" in name:
            with open(os.path.join(out, name)) as f:
                runs.append(json.load(f))
    return runs


def _series(run: dict, key: str) -> list[float]:
    return [row.get(key, math.nan) for row in run["log"]]


def _mean_spread(columns: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per step: mean over seeds and the spread (min..max half-width)."""
    steps = max(len(c) for c in columns)
    means, spreads = [], []
    for s in range(steps):
        values = [c[s] for c in columns if s < len(c) and not math.isnan(c[s])]
        means.append(statistics.fmean(values) if values else math.nan)
        spreads.append((max(values) - min(values)) / 2 if values else math.nan)
    return means, spreads


def plot(out: str, runs: list[dict]) -> str:
    """One PNG: a row per completion length, a panel per metric, a line per arm
    (mean over seeds, band: min to max over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in runs})
    arms = [a for a in ARMS if any(r["arm"] == a for r in runs)]
    colours = {arm: f"C{i}" for i, arm in enumerate(ARMS)}   # one colour per arm
    fig, axes = plt.subplots(len(lengths), len(PANELS), squeeze=False,
                             figsize=(4 * len(PANELS), 3.2 * len(lengths)))
    for i, length in enumerate(lengths):
        for j, (key, title) in enumerate(PANELS):
            ax = axes[i][j]
            for arm in arms:
                columns = [_series(r, key) for r in runs
                           if r["arm"] == arm and r["length"] == length]
                if not columns or all(math.isnan(v) for c in columns for v in c):
                    continue
                mean, spread = _mean_spread(columns)
                x = list(range(1, len(mean) + 1))
                ax.plot(x, mean, label=arm, color=colours[arm])
                ax.fill_between(x, [m - s for m, s in zip(mean, spread)],
                                [m + s for m, s in zip(mean, spread)],
                                color=colours[arm], alpha=0.2)
            ax.set_title(f"{title}\nlength {length}", fontsize=8)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    quick = any(r["quick"] for r in runs)
    fig.suptitle("train_effect" + (" (QUICK: pipeline check, no claim)" if quick else ""))
    fig.tight_layout()
    path = os.path.join(out, "train_effect.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def table(out: str, runs: list[dict]) -> str:
    """Markdown: per length and arm, the final reward (mean over seeds, min..max), the
    steps to ``THRESHOLD`` (mean over the seeds that reached it, and how many did) and
    the effective weight (mean of TRL's importance-ratio mean over steps; 1 where the
    correction is off)."""
    lines = []
    if any(r["quick"] for r in runs):
        lines.append("QUICK run: checks the pipeline only; these numbers claim nothing.\n")
    lines += ["| length | arm | final reward (mean, min..max) | steps to reward "
              f">= {THRESHOLD} | effective weight (mean IS weight) |",
              "|---|---|---|---|---|"]
    for length in sorted({r["length"] for r in runs}):
        for arm in ARMS:
            group = [r for r in runs if r["arm"] == arm and r["length"] == length]
            if not group:
                continue
            finals = [_series(r, "reward")[-1] for r in group if r["log"]]
            reached = []
            for r in group:
                hit = [i + 1 for i, v in enumerate(_series(r, "reward")) if v >= THRESHOLD]
                if hit:
                    reached.append(hit[0])
            weights = []
            for r in group:
                if r["grpo"].get("vllm_importance_sampling_correction", True) is False:
                    weights.append(1.0)
                    continue
                values = [v for v in _series(r, "sampling/importance_sampling_ratio/mean")
                          if not math.isnan(v)]
                if values:
                    weights.append(statistics.fmean(values))
            final = (f"{statistics.fmean(finals):.3f} ({min(finals):.3f}..{max(finals):.3f})"
                     if finals else "n/a")
            steps = (f"{statistics.fmean(reached):.1f} ({len(reached)}/{len(group)} seeds)"
                     if reached else f"not reached (0/{len(group)})")
            weight = f"{statistics.fmean(weights):.3f}" if weights else "n/a"
            lines.append(f"| {length} | {arm} | {final} | {steps} | {weight} |")
    path = os.path.join(out, "train_effect.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="2 steps, length 16, seed 0, every arm: the pipeline only")
    parser.add_argument("--out", default=None,
                        help=f"output folder (default {DEFAULT_OUT}, quick: .../quick)")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw the plot and table from the JSON in --out")
    parser.add_argument("--group", nargs=3, metavar=("LENGTH", "SEED", "STEPS"),
                        help=argparse.SUPPRESS)      # every arm of one length and seed
    args = parser.parse_args(argv)
    out = args.out or (os.path.join(DEFAULT_OUT, "quick") if args.quick else DEFAULT_OUT)
    os.makedirs(out, exist_ok=True)
    if args.group:
        length, seed, steps = (int(v) for v in args.group)
        for arm in ARMS:
            t0 = time.time()
            run_one(arm, length, seed, steps, out, args.quick)
            print(f"{run_name(arm, length, seed)}: {time.time() - t0:.0f} s", flush=True)
        return 0
    if not args.plot_only:
        lengths = QUICK["lengths"] if args.quick else LENGTHS
        seeds = QUICK["seeds"] if args.quick else SEEDS
        start = time.time()
        for length in lengths:
            steps = QUICK["steps"] if args.quick else STEPS[length]
            for seed in seeds:
                # one process per length and seed, its arms one after another
                cmd = [sys.executable, os.path.abspath(__file__), "--group", str(length),
                       str(seed), str(steps), "--out", out] + (["--quick"] if args.quick
                                                               else [])
                subprocess.run(cmd, check=True, cwd=ROOT)
                print(f"length {length} seed {seed} done (total {time.time() - start:.0f} s)",
                      flush=True)
    runs = load_runs(out)
    if not runs:
        parser.error(f"no run JSON in {out}")
    print(plot(out, runs))
    print(table(out, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
