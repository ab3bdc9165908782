"""The compiled part of the build; all other metadata lives in pyproject.toml.

Two small C extensions, each optional (without a C compiler the install goes on
without them, and the modules that use them fall back to their own numpy code,
which gives the same results):
- `vllm_sampling_mask._packed_native`, the packed wire's encoder (`packed_wire`);
- `vllm_sampling_mask._supports_native`, a CPU host's supports in one pass over
  the logits (`extraction.extract_on_host`).

The site hook `vllm_sampling_mask.pth` is added to the wheel by the in-tree
build backend in `_build/backend.py` (setuptools has no option for a file at
the root of site-packages that works for editable installs too).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension(f"vllm_sampling_mask.{name}", [f"vllm_sampling_mask/{name}.c"],
              depends=["vllm_sampling_mask/_native_buffer.h"], optional=True)
    for name in ("_packed_native", "_supports_native")])
