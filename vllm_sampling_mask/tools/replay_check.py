"""See the replay on your own model: importance ratios with and without the mask.

    python -m vllm_sampling_mask.tools.replay_check [--model M] [--server URL]
        [--arm temperature=1.0,top_k=50 ...] [--prompts FILE] [--out DIR]

Rolls out prompts under a grid of sampling arms (temperature, top_k, top_p,
min_p), in-process (`vllm.LLM`, mask on, float32) or against a running server
(`--server URL`, through `POST /inference/v1/generate`), then recomputes the
trainer's side with `transformers` in float32 and reports, per arm:

- tokens; support size mean / median / p99 and the share of singleton supports;
- with the mask (the trainer renormalises over each token's support, as
  `training.nucleus_logprobs` does) and without it (full vocabulary,
  `training.full_logprobs`): the mismatch KL (k3 estimator), the importance
  ratio pi_trainer / pi_engine's mean, p1 and p99, and the share of tokens
  outside [0.9, 1.1];
- log S, the log of the probability mass the truncation kept, as the engine
  reports it (`return_sampling_mask_logprobs`): mean and p1 over the arm's
  tokens. Without the mask the trainer's log-ratio is biased by about log S.

With the mask the ratio should sit at 1 up to numerics; without it, it is
biased below 1 by the probability mass the sampler cut away. Writes
`replay_check.json` and `replay_check.png` (log-ratio histograms masked vs
unmasked, support sizes) into `--out`.

The engine's logprobs are its processed logprobs (normalised over the
support), which the mask needs anyway. The trainer side runs the same weights
in float32, so any difference left with the mask is numerics (and, against a
server, the server's dtype).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from vllm_sampling_mask import DEMO_MODEL, SamplingMask
from vllm_sampling_mask.tools.demo import DEMO_PROMPTS
from vllm_sampling_mask.errors import ReplayCheckError

BAND = (0.9, 1.1)

DEFAULT_ARMS = [
    "temperature=1.0,top_k=50",
    "temperature=1.0,top_p=0.9",
    "temperature=0.7,top_k=20,top_p=0.95",
    "temperature=1.0,min_p=0.05",
]


@dataclasses.dataclass(frozen=True)
class Arm:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def label(self) -> str:
        parts = [f"T={self.temperature:g}"]
        if self.top_k > 0:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min_p={self.min_p:g}")
        return " ".join(parts)

    def sampling(self) -> dict:
        return dataclasses.asdict(self)


def parse_arm(text: str) -> Arm:
    """`temperature=1.0,top_k=50` -> Arm; refuses what has no truncation to replay."""
    fields = {f.name: f.type for f in dataclasses.fields(Arm)}
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ReplayCheckError(
                f"--arm {text!r}: {item!r} is not one of "
                f"{', '.join(k + '=VALUE' for k in fields)}")
        try:
            values[key] = int(value) if key == "top_k" else float(value)
        except ValueError:
            raise ReplayCheckError(f"--arm {text!r}: {key} must be a number, not "
                                   f"{value!r}") from None
    arm = Arm(**values)
    if not arm.temperature > 0:
        raise ReplayCheckError(
            f"--arm {text!r}: temperature={arm.temperature:g} is greedy sampling, which "
            "has no distribution to replay: use a temperature > 0.")
    if arm.top_k < 0 or not 0 < arm.top_p <= 1 or not 0 <= arm.min_p < 1:
        raise ReplayCheckError(
            f"--arm {text!r}: needs top_k >= 0 (0 = off), 0 < top_p <= 1, 0 <= min_p < 1.")
    if arm.top_k == 0 and arm.top_p == 1 and arm.min_p == 0:
        raise ReplayCheckError(
            f"--arm {text!r}: samples from the full vocabulary, where the mask changes "
            "nothing: give it a top_k, top_p < 1 or min_p > 0.")
    return arm


@dataclasses.dataclass
class Rollout:
    """One generated sequence: what the engine returned for it."""
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]          # the engine's processed logprob of each token
    mask: SamplingMask             # one support per token


def load_prompts(path: str | None) -> list[str]:
    if path is None:
        return list(DEMO_PROMPTS)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ReplayCheckError(f"--prompts {path!r}: cannot read it ({e.strerror})") from None
    if path.endswith(".jsonl"):
        prompts = [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ReplayCheckError(f"--prompts {path!r}: holds no prompt (one per line, or "
                               "JSON lines with a \"prompt\" field for a .jsonl file)")
    return prompts


def check_model(model: str) -> None:
    """Fail before anything starts when transformers cannot find the model."""
    from transformers import AutoConfig
    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise ReplayCheckError(
            f"--model {model!r}: transformers cannot load it ({str(e).splitlines()[0]}). "
            "Give a local model directory or a Hugging Face id this machine can reach.") \
            from None


# -- rollouts ----------------------------------------------------------------------

def rollout_in_process(model: str, arms, prompt_ids, samples: int, max_tokens: int,
                       seed: int, engine_kwargs: dict, engine_dtype: list
                       ) -> list[list[Rollout]]:
    """The rollouts per arm; `engine_dtype[0]` is set to the engine's dtype."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, return_sampling_mask=True, logprobs_mode="processed_logprobs",
              seed=seed, **engine_kwargs)
    engine_dtype[0] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    results = []
    for a, arm in enumerate(arms):
        params = [SamplingParams(n=samples, max_tokens=max_tokens, logprobs=0,
                                 seed=seed + 1000 * a + i, **arm.sampling(),
                                 extra_args={"return_sampling_mask": True,
                                             "return_sampling_mask_logprobs": True})
                  for i in range(len(prompt_ids))]
        print(f"arm {a + 1}/{len(arms)}: {arm.label}", file=sys.stderr, flush=True)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params,
                            use_tqdm=True)
        arm_rollouts = []
        for out in outs:
            for c in out.outputs:
                if c.sampling_mask is None:
                    raise ReplayCheckError(f"arm {arm.label}: a request ended without a "
                                           f"mask: {c.sampling_mask_error}")
                arm_rollouts.append(Rollout(
                    list(out.prompt_token_ids), list(c.token_ids),
                    [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                    c.sampling_mask))
        results.append(arm_rollouts)
    return results


def _call(method: str, url: str, **kwargs):
    """One HTTP call to the server, or the error a user can act on."""
    import requests
    try:
        r = requests.request(method, url, timeout=600, **kwargs)
    except (requests.exceptions.InvalidSchema, requests.exceptions.MissingSchema,
            requests.exceptions.InvalidURL) as e:
        raise ReplayCheckError(
            f"--server: {url} is not an http(s) URL ({type(e).__name__}): give one "
            "like http://localhost:8000") from None
    except requests.ConnectionError:
        raise ReplayCheckError(
            f"--server: nothing answers at {url}. Start one with `vllm serve MODEL "
            "--return-sampling-mask --logprobs-mode processed_logprobs`, or drop "
            "--server to run in-process.") from None
    if r.status_code != 200:
        raise ReplayCheckError(f"--server: {url} answered {r.status_code}: {r.text[:500]}")
    return r.json()


def server_model(server: str) -> tuple[str, str | None]:
    """(the served model's path or id, its dtype: the `dtype` field this package
    adds to `/v1/models`, None from a server without it)."""
    (entry, *_) = _call("GET", server.rstrip("/") + "/v1/models")["data"]
    return entry.get("root") or entry["id"], entry.get("dtype")


# What the masked ratio looks like when the engine runs in float32, as the trainer
# side does (docs/replay_check.md, the demo model's table): the spread is numerics.
FLOAT32_MASKED = {"ratio_p1": 1.0, "ratio_p99": 1.0, "out_of_band": 0.0,
                  "mismatch_kl_below": 1e-9}


def dtype_note(engine_dtype: str | None, source: str) -> str | None:
    """The sentence that explains a masked ratio's spread by the engine's dtype,
    or None when the engine runs in float32."""
    if engine_dtype == "float32":
        return None
    fix = ("`--dtype float32` on `vllm serve`" if source != "in-process"
           else "`--dtype float32`")
    expect = ("expect masked p1 = p99 = 1.000, 0% out of band and a mismatch KL below "
              "1e-9")
    if engine_dtype is None:
        return ("the server does not say its dtype (no `dtype` in its /v1/models: a "
                "server without vllm_sampling_mask's patches): if it is not float32, the "
                "masked ratio's spread comes from that dtype, not from the mask; with a "
                f"float32 server {expect}.")
    return (f"the engine runs in {engine_dtype}, the trainer side in float32: the masked "
            "ratio's spread (p1/p99 away from 1, tokens out of band) comes from that "
            f"dtype, not from the mask. With a float32 engine ({fix}) {expect}.")


def rollout_server(server: str, model: str, arms, prompt_ids, samples: int,
                   max_tokens: int, seed: int, concurrency: int = 8
                   ) -> list[list[Rollout]]:
    from tqdm import tqdm
    url = server.rstrip("/") + "/inference/v1/generate"

    def one(a, arm, i, ids):
        body = {"model": model, "token_ids": ids, "return_sampling_mask": True,
                "return_sampling_mask_logprobs": True,
                "sampling_params": {**arm.sampling(), "n": samples, "logprobs": 0,
                                    "max_tokens": max_tokens, "seed": seed + 1000 * a + i}}
        rollouts = []
        for choice in sorted(_call("POST", url, json=body)["choices"], key=lambda c: c["index"]):
            try:
                mask = SamplingMask.from_response(choice)
            except ValueError as e:
                raise ReplayCheckError(f"--server: {server}: {e} (is it started with "
                                       "--return-sampling-mask?)") from None
            rollouts.append(Rollout(
                list(ids), choice["token_ids"],
                [entry["logprob"] for entry in choice["logprobs"]["content"]], mask))
        return rollouts

    results = []
    with ThreadPoolExecutor(concurrency) as pool:
        for a, arm in enumerate(arms):
            futures = [pool.submit(one, a, arm, i, ids) for i, ids in enumerate(prompt_ids)]
            arm_rollouts = []
            for f in tqdm(futures, desc=f"arm {a + 1}/{len(arms)} {arm.label}",
                          unit="prompt"):
                arm_rollouts.extend(f.result())
            results.append(arm_rollouts)
    return results


# -- the trainer's side ------------------------------------------------------------

def trainer_logprobs(hf_model, rollouts: list[Rollout], temperature: float, desc: str):
    """(masked, unmasked) float32 logprobs of every token: the trainer's side."""
    import torch
    from tqdm import tqdm

    from vllm_sampling_mask.training import full_logprobs, nucleus_logprobs, pack_masks

    masked, unmasked = [], []
    for r in tqdm(rollouts, desc=desc, unit="seq"):
        if not r.token_ids:
            continue
        seq = torch.tensor([r.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = hf_model(input_ids=seq).logits[0].float()
        p = len(r.prompt_ids)
        logits = logits[p - 1: p - 1 + len(r.token_ids)]
        tokens = torch.tensor(r.token_ids)
        masked.append(nucleus_logprobs(logits, tokens, pack_masks([r.mask]), temperature))
        unmasked.append(full_logprobs(logits, tokens, temperature))
    return torch.cat(masked), torch.cat(unmasked)


def log_kept_report(rollouts: list[Rollout]) -> dict | None:
    """log S per token as the engine reported it (`SamplingMask.log_kept`: the log of
    the probability mass the truncation kept): mean and p1 over the arm's tokens;
    None when the engine sent none."""
    import numpy as np

    kept = [r.mask.log_kept for r in rollouts if r.mask.log_kept is not None]
    if not kept:
        return None
    values = np.concatenate(kept).astype(np.float64)
    if len(values) == 0:
        return None
    return {"mean": float(values.mean()), "p1": float(np.percentile(values, 1))}


def arm_report(arm: Arm, rollouts: list[Rollout], masked, unmasked) -> dict:
    import torch

    from vllm_sampling_mask.training import ratio_statistics

    old = torch.tensor([lp for r in rollouts for lp in r.logprobs], dtype=torch.float64)
    sizes = torch.cat([torch.from_numpy(r.mask.sizes) for r in rollouts])
    with_mask = ratio_statistics(masked.double(), old, support_sizes=sizes, band=BAND)
    without = ratio_statistics(unmasked.double(), old, band=BAND)
    support_keys = ("support_mean", "support_median", "support_p99", "singleton_share")
    support = {k: with_mask.pop(k) for k in support_keys}
    tokens = with_mask.pop("tokens")
    without.pop("tokens")
    return {"arm": arm.sampling(), "label": arm.label, "tokens": tokens,
            "sequences": len(rollouts), "support": support,
            "log_kept": log_kept_report(rollouts),
            "masked": with_mask, "unmasked": without,
            "_log_ratio": {"masked": (masked.double() - old).tolist(),
                           "unmasked": (unmasked.double() - old).tolist()},
            "_sizes": sizes.tolist()}


# -- output ------------------------------------------------------------------------

def plot(reports: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(len(reports), 2, figsize=(11, 2.8 * len(reports) + 0.6),
                             squeeze=False)
    for (left, right), rep in zip(axes, reports):
        masked = np.asarray(rep["_log_ratio"]["masked"])
        unmasked = np.asarray(rep["_log_ratio"]["unmasked"])
        lo = min(masked.min(), unmasked.min(), math.log(BAND[0]) * 1.5)
        hi = max(masked.max(), unmasked.max(), math.log(BAND[1]) * 1.5)
        bins = np.linspace(lo, hi, 81)
        left.hist(unmasked, bins=bins, alpha=0.6, color="tab:red",
                  label=f"without mask (mean ratio {rep['unmasked']['ratio_mean']:.4f})")
        left.hist(masked, bins=bins, alpha=0.6, color="tab:blue",
                  label=f"with mask (mean ratio {rep['masked']['ratio_mean']:.4f})")
        for edge in BAND:
            left.axvline(math.log(edge), color="grey", ls="--", lw=0.8)
        left.set_yscale("log")
        left.set_xlabel("log(pi_trainer / pi_engine) per token")
        left.set_ylabel("tokens")
        left.set_title(rep["label"], fontsize=10)
        left.legend(fontsize=8, loc="upper left")
        sizes = np.asarray(rep["_sizes"])
        step = max(1, math.ceil(sizes.max() / 60))
        right.hist(sizes, bins=np.arange(0.5, sizes.max() + step + 0.5, step),
                   color="tab:green")
        right.set_xlabel("support size (ids)")
        right.set_ylabel("tokens")
        right.set_title(f"support: median {rep['support']['support_median']:g}, "
                        f"singletons {rep['support']['singleton_share']:.1%}", fontsize=10)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(reports: list[dict]) -> str:
    head = (f"{'arm':<30} {'tokens':>6} {'supp med':>8} {'p99':>6} {'single':>7} | "
            f"{'KL k3':>9} {'ratio':>7} {'p1':>6} {'p99':>6} {'out':>6} | "
            f"{'KL k3':>9} {'ratio':>7} {'p1':>6} {'p99':>6} {'out':>6} | "
            f"{'log S':>7} {'p1':>7}")
    lines = [f"{'':<62}| {'with the mask':^40} | {'without the mask':^40} | "
             f"{'kept mass':^15}", head,
             "-" * len(head)]
    for rep in reports:
        s = rep["support"]
        row = (f"{rep['label']:<30} {rep['tokens']:>6} {s['support_median']:>8g} "
               f"{s['support_p99']:>6.0f} {s['singleton_share']:>7.1%} |")
        for side in ("masked", "unmasked"):
            m = rep[side]
            row += (f" {m['mismatch_kl']:>9.2e} {m['ratio_mean']:>7.4f} {m['ratio_p1']:>6.3f}"
                    f" {m['ratio_p99']:>6.3f} {m['out_of_band']:>6.1%} |")
        kept = rep.get("log_kept")
        row += (f" {kept['mean']:>7.4f} {kept['p1']:>7.4f}" if kept
                else f" {'-':>7} {'-':>7}")
        lines.append(row.rstrip(" |"))
    return "\n".join(lines)


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 1G, 512M or "
                                         "1073741824") from None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m vllm_sampling_mask.tools.replay_check",
        description="Importance ratios pi_trainer / pi_engine with and without the "
                    "sampling mask, per sampling arm.")
    ap.add_argument("--model", default=None,
                    help="model path or id (default: the demo model; with --server, the "
                         "server's model)")
    ap.add_argument("--server", default=None,
                    help="base URL of a running `vllm serve --return-sampling-mask` "
                         "(default: run the engine in-process)")
    ap.add_argument("--arm", action="append", default=None, metavar="SPEC",
                    help="a sampling arm, e.g. temperature=1.0,top_k=50 (repeatable; "
                         f"default: {' / '.join(DEFAULT_ARMS)})")
    ap.add_argument("--prompts", default=None,
                    help="a file of prompts, one per line (or .jsonl with \"prompt\"); "
                         "default: 8 built-in Python prompts")
    ap.add_argument("--samples", type=int, default=4,
                    help="samples per prompt (n) (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=32,
                    help="tokens per sample (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0,
                    help="base seed of the rollouts (default: %(default)s)")
    ap.add_argument("--dtype", default="float32",
                    help="the in-process engine's dtype; the trainer side is float32 "
                         "(default: %(default)s)")
    ap.add_argument("--kv-cache-memory-bytes", type=_size, default="1G",
                    help="the in-process engine's KV cache, bytes or with a K/M/G "
                         "(binary) suffix; a CPU host needs it sized (default: 1G)")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the in-process engine's context length (default: the "
                         "model's)")
    ap.add_argument("--out", default="replay_check",
                    help="directory for replay_check.json and replay_check.png, made if "
                         "missing (default: ./replay_check, under the current "
                         "directory; the path is printed at start)")
    args = ap.parse_args(argv)
    if args.samples < 1 or args.max_tokens < 1:
        ap.error("--samples and --max-tokens must be at least 1")
    if args.server:
        args.server = server_url(args.server)
    return args


def server_url(text: str) -> str:
    """`--server` as an http(s) base URL: `localhost:8000` (no scheme) means
    `http://localhost:8000`; another scheme is an error naming the fix."""
    text = text.strip().rstrip("/")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return "http://" + text
    if scheme.lower() not in ("http", "https") or not rest:
        raise ReplayCheckError(f"--server {text!r}: give an http(s) URL such as "
                               "http://localhost:8000 (or host:port, read as http)")
    return text


def vllm_release(server: str | None) -> str | None:
    """The vLLM release the engine ran: the server's `GET /version`, or the one
    installed here for the in-process engine (None if the server does not say)."""
    if server is None:
        import vllm
        return vllm.__version__
    try:
        return _call("GET", server + "/version").get("version")
    except ReplayCheckError:
        return None


def run(args: argparse.Namespace) -> dict:
    started = time.time()
    arms = [parse_arm(a) for a in (args.arm or DEFAULT_ARMS)]
    prompts = load_prompts(args.prompts)
    if args.server:
        served, engine_dtype = server_model(args.server)
        model = args.model or served
    else:
        model = args.model or DEMO_MODEL
    check_model(model)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] or
                  [tokenizer.bos_token_id or 0] for p in prompts]
    print(f"replay_check: writing to {os.path.abspath(args.out)}", file=sys.stderr,
          flush=True)
    print(f"replay_check: {model}, {len(arms)} arms x {len(prompts)} prompts x "
          f"{args.samples} samples x {args.max_tokens} tokens, "
          f"{'server ' + args.server if args.server else 'in-process engine'}",
          file=sys.stderr, flush=True)
    if args.server:
        rollouts = rollout_server(args.server, served, arms, prompt_ids, args.samples,
                                  args.max_tokens, args.seed)
        source = args.server
    else:
        engine_kwargs = dict(dtype=args.dtype, enforce_eager=True,
                             kv_cache_memory_bytes=args.kv_cache_memory_bytes)
        if args.max_model_len:
            engine_kwargs["max_model_len"] = args.max_model_len
        found = [None]
        rollouts = rollout_in_process(model, arms, prompt_ids, args.samples,
                                      args.max_tokens, args.seed, engine_kwargs, found)
        engine_dtype = found[0]
        source = "in-process"
    note = dtype_note(engine_dtype, source)
    if note:
        print(f"replay_check: note: {note}", file=sys.stderr, flush=True)

    hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    reports = []
    for a, (arm, arm_rollouts) in enumerate(zip(arms, rollouts)):
        masked, unmasked = trainer_logprobs(
            hf_model, arm_rollouts, arm.temperature,
            desc=f"trainer {a + 1}/{len(arms)} {arm.label}")
        reports.append(arm_report(arm, arm_rollouts, masked, unmasked))

    os.makedirs(args.out, exist_ok=True)
    png = os.path.join(args.out, "replay_check.png")
    plot(reports, png, f"{os.path.basename(model.rstrip('/'))}: importance ratio "
                       "pi_trainer / pi_engine, float32 trainer")
    report = {
        "model": model, "source": source, "vllm": vllm_release(args.server),
        "engine_dtype": engine_dtype, "trainer_dtype": "float32",
        "dtype_note": note,
        "float32_expected": None if note is None else {"masked": FLOAT32_MASKED}, "prompts": len(prompts), "samples": args.samples,
        "max_tokens": args.max_tokens, "seed": args.seed, "band": list(BAND),
        "arms": [{k: v for k, v in rep.items() if not k.startswith("_")}
                 for rep in reports],
        "png": png, "wall_seconds": round(time.time() - started, 1),
    }
    path = os.path.join(args.out, "replay_check.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(table(reports))
    if note:
        print(f"\nnote: {note}")
    print(f"\nwrote {path} and {png} ({report['wall_seconds']} s)")
    return report


def main(argv=None) -> int:
    try:
        run(parse_args(argv))
    except ReplayCheckError as e:
        print(f"replay_check: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
