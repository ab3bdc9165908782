"""SkyRL's own sample-support capture against the engine's exact support.

Runs in SkyRL's environment (docs/rl_recipes.md, "SkyRL"). One engine of the demo
model per dtype (float32; bfloat16, where ties at the k-th logit are common), the mask
on. Every request asks for both at once, so they describe the same draw: vLLM's
`logprobs=top_k` flat processed logprobs, which SkyRL's `/skyrl/v1/generate` turns
into its support (SkyRL's own `_sample_support_from_flat_logprobs`, called here on
the engine's output, repair included), and `return_sampling_mask`, the exact support.
Same prompts, same seeds for every setting.

Counts, per setting: tokens; tokens whose SkyRL support differs from the exact one
(as sets, after its repair), all and those whose exact support fits top_k; tokens its
repair fired on (the sampled id absent from its finite top-k ids); tokens whose exact
support is wider than top_k (they cannot fit SkyRL's [tokens, top_k] layout;
`integrations.skyrl` answers 400 for them instead of cutting), and the widest exact
support. Bytes per token: the logprob payload SkyRL's capture asks the engine for (per
token top_k + 1 ids (int32) and logprobs (float32), one rank (int32): vLLM's logprob
arrays), the mask's engine-side arrays (its ids (int32) and one count (int32) per
token), and on the HTTP wire SkyRL's route's `rollout_sample_support` envelope plus
its `logprobs.content` (what the adapter also writes, at the same width), against the
mask as lists and packed (`sampling_mask_format: "packed"`).

    python benchmarks/bench_skyrl_support.py
    python benchmarks/bench_skyrl_support.py --dtypes float32 --seeds 4 --max-tokens 32
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os

SETTINGS = {
    "top_k8_top_p0.7": dict(top_k=8, top_p=0.7, temperature=1.0),
    "top_k8": dict(top_k=8, temperature=1.0),
    "top_k50_top_p0.95": dict(top_k=50, top_p=0.95, temperature=1.0),
    "top_k256_top_p0.95": dict(top_k=256, top_p=0.95, temperature=1.0),   # wide
    "top_k1024": dict(top_k=1024, temperature=1.2),                         # wide
}


def run(dtype: str, seeds: int, max_tokens: int) -> dict:
    import numpy as np
    import orjson
    from skyrl.backends.skyrl_train.inference_servers.generate_wire import \
        pack_sample_support
    from skyrl.backends.skyrl_train.inference_servers.vllm_server_actor import \
        _sample_support_from_flat_logprobs
    from vllm import LLM, SamplingParams

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.tools.demo import DEMO_PROMPTS
    from vllm_sampling_mask.integrations.skyrl import support_rows

    max_k = max(s["top_k"] for s in SETTINGS.values())
    llm = LLM(model=DEMO_MODEL, dtype=dtype, enforce_eager=True, seed=0,
              logprobs_mode="processed_logprobs", return_sampling_mask=True,
              max_logprobs=max_k, max_model_len=512, kv_cache_memory_bytes=1 << 30,
              enable_prefix_caching=False)
    logging.getLogger("skyrl").setLevel(logging.ERROR)   # its per-request repair warning
    results = {}
    for name, setting in SETTINGS.items():
        top_k = setting["top_k"]
        params = [SamplingParams(**setting, max_tokens=max_tokens, seed=seed,
                                 logprobs=top_k, flat_logprobs=True,
                                 extra_args={"return_sampling_mask": True})
                  for _ in DEMO_PROMPTS for seed in range(seeds)]
        prompts = [p for p in DEMO_PROMPTS for _ in range(seeds)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        c = dict(tokens=0, differs=0, differs_within_top_k=0, repaired=0, wider_than_top_k=0, exact_ids=0,
                 skyrl_wire=0, lists_wire=0, packed_wire=0, refused=0, widest=0)
        for out in outs:
            o = out.outputs[0]
            mask = o.sampling_mask
            T = len(o.token_ids)
            c["tokens"] += T
            c["exact_ids"] += len(mask.ids)
            c["widest"] = max(c["widest"], int(np.diff(mask.offsets).max(initial=0)))
            flat_ids = np.asarray(o.logprobs.token_ids).reshape(T, top_k + 1)
            flat_lp = np.asarray(o.logprobs.logprobs).reshape(T, top_k + 1)
            content, support = _sample_support_from_flat_logprobs(o.logprobs, top_k)
            for t in range(T):
                finite = set(flat_ids[t, 1:][np.isfinite(flat_lp[t, 1:])].tolist())
                exact = set(mask[t].tolist())
                mine = set(support[t][support[t] >= 0].tolist())
                c["repaired"] += o.token_ids[t] not in finite
                c["differs"] += mine != exact
                c["differs_within_top_k"] += mine != exact and len(exact) <= top_k
                c["wider_than_top_k"] += len(exact) > top_k
            body = {"logprobs": {"content": content},
                    "rollout_sample_support": pack_sample_support(support)}
            c["skyrl_wire"] += len(orjson.dumps(body))
            c["lists_wire"] += len(mask.to_lists_json())
            c["packed_wire"] += len(mask.to_packed_json())
            if int(np.diff(mask.offsets).max(initial=0)) <= top_k:
                # the adapter's body: the same content (the sampled token's
                # processed logprob), its rows from the exact support
                c["adapter_tokens"] = c.get("adapter_tokens", 0) + T
                c["adapter_wire"] = c.get("adapter_wire", 0) + len(orjson.dumps({
                    "logprobs": {"content": content},
                    "rollout_sample_support": pack_sample_support(
                        support_rows(mask.ids, mask.offsets, top_k))}))
            else:
                c["refused"] += 1   # a support wider than top_k: HTTP 400, not cut
        T = c["tokens"]
        results[name] = {
            "tokens": T, "differs": c["differs"],
            "differs_within_top_k": c["differs_within_top_k"], "repaired": c["repaired"],
            "wider_than_top_k": c["wider_than_top_k"],
            "completions": len(outs),
            "completions_refused_by_adapter": c["refused"],
            "mean_support": round(c["exact_ids"] / T, 2), "widest_support": c["widest"],
            "bytes_per_token": {
                "skyrl_engine_logprobs": 8 * (top_k + 1) + 4,
                "mask_engine_arrays": round(4 * c["exact_ids"] / T + 4, 1),
                "skyrl_route_wire": round(c["skyrl_wire"] / T, 1),
                # over the completions whose supports all fit top_k (the others
                # are answered 400)
                "adapter_route_wire": (round(c["adapter_wire"] / c["adapter_tokens"], 1)
                                       if "adapter_wire" in c else None),
                "mask_lists_wire": round(c["lists_wire"] / T, 1),
                "mask_packed_wire": round(c["packed_wire"] / T, 1),
            }}
        print(dtype, name, json.dumps(results[name]), flush=True)
    del llm
    gc.collect()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="write the results here as JSON")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    results = {d: run(d, args.seeds, args.max_tokens) for d in args.dtypes}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seeds": args.seeds, "max_tokens": args.max_tokens,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
