"""The seam contract's entry types: what a patch relies on in upstream vLLM (and Triton).

Plain data, no vLLM import, nothing of `patches`: each patch's record
(`patches.REGISTRY`) holds its entries (`Patch.seams`). Four kinds of entry:

- `Function`: an upstream function or method a patch wraps or calls, with the parameter
  names of the original in order (the wrappers read arguments by position or by name);
- `Name`: a dotted name that must resolve in a module (class, attribute, enum member);
- `Fields`: fields of a dataclass / struct that a patch reads;
- `SourceUses`: text the upstream function's source must still contain (what it sets or
  calls that a patch reads or relies on).

Two consumers: `tests/patches/test_seams.py` checks every entry against the installed vLLM by
importing it, and `python -m vllm_sampling_mask.tools.seam_report PATH` checks them statically
(`ast`) against any vLLM source tree or wheel, without importing it.

Per-release differences are data, not code: every entry holds over a span of the
supported releases (`releases.RELEASES`), `since` one (inclusive) `until` the release
that changed it (exclusive), open-ended by default. When a release changes a seam, the
old entry gets `until=` that release and a new entry with the release's own shape is
added beside it with `since=`; a module the release moved is written `{role}` and read
from the release's profile (`Release.modules`); a version that is not listed is read as
`releases.nearest(version)`. `patches.seam_entries()` picks the entries of one release,
leaving out a patch that is not applied there.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, replace
from typing import Union

from vllm_sampling_mask import releases
from vllm_sampling_mask.releases import Release

__all__ = ["Function", "Name", "Fields", "SourceUses", "Entry", "Since", "applies",
           "resolved", "release_of"]

Since = Union[str, None]


@dataclass(frozen=True)
class _Entry:
    """What every entry has: the upstream `module` and the (dotted) `name` in it, and the
    span of releases it holds over (keywords only, after the kind's own field)."""
    module: str
    name: str
    _: KW_ONLY
    since: Since = None
    until: Since = None


@dataclass(frozen=True)
class Function(_Entry):
    """`module.name` (dotted for methods) exists with exactly these parameter names."""
    params: tuple[str, ...]


@dataclass(frozen=True)
class Name(_Entry):
    """`module.name` (dotted) resolves."""


@dataclass(frozen=True)
class Fields(_Entry):
    """The dataclass (or struct) `module.name` still has these fields."""
    fields: tuple[str, ...]


@dataclass(frozen=True)
class SourceUses(_Entry):
    """The source of `module.name` still contains each of these strings."""
    uses: tuple[str, ...]


Entry = Union[Function, Name, Fields, SourceUses]


def release_of(version: str) -> Release:
    """The profile whose entries describe vLLM `version` (`releases.nearest`: itself,
    or for a release that is not listed, the next port read by `seam_report`, the
    newest listed release not newer than it)."""
    return releases.nearest(version)


def applies(entry: Entry, version: str | None) -> bool:
    """Whether `entry` holds for vLLM `version` ("0.27.1", local suffix ignored;
    None: every entry)."""
    return version is None or releases.within(release_of(version), entry.since, entry.until)


def resolved(entry: Entry, version: str | None) -> Entry:
    """`entry` with its `{role}` module read from `version`'s profile (None: as written)."""
    if version is None or not entry.module.startswith("{"):
        return entry
    return replace(entry, module=releases.resolve(entry.module, release_of(version)))
