"""What MaskedGRPOTrainer's coverage metric adds to the loss's entropy pass (no timing).

    python benchmarks/bench_coverage_cost.py [--tokens 256 2048] [--support 20]

With ``sampling_mask_coverage`` on, the hook's no-gradient entropy pass is
``training.support_coverage(..., entropy=True)`` over the batch's supports; off, the
same call over empty supports: the entropy alone, the same ``[rows, V]`` chunks of
logits (what the hook runs either way). For the demo model's sizes (H 128, V 4096) and
T tokens with supports of about ``--support`` ids, this counts, with torch's profiler,
the operator calls and the bytes allocated by each, and prints the difference: the
metric's cost. Counts, not times: they do not depend on what else runs on the host.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vllm_sampling_mask.frontend.sampling_mask import SamplingMask  # noqa: E402
from vllm_sampling_mask.training import pack_masks, support_coverage  # noqa: E402

ROWS = 256      # MaskedGRPOTrainer's entropy chunk (integrations/trl.py _ENTROPY_ROWS)


def profile_ops(fn) -> tuple[int, int]:
    """(aten operator calls, bytes their leaf calls allocated) of `fn()` without
    gradient, from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU],
                                  profile_memory=True) as prof:
        fn()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    allocated = sum(max(e.cpu_memory_usage, 0) for e in events
                    if not any(c.name.startswith("aten::") for c in e.cpu_children))
    return len(events), allocated


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--support", type=int, default=20)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    H, V = 128, 4096
    weight = torch.randn(V, H, generator=gen)
    for T in args.tokens:
        h = torch.randn(T, H, generator=gen)
        rows = [torch.randperm(V, generator=gen)[:args.support].sort().values.tolist()
                for _ in range(T)]
        packed = pack_masks([SamplingMask.from_lists(rows)])
        empty = (torch.zeros(0, dtype=torch.int64), torch.zeros(T + 1, dtype=torch.int64))
        off, on = (profile_ops(lambda: support_coverage(h, mask, 1.0, lm_head_weight=weight,
                                                     entropy=True, chunk_rows=ROWS,
                                                     validate=False))
                   for mask in (empty, packed))
        N = T * args.support
        print(f"T={T} N={N}: entropy only {off[0]} ops {off[1]} B; with coverage "
              f"{on[0]} ops {on[1]} B; the metric adds {on[0] - off[0]} ops, "
              f"{on[1] - off[1]} B ({(on[1] - off[1]) / N:.1f} B per support id; "
              f"one [rows, V] float32 chunk is {ROWS * V * 4} B)")


if __name__ == "__main__":
    main()
