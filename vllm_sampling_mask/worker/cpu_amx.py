"""AMX tile state of this process: does the CPU have AMX, did the kernel grant it, ask.

Linux on x86-64 keeps AMX's tile data (xstate component XTILEDATA, number 18) off for
a process until the process asks for it with `arch_prctl(ARCH_REQ_XCOMP_PERM, 18)`;
the first AMX instruction of a process that did not ask dies with SIGILL. The grant
is process-wide, kept across fork and dropped by exec, and asking again once granted
changes nothing.

Plain code: no vLLM or torch import; the syscall goes through ctypes. Nothing here
raises: an answer the kernel refuses is returned, not thrown.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass

__all__ = ["ARCH_GET_XCOMP_PERM", "ARCH_GET_XCOMP_SUPP", "ARCH_REQ_XCOMP_PERM",
           "XFEATURE_XTILEDATA", "TileRequest", "cpu_flags", "cpu_advertises_amx",
           "linux_x86_64", "request_tile_data", "tile_data_permitted",
           "tile_data_supported"]

SYS_ARCH_PRCTL = 158           # x86-64 syscall number of arch_prctl
ARCH_GET_XCOMP_SUPP = 0x1021   # the xstate components the kernel and CPU support
ARCH_GET_XCOMP_PERM = 0x1022   # the components this process may use
ARCH_REQ_XCOMP_PERM = 0x1023   # ask for one component
XFEATURE_XTILEDATA = 18        # AMX tile data


def linux_x86_64() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first processor's feature flags in `path` (empty when it cannot be read)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_advertises_amx(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU lists AMX tiles (`amx_tile`) among its flags."""
    return "amx_tile" in (cpu_flags() if flags is None else flags)


def _arch_prctl(code: int, arg) -> tuple[int, int]:
    """(return value, errno) of arch_prctl(code, arg); (-1, ENOSYS) off Linux x86-64."""
    if not linux_x86_64():
        return -1, getattr(os, "ENOSYS", 38)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
        ctypes.set_errno(0)
        rc = syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(code), arg)
        return rc, ctypes.get_errno() if rc != 0 else 0
    except (OSError, AttributeError):      # no libc `syscall` to call
        return -1, getattr(os, "ENOSYS", 38)


def _xstate_mask(code: int) -> int | None:
    mask = ctypes.c_ulong(0)
    rc, _ = _arch_prctl(code, ctypes.byref(mask))
    return mask.value if rc == 0 else None


def tile_data_permitted() -> bool | None:
    """Whether this process may use AMX tile data (None: the kernel does not say:
    not Linux x86-64, or a kernel without these requests, before 5.16)."""
    mask = _xstate_mask(ARCH_GET_XCOMP_PERM)
    return None if mask is None else bool(mask >> XFEATURE_XTILEDATA & 1)


def tile_data_supported() -> bool | None:
    """Whether the kernel and CPU support AMX tile data (None: the kernel does not say)."""
    mask = _xstate_mask(ARCH_GET_XCOMP_SUPP)
    return None if mask is None else bool(mask >> XFEATURE_XTILEDATA & 1)


@dataclass(frozen=True)
class TileRequest:
    """What `request_tile_data` did: `outcome` is one of
    "not-x86-64-linux", "no-amx", "already-granted", "granted", "refused"."""
    outcome: str
    detail: str = ""

    @property
    def permitted(self) -> bool:
        return self.outcome in ("already-granted", "granted")


def request_tile_data(amx_advertised: bool | None = None) -> TileRequest:
    """Ask the kernel for AMX tile data for this process where the CPU has AMX.

    `amx_advertised`: whether the CPU has AMX as the caller knows it (None: read
    /proc/cpuinfo). A no-op off Linux x86-64, on a CPU without AMX, and once granted;
    never raises (a refusal comes back as outcome "refused" with the kernel's reason).
    """
    if not linux_x86_64():
        return TileRequest("not-x86-64-linux", f"{sys.platform} {platform.machine()}")
    if not (cpu_advertises_amx() if amx_advertised is None else amx_advertised):
        return TileRequest("no-amx")
    if tile_data_permitted():
        return TileRequest("already-granted")
    rc, err = _arch_prctl(ARCH_REQ_XCOMP_PERM, ctypes.c_ulong(XFEATURE_XTILEDATA))
    if rc == 0 and tile_data_permitted() is not False:
        return TileRequest("granted")
    reason = os.strerror(err) if err else "the grant did not show in ARCH_GET_XCOMP_PERM"
    return TileRequest("refused", f"arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA): {reason}")
