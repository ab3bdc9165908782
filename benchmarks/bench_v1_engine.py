"""Engine throughput on the V1 model runner, sampling mask on vs off, in one run.

Two models: the demo model (V = 4,096) and a random-weight Llama with Qwen's
vocabulary size (V = 151,936, made here in a temporary directory; prompts are
token ids, no tokenizer). For each batch size (8, 32, 64 prompts, one
`LLM.generate` call each) the same seeded workload runs on an engine with the
mask off and one with it on, each in its own process, in the order off, on, on,
off (so drift on a shared machine hits both alike); prints output tokens/s (the
best of each variant's repeats) and the on/off ratio.

    python benchmarks/bench_v1_engine.py
    python benchmarks/bench_v1_engine.py --models demo --batches 8 --max-tokens 16

Runs the V1 runner natively: TRITON_INTERPRET and VLLM_USE_V2_MODEL_RUNNER are
removed from the environment of the engine processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

QWEN_VOCAB = 151936


def make_random_model(path: str) -> str:
    """A 2-layer random-weight Llama with a 151,936-token vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=QWEN_VOCAB, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=512, tie_word_embeddings=True,
                         torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def model_path(name: str) -> str:
    """The benchmarks' models by name: "demo" (the demo model) or "vocab151936" (the
    random-weight V = 151,936 Llama, made on first use in the temporary directory)."""
    if name == "demo":
        from vllm_sampling_mask import DEMO_MODEL
        return DEMO_MODEL
    return make_random_model(os.path.join(tempfile.gettempdir(), "vsm-bench-vocab151936"))


def worker(model: str, mask_on: bool, batches: list[int], max_tokens: int,
           repeats: int) -> None:
    from vllm import LLM, SamplingParams
    kwargs = dict(model=model, dtype="float32", max_model_len=512, enforce_eager=True,
                  seed=0, logprobs_mode="processed_logprobs",
                  kv_cache_memory_bytes=2 << 30, max_num_seqs=max(batches),
                  skip_tokenizer_init=True)
    if mask_on:
        kwargs["return_sampling_mask"] = True
    llm = LLM(**kwargs)
    results = {}
    for batch in batches:
        prompts = [{"prompt_token_ids": [(7 * i + j) % 4000 + 10 for j in range(16)]}
                   for i in range(batch)]
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95,
                                 max_tokens=max_tokens, ignore_eos=True, seed=i,
                                 detokenize=False) for i in range(batch)]
        llm.generate(prompts[:2], params[:2], use_tqdm=False)   # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - t0)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        assert (outs[0].outputs[0].sampling_mask is not None) == mask_on
        results[batch] = tokens / min(times)
    print("RESULT " + json.dumps(results), flush=True)


def run_worker(cmd: list[str], env: dict[str, str]) -> dict:
    """Run one arm's worker process; its `RESULT {json}` line, parsed."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["demo", "vocab151936"])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1] == "1", args.batches, args.max_tokens,
               args.repeats)
        return
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    print(f"V1 runner, CPU; {args.max_tokens} tokens per prompt, top_k 50, top_p 0.95; "
          f"best of 2 x {args.repeats} runs per variant (engines in the order off, on, "
          "on, off)")
    print(f"{'model':>12} {'batch':>5} | {'off tok/s':>9} {'on tok/s':>9} {'on/off':>6}")
    for name in args.models:
        path = model_path(name)
        res = {False: {}, True: {}}
        for mask_on in (False, True, True, False):
            cmd = [sys.executable, __file__, "--worker", path, str(int(mask_on)),
                   "--batches", *map(str, args.batches), "--max-tokens",
                   str(args.max_tokens), "--repeats", str(args.repeats)]
            for batch, tput in run_worker(cmd, env).items():
                res[mask_on][batch] = max(tput, res[mask_on].get(batch, 0.0))
        for batch in args.batches:
            off, on = res[False][str(batch)], res[True][str(batch)]
            print(f"{name:>12} {batch:>5} | {off:>9.1f} {on:>9.1f} {on / off:>6.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
