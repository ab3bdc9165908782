"""The docs' tables of patches, written from their records (`patches.REGISTRY`).

`docs/patches.md` has one table of patches per kind, `docs/releases.md` the spans of
the records that hold over part of the supported releases. Each is a block between
two markers in the page, and this module writes it from the records, so a record is
the one place a patch's process, seams, change, span, upstream reference and
remove-when are written:

    python -m vllm_sampling_mask.tools.patch_docs          # rewrite the blocks in place
    python -m vllm_sampling_mask.tools.patch_docs --check  # exit 1 naming a stale block

`tests/tools/test_patch_docs.py` fails while a page's block differs from what the records
give. Plain data in, text out: no vLLM import.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Iterable

from vllm_sampling_mask import releases
from vllm_sampling_mask.patches import REGISTRY, Kind, Patch

__all__ = ["BLOCKS", "render", "replace_block", "stale", "write", "main"]

# the repository: this file is vllm_sampling_mask/tools/patch_docs.py
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = "python -m vllm_sampling_mask.tools.patch_docs"


def _begin(name: str) -> str:
    return f"<!-- generated: {name}, from the patch records ({TOOL}); edit the records -->"


def _end(name: str) -> str:
    return f"<!-- end generated: {name} -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _short(module: str) -> str:
    return module[len("vllm."):] if module.startswith("vllm.") else module


def _applied(record: Patch) -> list[releases.Release]:
    return [r for r in releases.RELEASES if record.applies_to(r)]


def _range(versions: list[str]) -> str:
    """A contiguous run of listed releases as text."""
    if len(versions) == 1:
        return f"{versions[0]} only"
    return f"{versions[0]}-{versions[-1]}"


def span(record: Patch) -> str:
    """The releases a record applies to, in words."""
    if record.since is None and record.until is None:
        return "every release"
    return _range([r.version for r in _applied(record)])


def seam(record: Patch) -> str:
    """The upstream modules whose import applies the patch; a `{role}` target with
    the module each release keeps it in."""
    parts = []
    for target in record.targets:
        if not target.startswith("{"):
            parts.append(f"`{_short(target)}`")
            continue
        runs: list[tuple[str, list[str]]] = []
        for release in _applied(record):
            module = _short(releases.resolve(target, release))
            if runs and runs[-1][0] == module:
                runs[-1][1].append(release.version)
            else:
                runs.append((module, [release.version]))
        if len(runs) == 1:
            parts.append(f"`{runs[0][0]}`")
        else:
            parts.append(f"`{target}`: " + ", ".join(
                f"`{module}` ({_range(versions)})" for module, versions in runs))
    return "; ".join(parts)


def _process(record: Patch) -> str:
    return {"ANY": "any", "API_SERVER": "API server", "ENGINE_CORE": "engine core",
            "WORKER": "worker"}[record.process.name]


def patch_table(kind: Kind) -> str:
    """patches.md's table of the patches of `kind`, in the registry's order. A text
    shared by several records (the feature's upstream PR) is written once, under the
    table, and referred to by a letter."""
    records = [r for r in REGISTRY.values() if r.kind is kind]
    shared: dict[str, str] = {}

    def note(text: str) -> str:
        if sum(1 for r in records if text in (r.upstream, r.remove_when)) < 3:
            return _cell(text)
        if text not in shared:
            shared[text] = f"({chr(ord('a') + len(shared))})"
        return shared[text]

    lines = ["| patch | process | releases | upstream seam | change | upstream reference "
             "| remove when |", "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append("| " + " | ".join((
            r.name, _process(r), span(r), seam(r), _cell(r.change) or "(no `change`)",
            note(r.upstream), note(r.remove_when))) + " |")
    if shared:
        lines.append("")
        lines.extend(f"{letter}: {_cell(text)}  " for text, letter in shared.items())
        lines[-1] = lines[-1].rstrip()
    return "\n".join(lines)


def spans_table() -> str:
    """releases.md's table of the records that hold over part of the releases."""
    lines = ["| record | applied on | upstream reference | remove when |",
             "|---|---|---|---|"]
    for r in REGISTRY.values():
        if r.since is None and r.until is None:
            continue
        bounds = ", ".join(b for b in (r.since and f"since {r.since}",
                                       r.until and f"until {r.until}") if b)
        lines.append(f"| `{r.name}` ({r.kind.value}) | {span(r)} ({bounds}) | "
                     f"{_cell(r.upstream)} | {_cell(r.remove_when)} |")
    return "\n".join(lines)


# page -> block name -> what writes it
BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/patches.md": {f"patches-{kind.value}": (lambda kind=kind: patch_table(kind))
                        for kind in Kind},
    "docs/releases.md": {"record-spans": spans_table},
}


def render(page: str, name: str) -> str:
    return BLOCKS[page][name]()


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the block `name` holding `body`; a ValueError naming the block
    where its markers are missing."""
    begin, end = _begin(name), _end(name)
    start = text.find(begin)
    stop = text.find(end, start + 1) if start >= 0 else -1
    if start < 0 or stop < 0:
        raise ValueError(f"block {name!r}: markers missing; put {begin!r} and "
                         f"{end!r} where the table goes")
    return text[:start] + begin + "\n" + body + "\n" + text[stop:]


def _pages(root: str) -> Iterable[tuple[str, str, str]]:
    """(page, its text now, its text with every block written from the records)."""
    for page, blocks in BLOCKS.items():
        with open(os.path.join(root, page)) as f:
            text = f.read()
        updated = text
        for name in blocks:
            updated = replace_block(updated, name, render(page, name))
        yield page, text, updated


def stale(root: str = ROOT) -> list[str]:
    """The pages whose generated blocks differ from what the records give."""
    return [page for page, text, updated in _pages(root) if text != updated]


def write(root: str = ROOT) -> list[str]:
    """Rewrite the stale pages' blocks; the pages written."""
    written = []
    for page, text, updated in _pages(root):
        if text != updated:
            with open(os.path.join(root, page), "w") as f:
                f.write(updated)
            written.append(page)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=TOOL, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page's block is stale")
    parser.add_argument("--root", default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        pages = stale(args.root)
        for page in pages:
            print(f"{page}: its patch tables differ from the records; run {TOOL}")
        return 1 if pages else 0
    for page in write(args.root):
        print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
