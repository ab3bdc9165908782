"""What the coverage metric adds in the verl, OpenRLHF and SkyRL adapters (counts and
a tight-loop minimum).

    python benchmarks/bench_coverage_frameworks.py [--tokens 256 2048] [--support 8]
        [--vocab 4096] [--repeat 5]

For T response tokens with supports of about ``--support`` ids and a vocabulary of
``--vocab`` (default: the demo model's 4096), each adapter's own pass with the metric
off and on, side by side:

- verl: ``integrations.verl._support_pass`` on ``[T, V]`` logits (the rows
  ``prepare_model_outputs`` selects), ``coverage=False`` / ``True``;
- OpenRLHF: ``integrations.openrlhf.support_log_probs`` on ``[B, L, V]``
  temperature-scaled logits, ``coverage=False`` / ``True``;
- SkyRL: its replay scores the support's pairs itself; the metric is
  ``integrations.skyrl.replay_coverage`` alone, on ``[1, T, V]`` logits.

Printed: aten operator calls and bytes allocated (torch's profiler; independent of the
host's load) and the minimum wall time of ``--repeat`` runs, each with the metric's
difference. No framework is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vllm_sampling_mask.integrations import openrlhf, skyrl, verl  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_coverage_cost import profile_ops as _profile  # noqa: E402


def _best(fn, repeat):
    times = []
    with torch.no_grad():
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(times)


def _supports(labels, support, vocab, gen):
    ids, offsets = [], [0]
    for token in labels.tolist():
        row = [token] + torch.randint(0, vocab, (support - 1,), generator=gen).tolist()
        ids += list(dict.fromkeys(row))
        offsets.append(len(ids))
    return np.array(ids, np.int32), np.array(offsets, np.int64)


def _report(name, T, N, off, on, repeat):
    (ops0, b0), (ops1, b1) = _profile(off), _profile(on)
    t0, t1 = _best(off, repeat), _best(on, repeat)
    print(f"{name:8s} T={T:5d} N={N:6d}: off {ops0} ops {b0} B {t0 * 1e3:.2f} ms; "
          f"on {ops1} ops {b1} B {t1 * 1e3:.2f} ms; the metric adds {ops1 - ops0} ops, "
          f"{b1 - b0} B, {(t1 - t0) * 1e3:.2f} ms"
          + (f" ({(t1 - t0) / t0 * 100:.0f}% of the pass without it)" if ops0 else ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--support", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    V = args.vocab
    print(f"torch threads {torch.get_num_threads()}, V={V}")
    for T in args.tokens:
        logits = torch.randn(T + 1, V, generator=gen)
        labels = torch.randint(0, V, (T + 1,), generator=gen)
        temperature = torch.full((T + 1,), 0.8)
        # verl: one sample, prompt of 1 token, T response tokens
        mask = _supports(labels[1:], args.support, V, gen)
        N = len(mask[0])
        _report("verl", T, N,
                lambda: verl._support_pass(logits, labels.roll(-1), temperature, [T + 1], [T],
                                           [mask], coverage=False),
                lambda: verl._support_pass(logits, labels.roll(-1), temperature, [T + 1], [T],
                                           [mask], coverage=True), args.repeat)
        # OpenRLHF: one row of T + 1 tokens, T columns
        sequences = labels[None]
        _report("openrlhf", T, N,
                lambda: openrlhf.support_log_probs(logits[None], sequences, [mask], T),
                lambda: openrlhf.support_log_probs(logits[None], sequences, [mask], T,
                                                   coverage=True), args.repeat)
        # SkyRL: the support as its [T, width] -1-padded rows, one row per position
        width = int(np.diff(mask[1]).max())
        rows = torch.as_tensor(skyrl.support_rows(mask[0], mask[1], width))
        support = types.SimpleNamespace(values=rows)
        row_ids, loss = torch.arange(T)[None], torch.ones(1, T, dtype=torch.bool)
        _report("skyrl", T, N, lambda: None,
                lambda: skyrl.replay_coverage(logits[None, :T], row_ids, loss, support),
                args.repeat)


if __name__ == "__main__":
    main()
