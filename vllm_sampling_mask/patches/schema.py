"""What a patch record holds: `Patch`, its `Kind` and `Process`, and the constructors of
its seam entries (the entry types are `patches.seams`').

Plain data, no vLLM: each hop's `records` module (`patches/<hop>/records.py`) writes its
patches' records with these; `patches.REGISTRY` lists them all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from vllm_sampling_mask import releases
from vllm_sampling_mask.patches.seams import (Entry, Fields, Function, Name, Since,
                                              SourceUses)
from vllm_sampling_mask.releases import Release

__all__ = ["Kind", "Process", "Patch", "function_entry", "name_entry", "fields_entry",
           "source_entry"]

# the package that holds the patch modules (`Patch.module`)
PACKAGE = "vllm_sampling_mask.patches"


class Kind(enum.Enum):
    FEATURE = "feature"          # the sampling mask itself
    FIX = "fixes"                # an upstream bug, fixed with the flag on or off
    ENABLER = "enablers"         # CPU / Triton interpreter; only with TRITON_INTERPRET=1
    DIAGNOSTIC = "diagnostics"   # only with VLLM_SAMPLING_MASK_DEBUG_STATE=1


class Process(enum.Enum):
    ANY = "any process that imports vLLM"
    API_SERVER = "API server / LLM front end"
    ENGINE_CORE = "engine core"
    WORKER = "worker"


# where a patch acts: its folder under patches/ (`Patch.hop`)
_HOPS = {Process.ANY: "common", Process.API_SERVER: "frontend",
         Process.ENGINE_CORE: "engine", Process.WORKER: "worker"}


@dataclass(frozen=True)
class Patch:
    name: str
    targets: tuple[str, ...]     # upstream module(s) whose import applies it; `{role}`
    process: Process
    kind: Kind
    upstream: str                # the upstream issue/PR, or what would be filed
    remove_when: str
    since: str | None = None     # the first release it is applied on (None: the oldest)
    until: str | None = None     # the release that no longer needs it (None: none yet)
    after: tuple[str, ...] = ()  # patches whose wrappers this one wraps (applied first)
    change: str = ""             # what it changes for the user (docs/patches.md's tables)
    seams: tuple[Entry, ...] = ()  # what it relies on upstream, every release's entries

    @property
    def hop(self) -> str:
        """The folder of `patches/` it lives in: where it acts (`Process`; an API-server
        patch of the HTTP server's modules is in `http`)."""
        if self.process is Process.API_SERVER and any(
                t.startswith(("{", "vllm.entrypoints", "starlette")) for t in self.targets):
            return "http"
        return _HOPS[self.process]

    @property
    def module(self) -> str:
        return f"{PACKAGE}.{self.hop}.{self.kind.value}.{self.name}"

    @property
    def patches_vllm(self) -> bool:
        return any(t.startswith(("vllm", "{")) for t in self.targets)

    def applies_to(self, release: Release) -> bool:
        return releases.within(release, self.since, self.until)

    def targets_for(self, release: Release) -> tuple[str, ...]:
        """The upstream modules of the seam in `release`."""
        return tuple(releases.resolve(t, release) for t in self.targets)

    @property
    def hook_targets(self) -> tuple[str, ...]:
        """Every module whose import may apply it, over the releases it applies to
        (the hooks are installed before the vLLM release is known)."""
        return tuple(dict.fromkeys(
            self.targets_for(r)[0] for r in releases.RELEASES if self.applies_to(r)))


# The seam entries of a record (`Patch.seams`), written with their strings as arguments;
# `since` / `until` bound the releases an entry holds over (`patches.seams`).
def function_entry(module: str, name: str, *params: str, since: Since = None,
                   until: Since = None) -> Function:
    return Function(module, name, tuple(params), since=since, until=until)


def name_entry(module: str, name: str, since: Since = None, until: Since = None) -> Name:
    return Name(module, name, since=since, until=until)


def fields_entry(module: str, name: str, *fields: str, since: Since = None,
                 until: Since = None) -> Fields:
    return Fields(module, name, tuple(fields), since=since, until=until)


def source_entry(module: str, name: str, *uses: str, since: Since = None,
                 until: Since = None) -> SourceUses:
    return SourceUses(module, name, tuple(uses), since=since, until=until)
