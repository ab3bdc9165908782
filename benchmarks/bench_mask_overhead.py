"""Cost of the sampling mask, measured side by side in one run.

Two parts, each reporting a ratio (machines are noisy; absolute times are not
the point):

1. engine: the same seeded workload through `LLM.generate` on Model Runner V2,
   with `return_sampling_mask` off and on, each engine in its own process, one
   after the other in the same run; prints output tokens/s (median of the
   repeats) and the on/off throughput ratio.
2. sampler: the device-side work the mask adds to one sampler step
   (`extract_support` on the processed logits) against the step's own top-k/top-p
   and sampling, at a real vocabulary size.

    python benchmarks/bench_mask_overhead.py                 # both parts
    python benchmarks/bench_mask_overhead.py --part sampler --vocab 151936 --rows 64
    python benchmarks/bench_mask_overhead.py --part engine --prompts 16 --max-tokens 32

On a CPU host the engine runs MRv2 through Triton's interpreter (TRITON_INTERPRET=1),
which dominates its step time: the engine ratio there bounds the mask's cost from
above only loosely; the sampler part isolates it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def engine_worker(mask_on: bool, prompts: int, max_tokens: int, repeats: int) -> None:
    from vllm import LLM, SamplingParams

    from vllm_sampling_mask import DEMO_MODEL
    kwargs = dict(model=DEMO_MODEL, dtype="float32", max_model_len=512,
                  enforce_eager=True, seed=0, logprobs_mode="processed_logprobs")
    if mask_on:
        kwargs["return_sampling_mask"] = True
    llm = LLM(**kwargs)
    texts = [f"def function_{i}(self, value):\n    " for i in range(prompts)]
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=max_tokens,
                             ignore_eos=True, seed=i, logprobs=0) for i in range(prompts)]
    llm.generate(texts[:2], params[:2], use_tqdm=False)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = llm.generate(texts, params, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    has_mask = outs[0].outputs[0].sampling_mask is not None
    print("RESULT " + json.dumps({"tokens": tokens, "times": times, "mask": has_mask}),
          flush=True)


def run_engine_part(args) -> None:
    env = dict(os.environ)
    env.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if not torch.cuda.is_available():
        env.setdefault("TRITON_INTERPRET", "1")
    results = {}
    for mask_on in (False, True):
        cmd = [sys.executable, __file__, "--engine-worker", str(int(mask_on)),
               "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens),
               "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        line = next(l for l in out.splitlines() if l.startswith("RESULT "))
        results[mask_on] = json.loads(line[len("RESULT "):])
        assert results[mask_on]["mask"] == mask_on
    tput = {k: v["tokens"] / statistics.median(v["times"]) for k, v in results.items()}
    print(f"engine: {args.prompts} prompts x {args.max_tokens} tokens, median of "
          f"{args.repeats} runs each")
    print(f"  mask off: {tput[False]:8.1f} tok/s")
    print(f"  mask on : {tput[True]:8.1f} tok/s")
    print(f"  throughput ratio on/off: {tput[True] / tput[False]:.3f}")


def bench(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_sampler_part(args) -> None:
    from vllm_sampling_mask.worker.extraction import extract_support, plan_layout

    device = torch.device(args.device)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(args.rows, args.vocab, generator=g, device=device) * 3
    k = torch.full((args.rows,), args.top_k, device=device)
    p = torch.full((args.rows,), 0.95, device=device)

    def sampler_step():
        # What the sampler does per step without the mask: sort-based top-k/top-p
        # over a fresh float32 copy, then an exponential-race draw.
        x = logits.clone()
        srt, idx = x.sort(dim=-1)
        kth = srt.gather(1, (args.vocab - k).long().view(-1, 1))
        srt.masked_fill_(srt < kth, float("-inf"))
        probs = srt.softmax(-1)
        cut = probs.cumsum(-1) <= 1 - p.view(-1, 1)
        cut[:, -1] = False
        srt.masked_fill_(cut, float("-inf"))
        x.scatter_(1, idx, srt)
        q = torch.empty_like(x).exponential_()
        out = (x.softmax(-1) / q).argmax(-1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return x, out

    processed, _ = sampler_step()
    layout = plan_layout([args.top_k] * args.rows, args.vocab)

    def mask_step():
        m = extract_support(processed, layout)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return m

    t_step = bench(sampler_step, args.repeats)
    t_mask = bench(mask_step, args.repeats)
    print(f"sampler: rows={args.rows} vocab={args.vocab} top_k={args.top_k} "
          f"device={device.type}, median of {args.repeats}")
    print(f"  sampler step (top-k/top-p + draw): {t_step * 1e3:8.2f} ms")
    print(f"  mask extraction:                   {t_mask * 1e3:8.2f} ms")
    print(f"  extraction / step time ratio:      {t_mask / t_step:.3f}")
    print(f"  host transfer per step: {layout.numel * 4} bytes "
          f"(vs {args.rows * args.vocab} bytes for a dense bool mask)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["engine", "sampler", "both"], default="both")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--engine-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine_worker is not None:
        engine_worker(bool(args.engine_worker), args.prompts, args.max_tokens, args.repeats)
        return
    if args.part in ("sampler", "both"):
        run_sampler_part(args)
    if args.part in ("engine", "both"):
        run_engine_part(args)


if __name__ == "__main__":
    main()
