"""Overhead of support logprobs (`return_sampling_mask_logprobs`) on the V1 runner.

One engine (demo model, float32, the mask on, V1 natively), one run: for each batch
size the same seeded requests are generated with the mask only and with the mask
plus support logprobs, alternating (mask, +logprobs, +logprobs, mask, ...) so that
drift on a shared machine hits both alike. Prints output tokens/s (best repeat) of
each variant and their ratio, and checks the second variant really carried the
values.

    python benchmarks/bench_support_logprobs.py
    python benchmarks/bench_support_logprobs.py --batches 8 32 --max-tokens 32 --repeats 4
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=50)
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"

    from vllm import LLM, SamplingParams

    from vllm_sampling_mask import DEMO_MODEL

    llm = LLM(model=DEMO_MODEL, dtype="float32", max_model_len=512, enforce_eager=True,
              seed=0, logprobs_mode="processed_logprobs", return_sampling_mask=True,
              max_num_seqs=max(args.batches), skip_tokenizer_init=True,
              kv_cache_memory_bytes=1 << 30)
    results = {}
    for batch in args.batches:
        prompts = [{"prompt_token_ids": [(7 * i + j) % 4000 + 10 for j in range(16)]}
                   for i in range(batch)]

        def params(ask: bool):
            return [SamplingParams(temperature=1.0, top_k=args.top_k, top_p=0.95,
                                   max_tokens=args.max_tokens, ignore_eos=True, seed=i,
                                   detokenize=False,
                                   extra_args={"return_sampling_mask_logprobs": ask})
                    for i in range(batch)]

        variants = {"mask": params(False), "mask+logprobs": params(True)}
        llm.generate(prompts[:2], variants["mask+logprobs"][:2], use_tqdm=False)  # warm-up
        times = {name: [] for name in variants}
        order = ["mask", "mask+logprobs", "mask+logprobs", "mask"]
        for r in range(args.repeats):
            for name in order if r % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                outs = llm.generate(prompts, variants[name], use_tqdm=False)
                times[name].append(time.perf_counter() - t0)
                m = outs[0].outputs[0].sampling_mask
                assert (m.logprobs is not None) == (name == "mask+logprobs")
        tokens = batch * args.max_tokens
        rate = {name: tokens / min(t) for name, t in times.items()}
        rate["ratio"] = rate["mask+logprobs"] / rate["mask"]
        results[batch] = rate
        print(f"batch {batch:3d}: mask {rate['mask']:8.1f} tok/s   mask+logprobs "
              f"{rate['mask+logprobs']:8.1f} tok/s   ratio {rate['ratio']:.3f}", flush=True)
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
