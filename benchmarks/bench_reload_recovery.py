"""What making a weight reload recoverable costs (`reload_weights_recovery`).

    python benchmarks/bench_reload_recovery.py [--model DIR] [--rounds 5]

Starts an `LLM` of the model (default: the demo model; V1 runner, float32) and runs,
in its worker (`collective_rpc` with a function, hence
VLLM_ALLOW_INSECURE_SERIALIZATION=1 here): the checks alone on a good checkpoint (a
perturbed copy of the model), the snapshot and its restore alone, and whole reloads
from that checkpoint with the overlay's wrapper and without it (upstream's reload and
`cpu_reload_tied_lm_head` only), `--rounds` each, each arm first in half the rounds. Prints the median
times, the snapshot's host bytes beside the model's parameter bytes and the
checkpoint's, and the worker's resident memory before and after (its peak is the
kernel's high-water mark, `VmHWM`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile


def in_worker(worker, path: str, rounds: int) -> dict:
    import time

    from vllm_sampling_mask.patches.worker.fixes.reload_weights_recovery import Snapshot, check

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    worker = getattr(worker, "worker", worker)    # the wrapper's worker
    model = worker.model_runner.get_model()
    config = worker.vllm_config.model_config
    out = {"rss_before": status("VmRSS"), "hwm_before": status("VmHWM")}
    out["param_bytes"] = sum(t.numel() * t.element_size() for t in model.parameters())
    times = {"checks": [], "snapshot": [], "restore": [], "reload (overlay)": [],
             "reload (upstream)": []}
    unwrapped = type(worker).reload_weights.__wrapped__
    for i in range(rounds):
        t = time.perf_counter()
        check(worker, path)
        times["checks"].append(time.perf_counter() - t)
        t = time.perf_counter()
        saved = Snapshot(model, config)
        times["snapshot"].append(time.perf_counter() - t)
        out["snapshot_bytes"] = saved.nbytes
        t = time.perf_counter()
        saved.restore()
        times["restore"].append(time.perf_counter() - t)
        del saved
        arms = [("reload (overlay)", worker.reload_weights),
                ("reload (upstream)", lambda **kw: unwrapped(worker, **kw))]
        for name, call in arms if i % 2 == 0 else arms[::-1]:   # each goes first half the time
            t = time.perf_counter()
            call(weights_path=path)
            times[name].append(time.perf_counter() - t)
    out["times"] = times
    out["rss_after"], out["hwm_after"] = status("VmRSS"), status("VmHWM")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from vllm_sampling_mask import DEMO_MODEL
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    os.environ.pop("TRITON_INTERPRET", None)

    from vllm import LLM

    from vllm_sampling_mask.tools.demo import perturbed_draft
    with tempfile.TemporaryDirectory() as tmp:
        path = perturbed_draft(os.path.join(tmp, "new"), noise=0.3) \
            if args.model == DEMO_MODEL else args.model
        llm = LLM(model=args.model, dtype="float32", max_model_len=512, enforce_eager=True,
                  kv_cache_memory_bytes=1 << 30, return_sampling_mask=True,
                  logprobs_mode="processed_logprobs")
        result, = llm.collective_rpc(in_worker, args=(path, args.rounds))
        checkpoint = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                         if f.endswith(".safetensors"))
    mib = 1 << 20
    print(f"model {args.model}: checkpoint {checkpoint / mib:.2f} MiB, parameters as "
          f"served {result['param_bytes'] / mib:.2f} MiB, snapshot "
          f"{result['snapshot_bytes'] / mib:.2f} MiB (host)")
    for name, values in result["times"].items():
        print(f"  {name:18s} median {statistics.median(values) * 1e3:8.2f} ms "
              f"(min {min(values) * 1e3:.2f}, max {max(values) * 1e3:.2f}, n={len(values)})")
    print(f"  worker RSS {result['rss_before'] / mib:.1f} -> {result['rss_after'] / mib:.1f}"
          f" MiB, peak {result['hwm_before'] / mib:.1f} -> {result['hwm_after'] / mib:.1f} MiB")
    print(json.dumps({k: v for k, v in result.items() if k != "times"}))


if __name__ == "__main__":
    main()
