"""Benchmark `nucleus_logprobs` and `nucleus_logprobs_from_hidden` against the dense ways.

Logits path, [T, V] logits, supports of about S ids (sizes uniform in
[S/2, 3S/2], random ids, always containing the sampled token):

  (a) loop   the per-token loop a trainer writes today: for each row,
             masked_fill everything outside the support with -inf,
             log_softmax, pick the sampled token.  Very slow, so it is timed on
             the first `--loop-rows` rows (a fresh [rows, V] leaf) and scaled
             linearly to T; its memory is the one of that subset run.
  (b) dense  the vectorised version: a [T, V] boolean keep-mask, masked_fill,
             log_softmax over [T, V], gather.
  ours       vllm_sampling_mask.training.nucleus_logprobs (validate=True, the
             default; "ours, no validate" is validate=False).

Hidden path, hidden [T, H] and lm_head weight [V, H]:

  matmul + (b)     logits = hidden @ W.T, then (b).
  matmul + ours    logits = hidden @ W.T, then nucleus_logprobs.
  ours from hidden nucleus_logprobs_from_hidden (never builds [T, V]).

Modes: "fwd" (forward with autograd recording, inputs require grad) and
"fwd+bwd" (forward, then backward of the sum into the inputs' .grad).

Time: the best of up to --repeats calls after the memory-measured first call,
as many as fit in --budget seconds; a variant too slow for any repeat is
timed by that first call (on CPU nothing is cached between calls: every call
pays its own page faults, so the first call is not "cold" in any other way).

Peak extra memory: each variant runs in a fresh subprocess that builds the
inputs; before each measured call (CPU) it resets the kernel's peak-RSS
counter (`echo 5 > /proc/self/clear_refs`) and reads VmRSS as the baseline;
the figure is VmHWM - baseline at the end of the call, i.e. every byte the
call touched beyond the inputs, gradients included.  glibc is told to give
every block of 128 KiB or more back to the OS on free
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_), so the fwd measurement
leaves nothing behind that the fwd+bwd one could reuse unseen.  fwd+bwd also
allocates the dense input gradient ([T, V] logits.grad, or [V, H]
weight.grad), identical for every variant: the table shows the figure with
and without it.  On CUDA: torch.cuda.max_memory_allocated() minus the bytes
allocated before the call.  Fallback where clear_refs is not writable:
ru_maxrss growth (then the input build's own transient peak can hide part of
the call's).

    python benchmarks/bench_nucleus_logprobs.py            # full size (minutes)
    python benchmarks/bench_nucleus_logprobs.py --small    # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# ---------------------------------------------------------------------------
# Memory probes
# ---------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class MemProbe:
    def __init__(self, device):
        self.device = device
        self.method = None

    def start(self):
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            self.method = "cuda max_memory_allocated"
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = _status_kb("VmRSS") * 1024
            self.method = "VmHWM after clear_refs"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.method = "ru_maxrss growth"

    def extra(self) -> int:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        if self.method == "VmHWM after clear_refs":
            return _status_kb("VmHWM") * 1024 - self.base
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

def make_supports(T, V, mean, tok, device, gen):
    """Random supports (sizes ~ U[mean/2, 3mean/2]) containing each sampled token."""
    import torch
    lo, hi = max(1, mean // 2), max(1, (3 * mean) // 2)
    sizes = torch.randint(lo, hi + 1, (T,), generator=gen)
    n = int(sizes.sum())
    seg = torch.repeat_interleave(torch.arange(T), sizes)
    rand_ids = torch.randint(0, V, (n,), generator=gen)
    keys = torch.cat([seg * V + rand_ids, torch.arange(T) * V + tok.cpu()])
    keys = torch.unique(keys)  # sorted: by token, then ascending id; duplicates dropped
    ids = (keys % V).to(torch.int32)
    counts = torch.bincount(keys // V, minlength=T)
    offsets = torch.zeros(T + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    return ids.to(device), offsets.to(device)


def build(args, kind, support, device, dtype):
    import torch
    gen = torch.Generator().manual_seed(1234 + support)
    V = args.vocab
    if kind == "logits":
        T = args.tokens
        x = torch.randn(T, V, generator=gen, dtype=torch.float32).mul_(3.0)
        x = x.to(device=device, dtype=dtype).requires_grad_(True)
        tensors = {"logits": x}
    else:
        T, H = args.hidden_tokens, args.hidden
        h = torch.randn(T, H, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
        w = torch.randn(V, H, generator=gen).mul_(2.0 / math.sqrt(H))
        w = w.to(device=device, dtype=dtype).requires_grad_(True)
        tensors = {"hidden": h, "weight": w}
    tok = torch.randint(0, V, (T,), generator=gen)
    ids, offsets = make_supports(T, V, support, tok, device, gen)
    return tensors, tok.to(device), ids, offsets


# ---------------------------------------------------------------------------
# Variants
# ---------------------------------------------------------------------------

def dense_masked(logits, tok, ids, offsets, temp):
    """(b): vectorised masked_fill over [T, V]."""
    import torch
    T, V = logits.shape
    seg = torch.repeat_interleave(torch.arange(T, device=logits.device),
                                  offsets[1:] - offsets[:-1])
    keep = torch.zeros(T, V, dtype=torch.bool, device=logits.device)
    keep[seg, ids.long()] = True
    z = logits.float() / temp
    z = z.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(z, dim=-1).gather(1, tok[:, None]).squeeze(1)


def loop_masked(logits, tok, support_list, temp):
    """(a): the per-token loop."""
    import torch
    V = logits.shape[1]
    rows = logits.unbind(0)
    out = []
    for t, row in enumerate(rows):
        keep = torch.zeros(V, dtype=torch.bool, device=logits.device)
        keep[support_list[t]] = True
        z = (row.float() / temp).masked_fill(~keep, float("-inf"))
        out.append(torch.log_softmax(z, dim=-1)[tok[t]])
    return torch.stack(out)


def make_call(variant, tensors, tok, ids, offsets, temp, args):
    import torch
    from vllm_sampling_mask.training import nucleus_logprobs, nucleus_logprobs_from_hidden
    if variant == "loop":
        rows = min(args.loop_rows, tok.numel())
        sub = tensors["logits"].detach()[:rows].clone().requires_grad_(True)
        tensors["logits"] = sub
        off = offsets.cpu().tolist()
        ids_l = ids.long()
        support_list = [ids_l[off[t]:off[t + 1]] for t in range(rows)]
        tok_sub = tok[:rows]
        return lambda: loop_masked(sub, tok_sub, support_list, temp)
    if variant == "dense":
        return lambda: dense_masked(tensors["logits"], tok, ids, offsets, temp)
    if variant == "ours":
        return lambda: nucleus_logprobs(tensors["logits"], tok, (ids, offsets), temp)
    if variant == "ours_nv":
        return lambda: nucleus_logprobs(tensors["logits"], tok, (ids, offsets), temp,
                                        validate=False)
    h, w = tensors.get("hidden"), tensors.get("weight")
    if variant == "mm_dense":
        return lambda: dense_masked(h @ w.t(), tok, ids, offsets, temp)
    if variant == "mm_ours":
        return lambda: nucleus_logprobs(h @ w.t(), tok, (ids, offsets), temp)
    if variant == "hidden_ours":
        return lambda: nucleus_logprobs_from_hidden(h, w, tok, (ids, offsets), temp)
    raise ValueError(variant)


def worker(args):
    """One variant (and "ours, validate=False" with "ours"), both modes, one process."""
    import gc
    import torch
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    kind = "logits" if args.variant in ("loop", "dense", "ours") else "hidden"
    tensors, tok, ids, offsets = build(args, kind, args.support, device, dtype)
    variants = [args.variant] + (["ours_nv"] if args.variant == "ours" else [])
    calls = {v: make_call(v, tensors, tok, ids, offsets, args.temperature, args)
             for v in variants}
    leaves = list(tensors.values())
    n_rows = tok.numel() if args.variant != "loop" else min(args.loop_rows, tok.numel())
    results = []
    for mode in ("fwd", "fwd+bwd"):
        for v in variants:
            call = calls[v]

            def run_once():
                for x in leaves:
                    x.grad = None
                out = call()
                if mode == "fwd+bwd":
                    out.sum().backward()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return out

            for x in leaves:
                x.grad = None
            gc.collect()
            probe = MemProbe(device)
            probe.start()
            t0 = time.perf_counter()
            out = run_once()
            first = time.perf_counter() - t0
            extra = probe.extra()
            del out
            times = []
            spent = first
            while len(times) < args.repeats and spent + (times[-1] if times else first) <= args.budget:
                t0 = time.perf_counter()
                out = run_once()
                times.append(time.perf_counter() - t0)
                spent += times[-1]
                del out
            results.append({"variant": v, "mode": mode, "time": min(times) if times else first,
                            "extra": extra, "rows": n_rows, "n_ids": int(ids.numel()),
                            "mem_method": probe.method})
    print(json.dumps(results))


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

LABELS = {
    "loop": "(a) per-token loop",
    "dense": "(b) dense masked_fill",
    "ours": "ours",
    "ours_nv": "ours, validate=False",
    "mm_dense": "matmul + (b)",
    "mm_ours": "matmul + ours",
    "hidden_ours": "ours from hidden",
}


def spawn(args, variant, support):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--variant", variant,
           "--support", str(support)]
    for name in ("tokens", "vocab", "hidden", "hidden_tokens", "repeats", "budget", "loop_rows",
                 "device", "dtype", "temperature", "threads"):
        cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    env = dict(os.environ)
    # Every block of 128 KiB or more is mmapped and given back on free, so a
    # measurement is not helped by memory an earlier one left in the heap.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    env.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    if args.thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"worker {variant}/{support} failed")
    return json.loads(res.stdout.strip().splitlines()[-1])


def fmt_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def table(title, rows, ref_name, others, results, grad_bytes, note):
    print(f"\n{title}")
    head = (f"{'support':>7} {'mode':7} {'variant':24} {'time':>9} {'ours faster':>11} "
            f"{'peak extra':>11} {'ours less':>9} {'excl. grad':>11} {'ours less':>9}")
    print(head)
    print("-" * len(head))
    for support, mode in rows:
        ours = results[(ref_name, support, mode)]
        g = grad_bytes if mode == "fwd+bwd" else 0
        ours_ex = max(ours["extra"] - g, 1)
        for v in [ref_name] + others:
            r = results.get((v, support, mode))
            if r is None:
                continue
            gv = g * r["rows"] // ours["rows"] if v == "loop" else g
            ex = r["extra"] - gv
            speed = "" if v == ref_name else f"{r['time_full'] / ours['time_full']:.1f}x"
            if v in (ref_name, "ours_nv"):
                mem = mem_ex = ""
            elif v == "loop":
                mem = mem_ex = "(subset)"
            else:
                mem = f"{r['extra'] / max(ours['extra'], 1):.1f}x"
                mem_ex = f"{ex / ours_ex:.1f}x" if g else ""
            label = LABELS[v] + (" *" if v == "loop" else "")
            excl = fmt_bytes(ex) if g else ""
            print(f"{support:>7} {mode:7} {label:24} {r['time_full']:>8.3f}s {speed:>11} "
                  f"{fmt_bytes(r['extra']):>11} {mem:>9} {excl:>11} {mem_ex:>9}")
        print()
    if note:
        print(note)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="smoke-test sizes (seconds)")
    p.add_argument("--tokens", type=int, default=4096, help="T for the logits path")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=4096, help="H for the hidden path")
    p.add_argument("--hidden-tokens", type=int, default=1024, help="T for the hidden path")
    p.add_argument("--supports", type=str, default="50,1000", help="mean support sizes")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed calls after the memory-measured first call, while they fit "
                        "in --budget (none: the first call's time is used)")
    p.add_argument("--budget", type=float, default=20.0,
                   help="seconds per (variant, mode) for the repeats")
    p.add_argument("--thp", action="store_true",
                   help="run the workers with THP_MEM_ALLOC_ENABLE=1 (torch's CPU allocator "
                        "asks for transparent huge pages: far fewer page faults)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--matmul-ours", action="store_true",
                   help="also run matmul + nucleus_logprobs on the hidden path")
    p.add_argument("--loop-rows", type=int, default=256, help="rows timed for (a)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--only", choices=["logits", "hidden"], default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--support", type=int, help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads is None:
        import torch
        args.threads = torch.get_num_threads()
    if args.worker:
        worker(args)
        return
    if args.small:
        args.tokens, args.vocab, args.hidden, args.hidden_tokens = 256, 8192, 256, 128
        args.loop_rows = min(args.loop_rows, 64)
    if args.small and args.supports == "50,1000":
        args.supports = "5,60"   # the same fractions of a 8192-id vocabulary, roughly
    supports = [int(s) for s in args.supports.split(",")]
    modes = ["fwd", "fwd+bwd"]
    import torch
    print(f"torch {torch.__version__}, device {args.device}, {args.threads} threads, "
          f"dtype {args.dtype}, temperature {args.temperature}")
    timing = (f"best of up to {args.repeats} calls after the memory-measured one, as many "
              f"as fit in {args.budget:g}s (else that call's own time)")
    if args.thp:
        timing += "; THP_MEM_ALLOC_ENABLE=1"
    print(f"logits path: T={args.tokens} V={args.vocab}; hidden path: T={args.hidden_tokens} "
          f"H={args.hidden} V={args.vocab}; time = {timing}")
    results = {}
    started = time.perf_counter()
    jobs = []
    if args.only in (None, "logits"):
        jobs += [(v, s) for s in supports for v in ("ours", "dense", "loop")]
    if args.only in (None, "hidden"):
        hidden_variants = ["hidden_ours", "mm_dense"] + (["mm_ours"] if args.matmul_ours else [])
        jobs += [(v, s) for s in supports for v in hidden_variants]
    method = None
    for v, s in jobs:
        for r in spawn(args, v, s):
            method = r["mem_method"]
            logits_kind = r["variant"] in ("loop", "dense", "ours", "ours_nv")
            total_rows = args.tokens if logits_kind else args.hidden_tokens
            r["time_full"] = r["time"] * total_rows / r["rows"]
            results[(r["variant"], s, r["mode"])] = r
            print(f"  [{time.perf_counter() - started:6.1f}s] {LABELS[r['variant']]:24} "
                  f"support~{s:<5} {r['mode']:8} {r['time']:.3f}s  extra {fmt_bytes(r['extra'])}"
                  f"  (N={r['n_ids']})", flush=True)
    itemsize = 4 if args.dtype == "float32" else 2
    if args.only in (None, "logits"):
        gb = args.tokens * args.vocab * itemsize
        table(f"nucleus_logprobs: logits [{args.tokens}, {args.vocab}] {args.dtype}",
              [(s, m) for s in supports for m in modes], "ours", ["ours_nv", "dense", "loop"],
              results, gb,
              f"* (a) timed on the first {args.loop_rows} rows (a fresh [{args.loop_rows}, V] "
              f"leaf) and scaled linearly to T={args.tokens};\n  its memory columns are the "
              f"{args.loop_rows}-row run's.\n"
              f"'excl. grad': peak extra minus logits.grad ({fmt_bytes(gb)}), which every "
              "variant must allocate in fwd+bwd.")
    if args.only in (None, "hidden"):
        gb = (args.vocab + args.hidden_tokens) * args.hidden * itemsize
        table(f"nucleus_logprobs_from_hidden: hidden [{args.hidden_tokens}, {args.hidden}], "
              f"weight [{args.vocab}, {args.hidden}] {args.dtype}",
              [(s, m) for s in supports for m in modes], "hidden_ours", ["mm_ours", "mm_dense"],
              results, gb,
              f"'excl. grad': peak extra minus weight.grad + hidden.grad ({fmt_bytes(gb)}), "
              "which every variant must allocate in fwd+bwd.")
    print(f"\nmemory: {method}, over the first call of each (variant, mode); one fresh "
          "subprocess per variant and support,\nglibc told to return every block >= 128 KiB "
          "to the OS on free (MALLOC_MMAP_THRESHOLD_), so consecutive measurements are "
          "independent.")
    print(f"total {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
