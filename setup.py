"""Kept for tools that still call setup.py; all metadata lives in pyproject.toml.

The site hook `vllm_sampling_mask.pth` is added to the wheel by the in-tree
build backend in `_build/backend.py` (setuptools has no option for a file at
the root of site-packages that works for editable installs too).
"""

from setuptools import setup

setup()
