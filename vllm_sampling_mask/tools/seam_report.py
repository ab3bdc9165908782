"""Which seams of the patch records a vLLM source tree still has, read without importing it.

    python -m vllm_sampling_mask.tools.seam_report PATH [--markdown] [--version X.Y.Z]

PATH is a vLLM wheel (`.whl`, read through `zipfile`), a directory that holds the `vllm`
package (site-packages, an unpacked wheel, a checkout), or the `vllm` package directory
itself; without PATH, the installed vLLM's directory (found without importing it).
Every file is parsed with `ast`; nothing of the tree is executed, so a CUDA-only wheel
can be read on a CPU host.

For every seam entry that applies to the tree's version, one status:

- `present`: where the entry says, with the same parameters / fields / source text;
- `changed`: where the entry says, but the parameters, fields or source text differ
  (the detail says what);
- `moved`: not where the entry says, but a class or function of that name is defined in
  another module (the detail names it, and what differs there);
- `gone`: nothing of that name in the tree;
- `unchecked`: outside the vLLM tree (Triton), or made at run time (`__struct_fields__`).

Exit status: 0 when every checked entry is present, 1 otherwise, 2 on a bad PATH.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shlex
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_sampling_mask.patches import seams as _seams
from vllm_sampling_mask.patches import REGISTRY, applied_on

PRESENT, CHANGED, MOVED, GONE, UNCHECKED = "present", "changed", "moved", "gone", "unchecked"
STATUSES = (PRESENT, CHANGED, MOVED, GONE, UNCHECKED)
# made by the class machinery at run time, never spelled in the source
_RUNTIME_NAMES = {"__struct_fields__", "__dataclass_fields__", "__annotations__"}


class SourceTree:
    """The `.py` files of a vLLM tree, by module name, parsed on demand."""

    def __init__(self, files: dict[str, str], label: str):
        self.files = files           # module name -> source text
        self.label = label
        self._ast: dict[str, ast.Module | None] = {}
        self._index: dict[str, list[tuple[str, str]]] | None = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> "SourceTree":
        path = Path(path)
        files: dict[str, str] = {}
        if path.is_file() and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    if name.startswith("vllm/") and name.endswith(".py"):
                        files[_module_of(name)] = zf.read(name).decode("utf-8", "replace")
        elif path.is_dir():
            root = path if (path / "vllm").is_dir() else path.parent
            if not (root / "vllm").is_dir():
                raise FileNotFoundError(f"{path}: no `vllm` package directory in it")
            for file in (root / "vllm").rglob("*.py"):
                rel = file.relative_to(root).as_posix()
                files[_module_of(rel)] = file.read_text("utf-8", "replace")
        else:
            raise FileNotFoundError(f"{path}: neither a wheel nor a directory")
        if not files:
            raise FileNotFoundError(f"{path}: no vllm/*.py files in it")
        return cls(files, str(path))

    def version(self) -> str | None:
        """`__version__` as the tree spells it (`vllm/_version.py`), local part kept."""
        for module in ("vllm._version", "vllm.version"):
            tree = self.module(module)
            if tree is None:
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                    if names & {"__version__", "version"} and isinstance(
                            node.value.value, str):
                        return node.value.value
        return None

    def module(self, name: str) -> ast.Module | None:
        if name not in self._ast:
            source = self.files.get(name)
            try:
                self._ast[name] = None if source is None else ast.parse(source)
            except SyntaxError:
                self._ast[name] = None
        return self._ast[name]

    def index(self) -> dict[str, list[tuple[str, str]]]:
        """Bare name -> [(module, qualified name)] of every class and function defined."""
        if self._index is None:
            index: dict[str, list[tuple[str, str]]] = {}
            for module in sorted(self.files):
                tree = self.module(module)
                if tree is None:
                    continue
                for qual, _node in _definitions(tree.body, ""):
                    index.setdefault(qual.rsplit(".", 1)[-1], []).append((module, qual))
            self._index = index
        return self._index

    def resolve(self, module: str, dotted: str, _depth: int = 0):
        """The AST node `module.dotted` names (following imports), its module and
        qualified name there; None when it cannot be found."""
        tree = self.module(module)
        if tree is None or _depth > 8:
            return None
        first, _, rest = dotted.partition(".")
        node = _lookup(tree.body, first)
        if node is None:
            # `from pkg import mod` / `from x import Name` / `import x as y`
            target = _imported(tree.body, first, module, self.files)
            if target is None:
                return None
            mod, name = target
            if name is None:       # a module
                return self.resolve(mod, rest, _depth + 1) if rest else (
                    self.module(mod), mod, "")
            return self.resolve(mod, f"{name}.{rest}" if rest else name, _depth + 1)
        qual = first
        for part in filter(None, rest.split(".")):
            if not isinstance(node, ast.ClassDef):
                return None
            child = _lookup(node.body, part)
            if child is None:
                if part in _RUNTIME_NAMES:
                    return ("runtime", module, f"{qual}.{part}")
                # inherited: the first base (in order) found in the tree that has it
                return self._inherited(node, module, part, _depth)
            node, qual = child, f"{qual}.{part}"
        return node, module, qual

    def _inherited(self, cls: ast.ClassDef, module: str, member: str, depth: int):
        for base in cls.bases:
            dotted = ast.unparse(base).split("[")[0]
            found = self.resolve(module, f"{dotted}.{member}", depth + 1)
            if found is not None:
                return found
        return None


def _module_of(relpath: str) -> str:
    mod = relpath[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _definitions(body, prefix):
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            qual = f"{prefix}{node.name}"
            yield qual, node
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node.body, qual + ".")


def _flat(body):
    """Statements of a body, with those under module-level `if`/`try` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _flat(node.body)
            yield from _flat(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _flat(node.body)
            yield from _flat(node.orelse)
            for handler in node.handlers:
                yield from _flat(handler.body)


def _lookup(body, name):
    """The last statement of `body` that defines `name` (def, class, assignment)."""
    found = None
    for node in _flat(body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                found = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ([target] if not isinstance(target, ast.Tuple) else target.elts):
                    if isinstance(t, ast.Name) and t.id == name:
                        found = node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
    return found


def _imported(body, name, module, files):
    """(module, name or None for a module) that `name` is imported from in `body`."""
    for node in _flat(body):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if module in files and _is_package(module, files) else \
                    module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        return sub, None
                    return base, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    return alias.name, None
                if alias.asname is None and alias.name.split(".")[0] == name:
                    return name, None
    return None


def _is_package(module: str, files) -> bool:
    return any(other.startswith(module + ".") for other in files)


def _params(node) -> list[str]:
    """Parameter names as `inspect.signature` gives them for the attribute: a
    classmethod's first parameter is bound, so it is left out."""
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if any(ast.unparse(d) == "classmethod" for d in node.decorator_list):
        names = names[1:]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names


def _is_classvar(annotation) -> bool:
    text = ast.unparse(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "InitVar"))


def _fields(tree: SourceTree, node: ast.ClassDef, module: str, _depth=0) -> set[str]:
    """Annotated class-body names of `node` and of its bases found in the tree."""
    have = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name) and not _is_classvar(n.annotation)}
    if _depth < 8:
        for base in node.bases:
            try:
                dotted = ast.unparse(base).split("[")[0]
            except Exception:  # noqa: BLE001 - an odd base is simply not followed
                continue
            found = tree.resolve(module, dotted)
            if found and isinstance(found[0], ast.ClassDef):
                have |= _fields(tree, found[0], found[1], _depth + 1)
    return have


def _diff(want: list[str], got: list[str]) -> str:
    parts = []
    added = [p for p in got if p not in want]
    removed = [p for p in want if p not in got]
    if removed:
        parts.append("lost " + ", ".join(removed))
    if added:
        parts.append("added " + ", ".join(added))
    if not parts:
        parts.append("order now (" + ", ".join(got) + ")")
    return "; ".join(parts)


@dataclass(frozen=True)
class Finding:
    patch: str
    kind: str
    seam: str          # module.name as the entry says
    status: str
    detail: str = ""


def _check_at(tree: SourceTree, entry, found) -> tuple[str, str]:
    """(status among present/changed, detail) of `entry` against the node `found`."""
    node, module, qual = found
    if node == "runtime":
        return UNCHECKED, "made at run time"
    if isinstance(entry, _seams.Name):
        return PRESENT, ""
    if isinstance(entry, _seams.Function):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return CHANGED, f"no longer a function ({type(node).__name__})"
        got = _params(node)
        if got == list(entry.params):
            return PRESENT, ""
        return CHANGED, "parameters: " + _diff(list(entry.params), got)
    if isinstance(entry, _seams.Fields):
        if not isinstance(node, ast.ClassDef):
            return CHANGED, "no longer a class"
        missing = [f for f in entry.fields if f not in _fields(tree, node, module)]
        return (CHANGED, "lost fields " + ", ".join(missing)) if missing else (PRESENT, "")
    if isinstance(entry, _seams.SourceUses):
        source = ast.get_source_segment(tree.files[module], node) or ""
        missing = [u for u in entry.uses if u not in source]
        if missing:
            return CHANGED, "no longer has " + "; ".join(repr(u) for u in missing)
        return PRESENT, ""
    raise TypeError(entry)


def check(tree: SourceTree, patch: str, entry) -> Finding:
    kind = type(entry).__name__
    seam = f"{entry.module}.{entry.name}"
    if not entry.module.split(".")[0] == "vllm":
        return Finding(patch, kind, seam, UNCHECKED, "not part of vLLM's tree")
    found = tree.resolve(entry.module, entry.name)
    if found is not None:
        status, detail = _check_at(tree, entry, found)
        if found[1] != entry.module and status != UNCHECKED:
            where = f"re-exported from {found[1]}.{found[2]}"
            detail = f"{where}; {detail}" if detail else where
        return Finding(patch, kind, seam, status, detail)
    # not there: is a top-level class or function of that name defined elsewhere
    # (for `Cls.member`: a class `Cls` that has the member, itself or by a base)?
    owner, _, member = entry.name.partition(".")
    owners = [(m, q) for m, q in tree.index().get(owner, []) if q == owner]
    candidates = [r for r in (tree.resolve(m, entry.name) for m, _ in owners) if r]
    if not candidates:
        if owners:
            where = ", ".join(f"{m}.{q}" for m, q in owners[:3])
            return Finding(patch, kind, seam, GONE, f"{owner} is at {where}, without {member}")
        reason = "module gone" if tree.module(entry.module) is None else \
            f"{entry.name} not in {entry.module}"
        return Finding(patch, kind, seam, GONE, reason)
    notes = []
    for found in candidates[:3]:
        status, detail = _check_at(tree, entry, found)
        notes.append(f"{found[1]}.{found[2]}" + (f" ({detail})" if detail else ""))
    more = f" and {len(candidates) - 3} more" if len(candidates) > 3 else ""
    return Finding(patch, kind, seam, MOVED, "now " + "; ".join(notes) + more)


def seam_table() -> dict[str, tuple]:
    """Every patch's seam entries (its record's `seams`), by patch name."""
    return {name: record.seams for name, record in REGISTRY.items()}


def report(tree: SourceTree, version: str | None = None,
           table: dict[str, tuple] | None = None) -> list[Finding]:
    """A finding per entry of `table` (default `seam_table()`: every record's) that applies to `version`
    (default: the tree's own)."""
    version = version or tree.version()
    table = seam_table() if table is None else table
    return [check(tree, patch, _seams.resolved(entry, version))
            for patch, rows in table.items() if applied_on(patch, version)
            for entry in rows if _seams.applies(entry, version)]


def installed_vllm_dir() -> str | None:
    """The installed `vllm` package's directory, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(findings: list[Finding], label: str, version: str | None, markdown: bool,
           command: str) -> str:
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if not markdown:
        lines = [f"seams of vLLM {version or '?'} in {label}: {summary}"]
        for f in findings:
            lines.append(f"{f.status:9} {f.patch:24} {f.kind:10} {f.seam}"
                         + (f"  -- {f.detail}" if f.detail else ""))
        return "\n".join(lines) + "\n"
    lines = [f"# Seams in vLLM {version or '?'}", "",
             "Generated, do not edit by hand:", "", "```", command, "```", "",
             f"Read statically from `{os.path.basename(label)}`: {len(findings)} seam entries "
             f"of the patch records (`patches.REGISTRY`), {summary}.", "",
             "Statuses: `present` (as declared), `changed` (same place, other parameters,"
             " fields or source), `moved` (defined under another module), `gone`,"
             " `unchecked` (outside vLLM's tree or made at run time).", ""]
    by_patch: dict[str, list[Finding]] = {}
    for f in findings:
        by_patch.setdefault(f.patch, []).append(f)
    lines += ["## Per patch", "", "| patch | present | changed | moved | gone | unchecked |",
              "|---|---|---|---|---|---|"]
    for patch, rows in by_patch.items():
        lines.append(f"| {patch} | " + " | ".join(
            str(sum(r.status == s for r in rows)) for s in STATUSES) + " |")
    lines += ["", "## Every entry", "", "| patch | status | kind | seam | detail |",
              "|---|---|---|---|---|"]
    for f in findings:
        lines.append(f"| {f.patch} | {f.status} | {f.kind} | `{f.seam}` | "
                     f"{_cell(f.detail)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_sampling_mask.tools.seam_report",
        description="List which seams a vLLM source tree or wheel still has (no import).")
    parser.add_argument("path", nargs="?", help="a vLLM .whl, or a directory holding `vllm/`"
                        " (default: the installed vLLM)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown report")
    parser.add_argument("--version", help="check the entries of this vLLM version "
                        "(default: the tree's own)")
    args = parser.parse_args(argv)
    path = args.path or installed_vllm_dir()
    if path is None:
        print("seam_report: no PATH given and no vLLM installed", file=sys.stderr)
        return 2
    try:
        tree = SourceTree.open(path)
    except FileNotFoundError as exc:
        print(f"seam_report: {exc}", file=sys.stderr)
        return 2
    version = args.version or tree.version()
    findings = report(tree, version)
    shown = [a if a != args.path else os.path.basename(a) for a in (argv or sys.argv[1:])]
    command = "python -m vllm_sampling_mask.tools.seam_report " + " ".join(
        shlex.quote(a) for a in shown)
    sys.stdout.write(render(findings, tree.label, version, args.markdown, command.strip()))
    return 0 if all(f.status in (PRESENT, UNCHECKED) for f in findings) else 1


if __name__ == "__main__":
    sys.exit(main())
