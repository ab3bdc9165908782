"""`seam_report`: the seam contract checked statically against a vLLM source tree.

Small synthetic trees (as directories and as a wheel) give each status for a reason the
test names; one run over the installed vLLM's own files finds every seam present.
"""

from __future__ import annotations

import textwrap
import zipfile

import pytest

from vllm_sampling_mask.tools import seam_report
from vllm_sampling_mask.tools.seam_report import GONE, MOVED, PRESENT, CHANGED, UNCHECKED
from vllm_sampling_mask.patches.seams import Fields, Function, Name, SourceUses

BASE = {
    "vllm/__init__.py": "",
    "vllm/_version.py": "__version__ = version = '9.9.9'\n",
    "vllm/engine/__init__.py": "",
    "vllm/engine/core.py": """
        from dataclasses import dataclass
        from typing import ClassVar

        class Base:
            def create_error_response(self, message):
                return message

        @dataclass
        class Output(object):
            req_ids: list
            sampled: list
            counter: ClassVar[int] = 0

        @dataclass
        class RichOutput(Output):
            mask: list | None = None

        class Engine(Base):
            def __init__(self, config):
                self.sampler = make_sampler(config)
                self.requests = {}

            def step(self, scheduler_output, model_output):
                return scheduler_output

            @classmethod
            def from_config(cls, config, *args, log_stats=False, **kwargs):
                return cls(config)

        def run_in_loop(loop, function, *args):
            return function(*args)
        """,
    # re-exports, as vLLM's packages do
    "vllm/engine/api.py": """
        from vllm.engine.core import Engine
        from .core import run_in_loop as run
        from . import core
        """,
}

ENTRIES = {
    "step": (Function("vllm.engine.core", "Engine.step",
                      ("self", "scheduler_output", "model_output")),),
    "factory": (Function("vllm.engine.core", "Engine.from_config",
                         ("config", "args", "log_stats", "kwargs")),),
    "loop": (Function("vllm.engine.core", "run_in_loop", ("loop", "function", "args")),),
    "names": (Name("vllm.engine.api", "Engine"),
              Name("vllm.engine.api", "run"),
              Name("vllm.engine.api", "core.Output"),
              Name("vllm.engine.core", "Engine.create_error_response")),
    "fields": (Fields("vllm.engine.core", "RichOutput", ("req_ids", "sampled", "mask")),),
    "uses": (SourceUses("vllm.engine.core", "Engine.__init__",
                        ("self.sampler = make_sampler(", "self.requests")),),
}


def _write(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _findings(root, entries=ENTRIES, version=None):
    tree = seam_report.SourceTree.open(root)
    return {(f.patch, f.seam): f for f in seam_report.report(tree, version, entries)}


def _status(findings):
    return {key: f.status for key, f in findings.items()}


def test_an_unchanged_tree_has_every_seam_present(tmp_path):
    found = _findings(_write(tmp_path, BASE))
    assert set(_status(found).values()) == {PRESENT}, found
    assert len(found) == sum(len(rows) for rows in ENTRIES.values())


def test_a_renamed_parameter_is_a_change_that_names_both_names(tmp_path):
    files = dict(BASE)
    files["vllm/engine/core.py"] = BASE["vllm/engine/core.py"].replace(
        "def step(self, scheduler_output, model_output)",
        "def step(self, scheduler_output, runner_output)")
    found = _findings(_write(tmp_path, files))
    step = found[("step", "vllm.engine.core.Engine.step")]
    assert step.status == CHANGED
    assert "lost model_output" in step.detail and "added runner_output" in step.detail
    others = {k: s for k, s in _status(found).items() if k[0] != "step"}
    assert set(others.values()) == {PRESENT}


def test_reordered_parameters_are_a_change(tmp_path):
    files = dict(BASE)
    files["vllm/engine/core.py"] = BASE["vllm/engine/core.py"].replace(
        "def run_in_loop(loop, function, *args)", "def run_in_loop(function, loop, *args)")
    found = _findings(_write(tmp_path, files))
    loop = found[("loop", "vllm.engine.core.run_in_loop")]
    assert loop.status == CHANGED and "order now (function, loop, args)" in loop.detail


def test_a_class_moved_to_another_module_is_found_there(tmp_path):
    files = dict(BASE)
    core = BASE["vllm/engine/core.py"]
    start = core.index("        class Engine(Base):")
    end = core.index("        def run_in_loop")
    files["vllm/engine/core.py"] = core[:start] + core[end:]
    files["vllm/engine/api.py"] = "from . import core\n"
    files["vllm/serve/runner.py"] = ("from vllm.engine.core import Base\n"
                                     + textwrap.dedent(core[start:end]).replace(
                                         "model_output", "model_runner_output"))
    found = _findings(_write(tmp_path, files))
    step = found[("step", "vllm.engine.core.Engine.step")]
    assert step.status == MOVED
    assert "vllm.serve.runner.Engine.step" in step.detail
    assert "added model_runner_output" in step.detail
    factory = found[("factory", "vllm.engine.core.Engine.from_config")]
    assert factory.status == MOVED and "(" not in factory.detail  # same parameters there
    assert found[("uses", "vllm.engine.core.Engine.__init__")].status == MOVED
    assert found[("names", "vllm.engine.api.Engine")].status == MOVED
    # a member found only by following the moved class's base
    assert found[("names", "vllm.engine.core.Engine.create_error_response")].status == MOVED


def test_a_removed_function_or_field_or_text_is_reported_as_such(tmp_path):
    files = dict(BASE)
    files["vllm/engine/core.py"] = (
        BASE["vllm/engine/core.py"]
        .replace("def run_in_loop(loop, function, *args):\n            return function(*args)",
                 "")
        .replace("mask: list | None = None", "support: list | None = None")
        .replace("self.requests = {}", "self.pending = {}")
        .replace("def create_error_response(self, message):", "def error(self, message):"))
    files["vllm/engine/api.py"] = "from vllm.engine.core import Engine\n"
    found = _findings(_write(tmp_path, files))
    assert found[("loop", "vllm.engine.core.run_in_loop")].status == GONE
    assert found[("names", "vllm.engine.api.run")].status == GONE
    rich = found[("fields", "vllm.engine.core.RichOutput")]
    assert rich.status == CHANGED and rich.detail == "lost fields mask"
    uses = found[("uses", "vllm.engine.core.Engine.__init__")]
    assert uses.status == CHANGED and "'self.requests'" in uses.detail
    err = found[("names", "vllm.engine.core.Engine.create_error_response")]
    assert err.status == GONE and "without create_error_response" in err.detail


def test_a_wheel_is_read_without_unpacking_and_gives_the_same_findings(tmp_path):
    root = _write(tmp_path / "tree", BASE)
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, text in BASE.items():
            zf.writestr(rel, textwrap.dedent(text))
        zf.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\n")
    tree = seam_report.SourceTree.open(wheel)
    assert tree.version() == "9.9.9"
    assert _status(_findings(wheel)) == _status(_findings(root))


def test_entries_follow_the_span_they_name(tmp_path):
    from vllm_sampling_mask import SUPPORTED_VLLM

    entries = {"step": (
        Function("vllm.engine.core", "Engine.step", ("self", "old_name"),
                 until=SUPPORTED_VLLM[1]),
        Function("vllm.engine.core", "Engine.step",
                 ("self", "scheduler_output", "model_output"),
                 since=SUPPORTED_VLLM[1]))}
    root = _write(tmp_path, BASE)
    # the tree's 9.9.9 is no supported release: it is read as the newest one (a port
    # starts from there)
    assert _status(_findings(root, entries)) == {
        ("step", "vllm.engine.core.Engine.step"): PRESENT}
    old = _findings(root, entries, version=SUPPORTED_VLLM[0] + "+cpu")   # the oldest
    assert [f.status for f in old.values()] == [CHANGED]


def test_the_command_writes_markdown_with_itself_on_top_and_fails_on_a_moved_seam(
        tmp_path, capsys, monkeypatch):
    root = _write(tmp_path, BASE)
    monkeypatch.setattr(seam_report, "seam_table", lambda: {
        "loop": ENTRIES["loop"], "gone": (Name("vllm.engine.core", "Nothing"),)})
    rc = seam_report.main([str(root), "--markdown"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "python -m vllm_sampling_mask.tools.seam_report" in out.split("## Per patch")[0]
    assert "| loop | present |" in out and "| gone | gone |" in out
    monkeypatch.setattr(seam_report, "seam_table", lambda: {"loop": ENTRIES["loop"]})
    assert seam_report.main([str(root)]) == 0
    assert seam_report.main([str(tmp_path / "missing")]) == 2


def test_every_seam_is_present_in_the_installed_vllm_source():
    where = seam_report.installed_vllm_dir()
    if where is None:
        pytest.skip("no vLLM installed: nothing to read")
    tree = seam_report.SourceTree.open(where)
    findings = seam_report.report(tree)
    assert findings and tree.version() is not None
    wrong = [f for f in findings if f.status not in (PRESENT, UNCHECKED)]
    assert not wrong, "\n".join(f"{f.patch} {f.seam}: {f.status} {f.detail}" for f in wrong)
    # unchecked only where a static read cannot tell: Triton's and Starlette's files,
    # run-time names
    unchecked = {f.seam for f in findings if f.status == UNCHECKED}
    assert all(s.startswith(("triton.", "starlette.")) or s.endswith("__struct_fields__")
               for s in unchecked), unchecked
