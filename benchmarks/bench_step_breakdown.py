"""Where the sampling mask's time goes, per engine step, on the V1 runner (mask off vs on).

Each arm (mask off, mask on; both `--logprobs-mode processed_logprobs`) runs in its own
process with the engine in that process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: scheduler,
worker and output processor in one interpreter), on the same seeded workload as
`bench_v1_engine.py` (top_k 50, top_p 0.95). Per engine step it reports:

- end to end: the `LLM.generate` time divided by the steps the scheduler ran (the best of
  `--repeats`), off and on, and the difference: what the mask adds in one process;
- the overlay's own code, by module (one `generate` under cProfile): each overlay
  function's own time plus the time of the non-vLLM calls it makes itself (torch,
  numpy, msgspec, builtins; not a decorator's or context manager's trampoline), so
  upstream code a wrapper calls is not counted; the
  profiler's overhead inflates these, so read them as shares, not as the difference;
- the process hop the mask crosses when the engine core runs in its own process (the
  default): the step's `EngineCoreOutputs`, captured from the scheduler, encoded with
  vLLM's `MsgpackEncoder` and decoded with the type the client decodes (the overlay's
  `MaskedEngineCoreOutputs` with the mask on), bytes and time per step. (On one worker
  the worker runs inside the engine-core process: no hop between them.)

    python benchmarks/bench_step_breakdown.py
    python benchmarks/bench_step_breakdown.py --model vocab151936 --batch 64
    python benchmarks/bench_step_breakdown.py --functions 15    # and the costliest functions
    python benchmarks/bench_step_breakdown.py --support-logprobs --functions 15

`--support-logprobs` compares mask only (the first arm) with every request asking for
support logprobs (`return_sampling_mask_logprobs`, the second arm) instead.

The response side (the API server's JSON or packed encoding of masks) is measured by
`bench_wire.py`.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_v1_engine import model_path, run_worker  # noqa: E402

OVERLAY = os.sep + "vllm_sampling_mask" + os.sep
UPSTREAM = os.sep + "vllm" + os.sep
# calls that only pass control on (a decorator's or a context manager's trampoline):
# their time is the callee's, upstream's or the overlay's own, counted there
TRAMPOLINES = ("contextlib.py", "functools.py", os.sep + "wrapt" + os.sep)


def _group(filename: str) -> str:
    """'vllm_sampling_mask/patches/engine/feature/scheduler.py' -> 'patches.engine.feature.scheduler'."""
    rel = filename.split(OVERLAY, 1)[1]
    return rel[:-3].replace(os.sep, ".")


def overlay_time(stats: pstats.Stats, by_function: bool = False) -> dict[str, float]:
    """Seconds per overlay module (or per overlay function, "module:function"): its
    functions' own time plus the cumulative time of the non-vLLM, non-overlay
    functions they call directly."""
    def key_of(func) -> str:
        return f"{_group(func[0])}:{func[2]}" if by_function else _group(func[0])

    groups: dict[str, float] = {}
    for func, (_, _, tt, _, callers) in stats.stats.items():
        filename = func[0]
        if OVERLAY in filename:
            key = key_of(func)
            groups[key] = groups.get(key, 0.0) + tt
            continue
        if UPSTREAM in filename or any(t in filename for t in TRAMPOLINES):
            continue   # upstream's own work (a wrapper's wrapped call included)
        for caller, (_, _, _, ct) in callers.items():
            if OVERLAY in caller[0]:
                key = key_of(caller)
                groups[key] = groups.get(key, 0.0) + ct
    return groups


def wire_cost(captured: list, loops: int = 20) -> dict[str, float]:
    """Bytes and encode/decode seconds per step of the captured EngineCoreOutputs, with
    the encoder the engine core uses and the type the client decodes."""
    import vllm.v1.engine.core_client as core_client
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    encoder = MsgpackEncoder()
    decoder = MsgpackDecoder(core_client.EngineCoreOutputs)
    frames = [encoder.encode(outputs) for outputs in captured]
    size = sum(sum(len(memoryview(b)) for b in f) for f in frames) / len(frames)
    t0 = time.perf_counter()
    for _ in range(loops):
        for outputs in captured:
            encoder.encode(outputs)
    enc = (time.perf_counter() - t0) / (loops * len(captured))
    t0 = time.perf_counter()
    for _ in range(loops):
        for f in frames:
            decoder.decode(f)
    dec = (time.perf_counter() - t0) / (loops * len(frames))
    return {"bytes": size, "encode_s": enc, "decode_s": dec}


def worker(model: str, arm: int, batch: int, max_tokens: int, repeats: int) -> None:
    """`arm`: 0 mask off, 1 mask on, 2 mask on with support logprobs."""
    mask_on = arm > 0
    from vllm import LLM, SamplingParams

    kwargs = dict(model=model, dtype="float32", max_model_len=512, enforce_eager=True,
                  seed=0, logprobs_mode="processed_logprobs", kv_cache_memory_bytes=2 << 30,
                  max_num_seqs=batch, skip_tokenizer_init=True)
    if mask_on:
        kwargs["return_sampling_mask"] = True
    llm = LLM(**kwargs)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    steps, captured = [0], []
    original = scheduler.update_from_output

    def update_from_output(*args, **kw):
        result = original(*args, **kw)
        steps[0] += 1
        if len(captured) < 64:
            captured.extend(o for o in result.values() if o.outputs)
        return result

    scheduler.update_from_output = update_from_output
    prompts = [{"prompt_token_ids": [(7 * i + j) % 4000 + 10 for j in range(16)]}
               for i in range(batch)]
    extra = {"return_sampling_mask_logprobs": True} if arm == 2 else None
    params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=max_tokens,
                             ignore_eos=True, seed=i, detokenize=False, extra_args=extra)
              for i in range(batch)]
    llm.generate(prompts, params, use_tqdm=False)     # warm-up
    per_step = []
    for _ in range(repeats):
        before, t0 = steps[0], time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        per_step.append((time.perf_counter() - t0) / (steps[0] - before))
    assert (outs[0].outputs[0].sampling_mask is not None) == mask_on
    assert (mask_on and outs[0].outputs[0].sampling_mask.logprobs is not None) == (arm == 2)
    profiler = cProfile.Profile()
    before = steps[0]
    profiler.enable()
    llm.generate(prompts, params, use_tqdm=False)
    profiler.disable()
    profiled_steps = steps[0] - before
    stats = pstats.Stats(profiler)
    groups, functions = overlay_time(stats), overlay_time(stats, by_function=True)
    result = {"step_s": min(per_step), "steps": profiled_steps,
              "overlay_s": {k: v / profiled_steps for k, v in groups.items()},
              "functions_s": {k: v / profiled_steps for k, v in functions.items()},
              "wire": wire_cost(captured)}
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", choices=["demo", "vocab151936"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--functions", type=int, default=0, metavar="N",
                    help="also list the N overlay functions that cost the most per step "
                         "with the mask on")
    ap.add_argument("--support-logprobs", action="store_true",
                    help="compare mask only with mask and support logprobs")
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.batch, args.max_tokens,
               args.repeats)
        return
    path = model_path(args.model)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    arms, labels = ((1, 2), ("mask", "+logp")) if args.support_logprobs else ((0, 1),
                                                                           ("off", "on"))
    off, on = (run_worker([sys.executable, __file__, "--worker", path, str(arm), "--batch",
                           str(args.batch), "--max-tokens", str(args.max_tokens),
                           "--repeats", str(args.repeats)], env) for arm in arms)
    us = 1e6
    print(f"V1 runner, engine in one process; {args.model}, batch {args.batch}, "
          f"{args.max_tokens} tokens, top_k 50, top_p 0.95; per engine step:")
    print(f"{'':44} {labels[0]:>9} {labels[1]:>9} {'diff':>9}")
    print(f"{'end to end (best of repeats), us':44} {off['step_s'] * us:9.0f} "
          f"{on['step_s'] * us:9.0f} {(on['step_s'] - off['step_s']) * us:9.0f}")
    for key, name in (("bytes", "engine core -> client hop, bytes"),
                      ("encode_s", "  encode (engine core), us"),
                      ("decode_s", "  decode (client), us")):
        scale = 1 if key == "bytes" else us
        a, b = off["wire"][key] * scale, on["wire"][key] * scale
        print(f"{name:44} {a:9.0f} {b:9.0f} {b - a:9.0f}")
    print("overlay code under cProfile (own time + direct non-vLLM calls), us:")
    keys = sorted(set(off["overlay_s"]) | set(on["overlay_s"]),
                  key=lambda k: -on["overlay_s"].get(k, 0.0))
    for key in keys:
        a, b = off["overlay_s"].get(key, 0.0) * us, on["overlay_s"].get(key, 0.0) * us
        if max(a, b) >= 1:
            print(f"  {key:42} {a:9.0f} {b:9.0f} {b - a:9.0f}")
    total_a = sum(off["overlay_s"].values()) * us
    total_b = sum(on["overlay_s"].values()) * us
    print(f"  {'all overlay code':42} {total_a:9.0f} {total_b:9.0f} {total_b - total_a:9.0f}")
    if args.functions:
        print(f"the {args.functions} costliest overlay functions ({labels[1]}), us per step:")
        ranked = sorted(on["functions_s"].items(), key=lambda kv: -kv[1])
        for key, seconds in ranked[: args.functions]:
            print(f"  {key:62} {seconds * us:9.0f}")


if __name__ == "__main__":
    main()
