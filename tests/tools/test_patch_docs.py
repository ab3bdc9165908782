"""The docs' patch tables are written from the patch records (`patch_docs`): patches.md's
table per kind and releases.md's record spans say what the records say, and go stale,
failing here, as soon as a record changes without `python -m
vllm_sampling_mask.tools.patch_docs` being run."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import pytest

from vllm_sampling_mask.tools import patch_docs
from vllm_sampling_mask.patches import REGISTRY

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_docs_tables_are_what_the_records_say():
    assert patch_docs.stale(ROOT) == [], (
        "a record changed without its docs: run python -m vllm_sampling_mask.tools.patch_docs")


def _with(name: str, monkeypatch, **changes) -> None:
    monkeypatch.setitem(REGISTRY, name, dataclasses.replace(REGISTRY[name], **changes))


def test_a_changed_record_makes_its_tables_stale(monkeypatch):
    # what a patch changes: patches.md's row
    _with("top_p_one_rows", monkeypatch, change="something else")
    assert patch_docs.stale(ROOT) == ["docs/patches.md"]
    monkeypatch.undo()
    # a span: both pages (the patch table's releases column, the spans table's row)
    _with("cpu_seeded_sampling", monkeypatch, until="0.30.0")
    assert patch_docs.stale(ROOT) == ["docs/patches.md", "docs/releases.md"]
    assert "0.24.0-0.29.0 (until 0.30.0)" in patch_docs.spans_table()
    monkeypatch.undo()
    assert patch_docs.stale(ROOT) == []


def test_the_check_fails_on_a_stale_page_and_the_tool_rewrites_it(tmp_path):
    for page in patch_docs.BLOCKS:
        os.makedirs(tmp_path / os.path.dirname(page), exist_ok=True)
        shutil.copy(os.path.join(ROOT, page), tmp_path / page)
    table_page = tmp_path / "docs" / "patches.md"
    text = table_page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| top_p_one_rows |"))
    table_page.write_text(text.replace(row, row.replace("worker", "engine core", 1)))
    tool = [sys.executable, "-m", "vllm_sampling_mask.tools.patch_docs", "--root", str(tmp_path)]
    check = subprocess.run([*tool, "--check"], capture_output=True, text=True)
    assert check.returncode == 1 and "docs/patches.md" in check.stdout, check.stdout
    assert subprocess.run(tool, capture_output=True, text=True).returncode == 0
    assert table_page.read_text() == text
    assert subprocess.run([*tool, "--check"], capture_output=True).returncode == 0


def test_a_page_without_its_markers_is_named():
    with pytest.raises(ValueError, match="patches-fixes.*markers missing"):
        patch_docs.replace_block("# a page without a table\n", "patches-fixes", "| x |")


def test_a_role_target_shows_each_releases_module():
    seam = patch_docs.seam(REGISTRY["rl_routes_auth"])
    assert seam.startswith("`{auth}`: `entrypoints.serve.utils.server_utils` (0.24.0-")
    assert "`entrypoints.serve.middleware.authenticate` (0.29.0-" in seam
    assert patch_docs.span(REGISTRY["logit_bias_keys"]) == "0.24.0 only"


def test_the_tool_finds_this_repository_without_root():
    # the default root, as the docs print the command; exit 0 while the pages are current
    run = subprocess.run([sys.executable, "-m", "vllm_sampling_mask.tools.patch_docs", "--check"],
                         capture_output=True, text=True, cwd=ROOT)
    assert (run.returncode, run.stderr) == (0, "")
