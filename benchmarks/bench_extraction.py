"""Mask extraction + device-to-host copy, at real vocabulary sizes, in one run.

Shapes: R in {64, 256, 1024} rows, V = 151,936, and three kinds of processed
logits: top_k = 50, top_k = 1024, and top-p only (p = 0.95 over sharper logits,
no top-k: supports of one to two thousand ids, laid out at the full
--max-sampling-mask-size width of 4096).

On CUDA: times the Triton kernel plus the pinned asynchronous copy (CUDA
events, median of repeats) and prints the achieved bandwidth, (bytes of
logits read + bytes written + bytes copied) / time, against the device's
memory bandwidth (from its clock and bus width, or --peak-gbs).

On CPU: runs the same shapes through the torch path that CPU hosts use,
side by side with the previous implementation (isfinite, an fp32 masked copy,
a radix top-k and a sort, with the retained [R, V] bool mask for wide rows),
and prints time and peak extra memory of each (each variant in its own
subprocess; peak = VmHWM after the logits exist, reset through
/proc/self/clear_refs) and their ratios.

Needs torch (and Triton on CUDA); no vLLM.

    python benchmarks/bench_extraction.py                  # every shape
    python benchmarks/bench_extraction.py --rows 256 --kinds top_k=50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vllm_sampling_mask.extraction import extract_support, plan_layout  # noqa: E402
from vllm_sampling_mask.transport import MaskCopy, PinnedPool  # noqa: E402

KINDS = ("top_k=50", "top_k=1024", "top_p=0.95")


def processed_logits(rows: int, vocab: int, kind: str, device) -> tuple[torch.Tensor, list]:
    """Logits after a sampler's filtering (-inf outside the support), and the
    per-row top-k the sampler would report (vocab_size = no top-k)."""
    g = torch.Generator(device=device).manual_seed(0)
    name, value = kind.split("=")
    x = torch.randn(rows, vocab, generator=g, device=device) * (2 if name == "top_k" else 4)
    if name == "top_k":
        k = int(value)
        kth = x.topk(k, dim=-1).values[:, -1:]
        return x.masked_fill_(x < kth, float("-inf")), [k] * rows
    p = float(value)
    for r in range(rows):   # row by row: the benchmark's own memory stays small
        srt, idx = x[r].sort(descending=True)
        cum = srt.softmax(-1).cumsum(-1)
        drop = idx[(cum - srt.softmax(-1)) > p]
        x[r, drop] = float("-inf")
    return x, [vocab] * rows


# -- the previous implementation (kept here as the CPU baseline) --------------

def previous_extract_and_read(logits: torch.Tensor, top_k: list) -> list:
    rows, vocab = logits.shape
    width = max(1, min(vocab, max(top_k) + 16, 2048))
    finite = torch.isfinite(logits)
    counts = finite.sum(dim=-1, dtype=torch.int32)
    ranked = logits.masked_fill(~finite, float("-inf"))
    values, idx = torch.topk(ranked, width, dim=-1, sorted=False)
    idx = torch.where(torch.isfinite(values), idx, vocab).sort(dim=-1).values
    ids = torch.where(idx < vocab, idx, -1).to(torch.int32).numpy()
    counts = counts.numpy()
    over = np.nonzero(counts > width)[0]
    wide = {}
    if len(over):
        nz = torch.nonzero(finite[torch.as_tensor(over)]).numpy()
        for j, r in enumerate(over.tolist()):
            wide[r] = nz[nz[:, 0] == j, 1]
    return [wide.get(r, ids[r, : counts[r]]) for r in range(rows)]


def new_extract_and_read(logits: torch.Tensor, top_k: list):
    layout = plan_layout(top_k, logits.shape[1])
    host = MaskCopy(extract_support(logits, layout), pool=None).result(np.ones(len(top_k)))
    return [host.row(r) for r in range(len(top_k))]


# -- CPU: one variant per subprocess, for a clean peak-memory reading ---------

def _vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def cpu_worker(variant: str, rows: int, vocab: int, kind: str, repeats: int) -> None:
    logits, top_k = processed_logits(rows, vocab, kind, "cpu")
    fn = previous_extract_and_read if variant == "previous" else new_extract_and_read
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _vm_hwm_bytes()
    out = fn(logits, top_k)
    peak = _vm_hwm_bytes() - base
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(logits, top_k)
        times.append(time.perf_counter() - t0)
    sizes = [len(r) for r in out]
    print("RESULT " + json.dumps({"time": statistics.median(times), "peak": peak,
                                  "logits_bytes": logits.numel() * 4,
                                  "mean_support": float(np.mean(sizes))}), flush=True)


def run_cpu(args) -> None:
    print(f"CPU, torch path vs previous implementation; median of {args.repeats}, "
          "peak extra memory over the logits")
    print(f"{'R':>5} {'kind':>11} {'support':>8} | {'previous':>9} {'new':>9} {'ratio':>6} "
          f"| {'prev mem/logits':>15} {'new mem/logits':>14}")
    for rows in args.rows:
        for kind in args.kinds:
            res = {}
            for variant in ("previous", "new"):
                cmd = [sys.executable, __file__, "--cpu-worker", variant, "--rows",
                       str(rows), "--kinds", kind, "--vocab", str(args.vocab),
                       "--repeats", str(args.repeats)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                line = next(l for l in out.splitlines() if l.startswith("RESULT "))
                res[variant] = json.loads(line[len("RESULT "):])
            p, n = res["previous"], res["new"]
            print(f"{rows:>5} {kind:>11} {n['mean_support']:>8.0f} | "
                  f"{p['time'] * 1e3:>7.1f}ms {n['time'] * 1e3:>7.1f}ms "
                  f"{n['time'] / p['time']:>6.3f} | {p['peak'] / p['logits_bytes']:>15.3f} "
                  f"{n['peak'] / n['logits_bytes']:>14.3f}", flush=True)


# -- CUDA ---------------------------------------------------------------------

def device_bandwidth_gbs(args) -> float:
    if args.peak_gbs:
        return args.peak_gbs
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    return float("nan")


def run_cuda(args) -> None:
    peak = device_bandwidth_gbs(args)
    pool = PinnedPool()
    copy_stream = torch.cuda.Stream()
    print(f"CUDA {torch.cuda.get_device_name(0)}, memory bandwidth ~{peak:.0f} GB/s; "
          f"median of {args.repeats}")
    print(f"{'R':>5} {'kind':>11} {'support':>8} | {'kernel+copy':>11} {'GB/s':>7} "
          f"{'of peak':>7} | {'copied':>9}")
    for rows in args.rows:
        for kind in args.kinds:
            logits, top_k = processed_logits(rows, args.vocab, kind, "cuda")
            main = torch.cuda.current_stream()

            def step():
                layout = plan_layout(top_k, args.vocab)
                mask = extract_support(logits, layout)
                with torch.cuda.stream(copy_stream):
                    copy_stream.wait_stream(main)
                    copy = MaskCopy(mask, pool)
                    done = torch.cuda.Event()
                    done.record(copy_stream)
                return layout, copy, done

            for _ in range(3):
                _, copy, done = step()
                done.synchronize()
                host = copy.result(np.ones(rows))
            times = []
            for _ in range(args.repeats):
                start = torch.cuda.Event(enable_timing=True)
                start.record(main)
                layout, copy, done = step()
                done.synchronize()
                times.append(start.elapsed_time(done) / 1e3)
                host = copy.result(np.ones(rows))
            t = statistics.median(times)
            wide_rows = len(host.wide)
            moved = (logits.numel() * logits.element_size()             # read once
                     + 2 * (layout.bits_offset + wide_rows * layout.words) * 4)  # write + copy
            support = np.mean([len(host.row(r)) for r in range(rows)])
            print(f"{rows:>5} {kind:>11} {support:>8.0f} | {t * 1e6:>9.1f}us "
                  f"{moved / t / 1e9:>7.0f} {moved / t / 1e9 / peak:>7.1%} | "
                  f"{layout.numel * 4 / 1e6:>7.2f}MB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--peak-gbs", type=float, default=None,
                    help="device memory bandwidth, if the driver does not report it")
    ap.add_argument("--cpu-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cpu_worker:
        cpu_worker(args.cpu_worker, args.rows[0], args.vocab, args.kinds[0], args.repeats)
    elif torch.cuda.is_available():
        run_cuda(args)
    else:
        run_cpu(args)


if __name__ == "__main__":
    main()
