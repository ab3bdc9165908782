"""Fuzz sampling masks over HTTP, long: until a token goal (default 10,000) or N examples.

    python scripts/fuzz_masks.py [--tokens 10000] [--examples N] [--seed 0]
                                 [--server URL] [--replay-every 5]

The same generator and checker as `tests/http/test_fuzz.py` (`tests/fuzz_support.py`,
one copy), driven by a seeded `random.Random` instead of hypothesis: example i
draws from `Random(seed * 1_000_003 + i)`, so `--seed S --start i --examples 1`
replays example i alone. Without `--server` it starts its own `vllm serve` on
the demo model with the shared test server's arguments (the V1 runner natively,
`--max-num-seqs 8 --max-sampling-mask-size 128`, float32, processed logprobs)
and stops it at the end. Every `--replay-every`-th example is a seeded crowd
(`fuzz_support.replay_crowd`); the others are concurrent batches over the three
routes with streams and client aborts.

The goal counts tokens whose support was checked (alignment, membership, order,
range, the size limit, banned ids; most of them also against the float32
reference). Prints a line per example and a final report; exits 1 on any
violation.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000,
                    help="stop once this many tokens' supports were checked (0: no goal)")
    ap.add_argument("--examples", type=int, default=0, help="stop after N examples (0: no cap)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="index of the first example")
    ap.add_argument("--server", help="an already running server's base URL")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--replay-every", type=int, default=5,
                    help="every k-th example is a seeded crowd replay (0: never)")
    ap.add_argument("--reference-every", type=int, default=1,
                    help="compare every k-th masked choice with the reference")
    ap.add_argument("--failures", default="fuzz-masks-failures.jsonl",
                    help="where to write each violation with its full request body")
    args = ap.parse_args()
    if not args.tokens and not args.examples:
        ap.error("give --tokens or --examples")

    import fuzz_support as fs
    from conftest import SERVER_MAX_MASK_SIZE, SERVER_MAX_NUM_SEQS, free_port
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import torch
    from vllm_sampling_mask import DEMO_MODEL

    torch.set_num_threads(1)    # the server has the other core
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    checker = fs.Checker(model, tokenizer, reference_every=args.reference_every)

    def run(base: str) -> None:
        t0 = time.monotonic()
        i = args.start
        while True:
            stats = checker.stats
            if args.tokens and stats.supports_checked >= args.tokens:
                break
            if args.examples and i - args.start >= args.examples:
                break
            d = fs.RandomDraw(args.seed * 1_000_003 + i)
            crowd = bool(args.replay_every) and i % args.replay_every == args.replay_every - 1
            new = fs.fuzz_example(base, checker, d, crowd=crowd)
            print(f"[{time.monotonic() - t0:7.1f} s] example {i} "
                  f"({'crowd' if crowd else 'batch'}): requests {stats.requests}, "
                  f"supports checked {stats.supports_checked}, vs reference "
                  f"{stats.supports_vs_reference}, violations {len(stats.violations)}",
                  flush=True)
            for v in new:
                print(f"  VIOLATION in example {i} (--seed {args.seed} --start {i} "
                      f"--examples 1): {v}", flush=True)
            i += 1
        print(f"\nwall time {time.monotonic() - t0:.1f} s (server up)")

    if args.server:
        run(args.server.rstrip("/"))
    else:
        from vllm_sampling_mask.tools.demo import serving
        log = os.path.join(tempfile.gettempdir(), f"fuzz-masks-serve-{os.getpid()}.log")
        extra = ["--max-num-seqs", str(SERVER_MAX_NUM_SEQS),
                 "--max-sampling-mask-size", str(SERVER_MAX_MASK_SIZE)]
        print(f"starting vllm serve (log: {log})", flush=True)
        with serving(args.port or free_port(), log, extra=extra, runner="v1") as base:
            run(base)
    print(checker.stats.report())
    if checker.failures:
        import json
        with open(args.failures, "w") as f:
            for failure in checker.failures:
                f.write(json.dumps(failure) + "\n")
        print(f"full request bodies of the violations: {args.failures}")
    return 1 if checker.stats.violations else 0


if __name__ == "__main__":
    sys.exit(main())
