"""The GPU check in one script: CUDA tests, the interpreted-kernel tests compiled
on the device, and the extraction benchmark (with vLLM 0.33's kernel side by
side when `--upstream` names its wheel). Needs torch and Triton (and pytest),
not vLLM; runs in well under 4 minutes on one GPU.

    python scripts/gpu_check.py --upstream /path/to/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
"""

import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default=None,
                    help="vLLM 0.33.0 wheel (or its output.py) for the side-by-side column")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/worker/test_gpu.py", "tests/worker/test_extraction_kernel.py", "tests/worker/test_mask_core.py"],
        cwd=ROOT, env=env)
    bench = [sys.executable, "benchmarks/bench_extraction.py"]
    if args.upstream:
        bench += ["--upstream", args.upstream]
    done = subprocess.run(bench, cwd=ROOT, env=env)
    return tests.returncode or done.returncode


if __name__ == "__main__":
    sys.exit(main())
