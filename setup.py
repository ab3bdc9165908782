"""The compiled part of the build; all other metadata lives in pyproject.toml.

`vllm_sampling_mask._packed_native` is the packed wire's encoder in C
(`packed_wire` uses it when it is built and its own numpy and plain-Python
encoders, which write the same bytes, when it is not). It is optional: without a
C compiler the install goes on without it.

The site hook `vllm_sampling_mask.pth` is added to the wheel by the in-tree
build backend in `_build/backend.py` (setuptools has no option for a file at
the root of site-packages that works for editable installs too).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vllm_sampling_mask._packed_native",
                             ["vllm_sampling_mask/_packed_native.c"], optional=True)])
