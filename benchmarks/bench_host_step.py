"""The CPU host's per-step mask calls, warm and after the caches were flushed.

    python benchmarks/bench_host_step.py
    python benchmarks/bench_host_step.py --rows 8 32 64 --vocab 4096

Per row count, on `--vocab`-wide processed logprobs with a top-k support of 50
per row, the mean over `--repeats` calls of:

  extract_on_host    the host form's whole extraction (`extraction.extract_on_host`,
                     with the sampler's tokens, no support logprobs; where the
                     compiled pass is built it also checks the drawn tokens)
    drawn by numpy   the same with int32 tokens, which the compiled pass leaves to
                     numpy (`extraction.host._numpy_drawn`: the path before it took them)
  flatnonzero        its vocabulary-wide pass alone (`isfinite` then `flatnonzero`)
  word scan          an alternative tried for that pass: `flatnonzero` over 8-byte
                     words, then only the words that hold an id (not used: slower)
  torch nonzero      the same pass in torch (not used: slower)
  scaled top (torch) `support_logprobs.scaled_top_logprob` over every row: the
                     largest entry of each row's `log_softmax` (one fused kernel,
                     since 2026-12-04); past 2**18 logits a block of rows at a
                     time through a reused buffer (since 2026-12-05)
  scaled top, fused  the fused kernel at every size (what it was from 2026-12-04
                     to 2026-12-05); both scaled tops' largest error against
                     float64's is printed once per row count
  scaled top, 5 ops  the same value as five torch operations (max, subtract,
                     exp, sum, log: what it was from 2026-12-01 to 2026-12-04)
  scaled top (numpy) the same sum of exp in numpy (what it was before that)
  support, every row `support_logprobs.on_host` with every row asked (a rollout's
                     usual step: the values read at the ids as they are, one
                     `max` per row for log S)
  support, a subset  the same with every row but the last asked: the general
                     path, which aligns each stored id's value with its row
  hop pickle         the worker -> engine core hop's part for the mask, up to what
                     the scheduler reads: the step's `StepMasks` (from
                     `extract_on_host`, with drawn tokens) pickled and unpickled as
                     vLLM's queue does, then its `wire()`. Since 2026-12-03 it
                     travels as that wire form (`StepMasks.__reduce__`: the
                     `WireRows` made in the worker; no array is rebuilt); from
                     2026-12-02 it travelled as one buffer of its arrays
  hop pickle, arrays the same with the fields pickled as arrays, one by one (what a
                     dataclass pickles by default, and what the hop carried before
                     2026-12-02)
  worker step        the worker's whole part of a step, as the V1 runner adapter and
                     sampler adapter run it: the state's plan, the open step, its
                     plan for the sampler's batch, the extraction, the host form,
                     and the hop's pickle; also how many Python calls it makes
                     (cProfile, once)

"warm" repeats the call back to back; "cold" reads a 16 MB buffer before each
call, as a step's forward pass leaves the caches holding the model. In an
engine the calls cost more still (`bench_step_cost.py --timers`).
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import time

import numpy as np
import torch

from vllm_sampling_mask.worker.extraction import extract_on_host
from vllm_sampling_mask.worker.support_logprobs import on_host, scaled_top_logprob
from vllm_sampling_mask.worker.transport import MaskCopy, StepMasks
from vllm_sampling_mask.worker.state import SamplingMaskState


def word_scan(x: np.ndarray) -> np.ndarray:
    keep = np.isfinite(x).reshape(-1)
    words = np.flatnonzero(keep.view(np.uint64))
    within, bit = np.nonzero(keep.reshape(-1, 8)[words])
    return words[within] * 8 + bit


def numpy_scaled_top(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    return -np.log(shifted.sum(axis=1, dtype=np.float32))


def fused_scaled_top(scaled: torch.Tensor) -> torch.Tensor:
    return scaled.log_softmax(dim=1, dtype=torch.float32).amax(dim=1)


def five_op_scaled_top(scaled: torch.Tensor) -> torch.Tensor:
    shifted = scaled - scaled.amax(dim=1, keepdim=True)
    return -shifted.exp_().sum(dim=1).log_()


def mean_us(call, repeats: int, flush: np.ndarray | None) -> float:
    for _ in range(20):
        call()
    total = 0.0
    for _ in range(repeats):
        if flush is not None:
            flush.sum()
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
    return total / repeats * 1e6


def worker_step(state: SamplingMaskState, rows: int, logits, sampled, top_k) -> bytes:
    """The worker's part of one step, from plan to the hop's pickle (every row
    wants a mask, none asked for support logprobs)."""
    plan = state.plan(slice(0, rows), top_k, None)
    with state.step(plan) as step:
        step.planned("bench_host_step", rows)
        step.extract("bench_host_step", logits, sampled)
    masks = MaskCopy(step.mask, None).result(np.ones(rows, dtype=np.int64))
    return pickle.dumps(masks, protocol=5)


def python_calls(call) -> int:
    profile = cProfile.Profile()
    profile.runcall(call)
    return pstats.Stats(profile).total_calls - 1     # less the profiled call itself


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=1000)
    args = ap.parse_args()
    torch.manual_seed(0)
    flush = np.ones(4 << 20, dtype=np.float32)     # 16 MB
    print(f"V = {args.vocab}, top-k 50 supports, torch threads {torch.get_num_threads()}; "
          "mean us per call, warm / cold")
    for rows in args.rows:
        scaled = torch.randn(rows, args.vocab)
        top = scaled.topk(50, dim=1)
        logits = torch.full_like(scaled, float("-inf")).scatter_(1, top.indices, top.values)
        logits = logits.log_softmax(dim=1)
        x, sampled, every = logits.numpy(), top.indices[:, 0].clone(), np.arange(rows)
        sampled32 = sampled.to(torch.int32)
        assert (word_scan(x) == np.flatnonzero(np.isfinite(x))).all()
        masks = MaskCopy(extract_on_host(logits, None, 4096, sampled, values=False),
                         None).result(np.ones(rows, dtype=np.int64))
        fields = dict(vars(masks))
        with_values = extract_on_host(logits, None, 4096, sampled)
        scaled_top = scaled_top_logprob(scaled, every)
        every_row, subset = np.ones(rows, dtype=bool), np.arange(rows) < rows - 1
        state = SamplingMaskState(rows, args.vocab)
        state.requests.wants[:] = True
        top_k = np.full(rows, 50)
        calls = {
            "extract_on_host": lambda: extract_on_host(logits, None, 4096, sampled,
                                                       values=False),
            # int32 tokens: the compiled pass leaves `drawn` to numpy (the path before)
            "  drawn by numpy": lambda: extract_on_host(logits, None, 4096, sampled32,
                                                        values=False),
            "flatnonzero": lambda: np.flatnonzero(np.isfinite(x)),
            "word scan": lambda: word_scan(x),
            "torch nonzero": lambda: torch.isfinite(logits).view(-1).nonzero(),
            "scaled top (torch)": lambda: scaled_top_logprob(scaled, every),
            "scaled top, fused": lambda: fused_scaled_top(scaled),
            "scaled top, 5 ops": lambda: five_op_scaled_top(scaled),
            "scaled top (numpy)": lambda: numpy_scaled_top(scaled.numpy()),
            "support, every row": lambda: on_host(with_values, every_row, scaled_top, logits),
            "support, a subset": lambda: on_host(with_values, subset, scaled_top, logits),
            "hop pickle": lambda: pickle.loads(pickle.dumps(masks, protocol=5)).wire(),
            "hop pickle, arrays": lambda: StepMasks(
                **pickle.loads(pickle.dumps(fields, protocol=5))).wire(),
            "worker step": lambda: worker_step(state, rows, logits, sampled, top_k),
        }
        print(f"rows {rows:3d}  worker step: "
              f"{python_calls(calls['worker step'])} Python calls")
        reference = scaled.double().log_softmax(dim=1).amax(dim=1)
        print(f"rows {rows:3d}  scaled top, largest error against float64: "
              f"{(scaled_top.double() - reference).abs().max():.1e} (torch), "
              f"{(fused_scaled_top(scaled).double() - reference).abs().max():.1e} (fused)")
        for name, call in calls.items():
            warm = mean_us(call, args.repeats, None)
            cold = mean_us(call, args.repeats, flush)
            print(f"rows {rows:3d}  {name:<20} {warm:8.1f} / {cold:8.1f}")


if __name__ == "__main__":
    main()
