"""Mask extraction + device-to-host copy, at real vocabulary sizes, in one run.

On CUDA (one command, torch + Triton only, a few minutes on one GPU):

    pip download vllm==0.33.0 --no-deps -d wheels    # where the network allows
    python benchmarks/bench_extraction.py --upstream wheels/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

for R in {64, 256, 1024}, V = 151,936, bf16 and fp32, top_k = 50 and top-p
only (p = 0.95, no top-k: the widest layout), side by side on the same logits:

  gpu-only   device time of the extraction alone: a device sleep is queued
             first, then the start event, the launches, the end event, so the
             host's launch work is hidden behind the sleep (median of repeats)
  enqueue    host wall time to issue the step (layout planning + launches)
  e2e        host wall time from issuing the step to the decoded host masks
             (pinned asynchronous copy, then the host decode)
  one read   gpu-only time of `logits.amax(-1)`: reading the logits once, the floor

for this project's kernel and for vLLM 0.33's `_compact_sampling_mask_kernel`
(with its `SamplingMaskTensors.from_logits` / `tolists`). The upstream code is
NOT in this repository: `--upstream` names a vLLM 0.33.0 wheel, its extracted
tree, or its `vllm/v1/worker/gpu/sample/output.py`; at run time the kernel
and that class are cut out of the source (ast) into a temporary module with
shims for the two vLLM imports (`triton`/`tl`, and `SamplingMaskLists` as a
plain tuple). Without `--upstream`, or if the source cannot be cut, that
column is skipped with the reason.

On CPU (no GPU timings are possible there):

  host       host planning of one step (`plan_step`: row selection + layout)
             at R = 64 / 256 / 1024 / 4096: must stay flat in R
  pickle     bytes of the pickled `StepMasks` (what crosses processes in
             ModelRunnerOutput) against the padded [R, W] form it replaced
  torch      the CPU path (`extract_support`'s default on CPU logits: "host",
             numpy) vs the previous implementation (time and peak extra memory,
             each in its own subprocess)
  impl       the two CPU implementations side by side, "host" (numpy) and "torch"
             (`extract_support(implementation=...)`), extraction and host decode,
             median of 200, on torch's threads (`--threads`)
  onhost     what a CPU host's step runs (`extract_on_host`, with support
             logprobs' values and the drawn tokens), compiled (`_supports_native`)
             against numpy, taking turns on the same logits, median of 200 each

    python benchmarks/bench_extraction.py --cpu-sections host pickle
    python benchmarks/bench_extraction.py --cpu-sections impl --rows 32 --vocab 4096 --kinds top_k=50
    python benchmarks/bench_extraction.py --cpu-sections onhost --rows 8 32 64 --vocab 4096 --kinds top_k=50
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vllm_sampling_mask.worker.extraction import (extract_selected, extract_support,  # noqa: E402
                                           plan_layout, plan_step, warm_up)
from vllm_sampling_mask.worker.transport import MaskCopy, PinnedPool, decode  # noqa: E402

KINDS = ("top_k=50", "top_k=1024", "top_p=0.95")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
UPSTREAM_FILE = "vllm/v1/worker/gpu/sample/output.py"


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


# -- vLLM 0.33's kernel, loaded at run time ------------------------------------

_SHIMS = '''from __future__ import annotations
from collections.abc import Sequence
from typing import NamedTuple
import numpy as np
import torch
import triton
import triton.language as tl


class SamplingMaskLists(NamedTuple):   # shim for vllm.v1.outputs.SamplingMaskLists
    ids: object
    offsets: object
    cu_num_generated_tokens: object
'''


def load_upstream(path: str | None):
    """(module, None) with `_compact_sampling_mask_kernel` and
    `SamplingMaskTensors` from vLLM's own source, or (None, why not)."""
    if not path:
        return None, "no --upstream given (a vLLM 0.33.0 wheel or its output.py)"
    try:
        if path.endswith(".whl"):
            with zipfile.ZipFile(path) as wheel:
                source = wheel.read(UPSTREAM_FILE).decode()
        elif os.path.isdir(path):
            with open(os.path.join(path, UPSTREAM_FILE)) as f:
                source = f.read()
        else:
            with open(path) as f:
                source = f.read()
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        return None, f"cannot read {UPSTREAM_FILE} from {path}: {e}"
    lines = source.splitlines()
    wanted = {"_compact_sampling_mask_kernel", "SamplingMaskTensors", "MAX_COMPACT_SUPPORT"}
    pieces, found = [], set()
    for node in ast.parse(source).body:
        names = ({node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                 {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)})
        if names & wanted:
            first = min([node.lineno] + [d.lineno for d in
                                         getattr(node, "decorator_list", [])])
            pieces.append("\n".join(lines[first - 1: node.end_lineno]))
            found |= names & wanted
    if found != wanted:
        return None, f"{path}: did not find {sorted(wanted - found)} (another vLLM version?)"
    # A real file: Triton's JIT reads its kernels' source back from disk.
    where = os.path.join(tempfile.mkdtemp(prefix="upstream_vllm_"), "upstream_output.py")
    with open(where, "w") as f:
        f.write(_SHIMS + "\n\n" + "\n\n\n".join(pieces) + "\n")
    spec = importlib.util.spec_from_file_location("upstream_output", where)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - reported, the column is skipped
        return None, f"cannot load the upstream kernel from {path}: {e!r}"
    return module, None


def upstream_rows(module, logits, top_k):
    """Upstream's step: from_logits (kernel), then the arguments it needs."""
    rows = logits.shape[0]
    cu = torch.arange(rows, dtype=torch.int32, device=logits.device)
    ones = torch.ones(rows, dtype=torch.int32, device=logits.device)
    width = int(max(top_k))   # its max_num_kept: the batch's largest top-k (capped inside)
    return lambda: module.SamplingMaskTensors.from_logits(logits, cu, ones, width)


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


# -- CPU ------------------------------------------------------------------------

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


def run_cpu_torch(args) -> None:
    print(f"CPU path (host, numpy) vs previous implementation; median of {args.repeats}, "
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
                line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
                res[variant] = json.loads(line[len("RESULT "):])
            p, n = res["previous"], res["new"]
            print(f"{rows:>5} {kind:>11} {n['mean_support']:>8.0f} | "
                  f"{p['time'] * 1e3:>7.1f}ms {n['time'] * 1e3:>7.1f}ms "
                  f"{n['time'] / p['time']:>6.3f} | {p['peak'] / p['logits_bytes']:>15.3f} "
                  f"{n['peak'] / n['logits_bytes']:>14.3f}", flush=True)


def run_host(args) -> None:
    """Host planning of one step, as the sampler runs it (no device work)."""
    print("host planning per step (plan_step: row selection + layout), median of 200")
    print(f"{'R':>5} {'all rows':>10} {'subset':>10}")
    g = np.random.default_rng(0)
    for rows in (64, 256, 1024, 4096):
        top_k = g.choice([20, 50, 100], rows)
        res = []
        for wanted in (np.ones(rows, bool), g.random(rows) < 0.7):
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                plan_step(top_k, wanted, args.vocab, max_size=4096)
                times.append(time.perf_counter() - t0)
            res.append(statistics.median(times))
        print(f"{rows:>5} {res[0] * 1e6:>8.1f}us {res[1] * 1e6:>8.1f}us", flush=True)


def run_impl(args) -> None:
    """The CPU implementations side by side: extraction plus the host decode."""
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"CPU implementations, extraction + host decode, median of 200, "
          f"{torch.get_num_threads()} torch threads")
    print(f"{'R':>5} {'V':>7} {'kind':>11} | {'host':>9} {'torch':>9} {'host/torch':>10}")
    for rows in args.rows:
        for kind in args.kinds:
            logits, top_k = processed_logits(rows, args.vocab, kind, "cpu")
            layout = plan_layout(top_k, args.vocab)
            res = {}
            for impl in ("host", "torch"):
                times = []
                for _ in range(200):
                    t0 = time.perf_counter()
                    mask = extract_support(logits, layout, implementation=impl)
                    MaskCopy(mask, pool=None).result(np.ones(rows))
                    times.append(time.perf_counter() - t0)
                res[impl] = statistics.median(times)
            print(f"{rows:>5} {args.vocab:>7} {kind:>11} | {res['host'] * 1e6:>7.0f}us "
                  f"{res['torch'] * 1e6:>7.0f}us {res['host'] / res['torch']:>10.3f}",
                  flush=True)


def run_on_host(args) -> None:
    """`extract_on_host` compiled against numpy, taking turns on the same logits."""
    from vllm_sampling_mask.worker.extraction import host as extraction
    from vllm_sampling_mask.worker.extraction import extract_on_host

    compiled = extraction._supports_native
    if compiled is None:
        print("onhost: _supports_native is not built here (no C compiler at install)")
        return
    print("extract_on_host per step, compiled vs numpy, taking turns, median of 200")
    print(f"{'R':>5} {'V':>7} {'kind':>11} | {'C':>8} {'numpy':>8} {'C/numpy':>8}")
    for rows in args.rows:
        for kind in args.kinds:
            logits, _ = processed_logits(rows, args.vocab, kind, "cpu")
            sampled = logits.argmax(-1)
            times = {"C": [], "numpy": []}
            for _ in range(200):
                for name, module in (("C", compiled), ("numpy", None)):
                    extraction._supports_native = module
                    t0 = time.perf_counter()
                    extract_on_host(logits, None, 4096, sampled)
                    times[name].append(time.perf_counter() - t0)
            extraction._supports_native = compiled
            c, py = (statistics.median(times[k]) for k in ("C", "numpy"))
            print(f"{rows:>5} {args.vocab:>7} {kind:>11} | {c * 1e6:>6.0f}us "
                  f"{py * 1e6:>6.0f}us {c / py:>8.3f}", flush=True)


def run_pickle(args) -> None:
    """Pickled bytes of one step's StepMasks, flat (now) vs padded (before)."""
    print("pickled StepMasks per step (crosses processes under TP/PP)")
    print(f"{'R':>5} {'kind':>11} {'W':>5} | {'padded [R,W]':>12} {'flat':>10} {'ratio':>6}")
    for rows, kind in ((256, "top_k=50"), (256, "top_p=0.95")):
        logits, top_k = processed_logits(rows, args.vocab, kind, "cpu")
        layout = plan_layout(top_k, args.vocab)
        mask = extract_support(logits, layout)
        block = mask.block.numpy()
        host = decode(block, layout, mask.row_of(), np.ones(rows))
        meta, ids, _ = layout.views(block)
        before = pickle.dumps((host.row_of, host.counts, ids.copy(), {}, host.lost,
                               host.max_size))      # the fields of the padded form
        after = pickle.dumps(host)
        print(f"{rows:>5} {kind:>11} {layout.width:>5} | {len(before):>12,} "
              f"{len(after):>10,} {len(after) / len(before):>6.3f}", flush=True)


# -- CUDA -------------------------------------------------------------------------

def _sleep_cycles(seconds: float) -> int:
    props = torch.cuda.get_device_properties(0)
    khz = getattr(props, "clock_rate", 0) or 2_000_000
    return int(seconds * khz * 1e3)


def gpu_only(fn, repeats: int, sleep_cycles: int) -> float:
    """Median device time of fn's launches, with the host's launch work hidden
    behind a device sleep queued before the start event."""
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)   # us
    return statistics.median(times)


def host_enqueue(fn, repeats: int, sleep_cycles: int) -> float:
    """Median host wall time to issue fn (the device busy with a sleep, so a
    launch never waits for a free queue slot... nor for the device)."""
    times = []
    for _ in range(repeats):
        torch.cuda._sleep(sleep_cycles)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def end_to_end(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def run_cuda(args) -> None:
    upstream, why = load_upstream(args.upstream)
    if upstream is None:
        print(f"upstream column skipped: {why}")
    cycles = _sleep_cycles(args.sleep_ms / 1e3)
    pool, copy_stream = PinnedPool(), torch.cuda.Stream()
    main = torch.cuda.current_stream()
    print(f"CUDA {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"V = {args.vocab}; median of {args.repeats}; times in us; "
          f"gpu-only behind a {args.sleep_ms} ms device sleep")
    head = (f"{'R':>5} {'dtype':>5} {'kind':>11} | {'one read':>8} | {'ours gpu':>8} "
            f"{'x read':>6} {'enqueue':>8} {'e2e':>8} {'MB':>6} | {'up gpu':>8} "
            f"{'x read':>6} {'enqueue':>8} {'e2e':>8} {'MB':>6}")
    print(head)
    warm_up("cuda", args.vocab, tuple(DTYPES[d] for d in args.dtypes))
    for rows in args.rows:
        for dname in args.dtypes:
            for kind in args.kinds:
                base, top_k = processed_logits(rows, args.vocab, kind, "cuda")
                logits = base.to(DTYPES[dname])
                del base
                top_k = np.asarray(top_k)
                wanted = np.ones(rows, bool)
                ones = np.ones(rows)

                def ours():
                    return extract_selected(logits, top_k, wanted, max_size=4096)

                def ours_e2e():
                    mask = ours()
                    with torch.cuda.stream(copy_stream):
                        copy_stream.wait_stream(main)
                        copy = MaskCopy(mask, pool, record_event=True)
                    return copy.result(ones)

                read = gpu_only(lambda: logits.amax(-1), args.repeats, cycles)
                ours_e2e()                                      # warm (pool, caches)
                o_gpu = gpu_only(ours, args.repeats, cycles)
                o_enq = host_enqueue(ours, args.repeats, cycles)
                o_e2e = end_to_end(ours_e2e, args.repeats)
                o_mb = ours().layout.numel * 4 / 1e6
                line = (f"{rows:>5} {dname:>5} {kind:>11} | {read:>8.1f} | {o_gpu:>8.1f} "
                        f"{o_gpu / read:>6.2f} {o_enq:>8.1f} {o_e2e:>8.1f} {o_mb:>6.2f} |")
                if upstream is not None:
                    up = upstream_rows(upstream, logits, top_k)

                    def up_e2e():
                        host = up().to_cpu_nonblocking()
                        done = torch.cuda.Event()
                        done.record()
                        done.synchronize()
                        return host.tolists()

                    t = up()
                    u_mb = (t.token_ids.numel() * 4 + t.packed_mask.numel()
                            + t.counts.numel() * 4) / 1e6
                    up_e2e()
                    u_gpu = gpu_only(up, args.repeats, cycles)
                    u_enq = host_enqueue(up, args.repeats, cycles)
                    u_e2e = end_to_end(up_e2e, args.repeats)
                    line += (f" {u_gpu:>8.1f} {u_gpu / read:>6.2f} {u_enq:>8.1f} "
                             f"{u_e2e:>8.1f} {u_mb:>6.2f}")
                else:
                    line += "  (skipped)"
                print(line, flush=True)
                del logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--kinds", nargs="+", default=None,
                    help=f"of {KINDS}; default top_k=50 and top_p=0.95 on CUDA, all on CPU")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=list(DTYPES))
    ap.add_argument("--repeats", type=int, default=None,
                    help="default 30 on CUDA, 5 on CPU")
    ap.add_argument("--sleep-ms", type=float, default=2.0,
                    help="device sleep queued before each gpu-only measurement")
    ap.add_argument("--upstream", default=None,
                    help="vLLM 0.33.0 wheel, its extracted tree, or its " + UPSTREAM_FILE)
    ap.add_argument("--cpu-sections", nargs="+", default=["host", "pickle", "torch"],
                    choices=["host", "pickle", "torch", "impl", "onhost"])
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for the impl section (0: torch's default)")
    ap.add_argument("--cpu-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu_worker
    if args.kinds is None:
        args.kinds = ["top_k=50", "top_p=0.95"] if cuda else list(KINDS)
    if args.repeats is None:
        args.repeats = 30 if cuda else 5
    if args.cpu_worker:
        cpu_worker(args.cpu_worker, args.rows[0], args.vocab, args.kinds[0], args.repeats)
    elif cuda:
        run_cuda(args)
    else:
        print("no CUDA device: GPU timings cannot be measured here; CPU sections only")
        for section in args.cpu_sections:
            {"host": run_host, "pickle": run_pickle, "torch": run_cpu_torch,
             "impl": run_impl, "onhost": run_on_host}[section](args)


if __name__ == "__main__":
    main()
