"""The GPU check in one script: CUDA tests, the interpreted-kernel tests compiled
on the device, and the extraction benchmark. Needs torch and Triton (and pytest),
not vLLM; runs in well under 5 minutes on one GPU.

    python scripts/gpu_check.py
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_gpu.py", "tests/test_extraction_kernel.py", "tests/test_mask_core.py"],
        cwd=ROOT, env=env)
    bench = subprocess.run([sys.executable, "benchmarks/bench_extraction.py"],
                           cwd=ROOT, env=env)
    return tests.returncode or bench.returncode


if __name__ == "__main__":
    sys.exit(main())
