"""benchmarks/train_effect.py --quick: the experiment's pipeline runs end to end.

It runs every arm for 2 steps (length 16, seed 0) in a temporary folder and checks that
each run wrote its JSON (with TRL's logged steps, marked quick), and that the plot and
the table were written. It claims nothing about learning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl,bench]')")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the bench extra)")

pytestmark = pytest.mark.trl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run_writes_every_arm_a_plot_and_a_table(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import train_effect
    finally:
        sys.path.pop(0)
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "train_effect.py"),
                    "--quick", "--out", str(tmp_path)], check=True, cwd=ROOT, timeout=900)
    for arm in train_effect.ARMS:
        path = tmp_path / f"{arm}-L16-s0.json"
        assert path.exists(), f"no JSON for arm {arm}"
        record = json.loads(path.read_text())
        assert record["quick"] is True and record["arm"] == arm
        assert len(record["log"]) == 2, record["log"]
        assert all("reward" in row for row in record["log"])
    masks = json.loads((tmp_path / "masks-L16-s0.json").read_text())
    assert all("sampling_mask/mass_outside_support" in row for row in masks["log"])
    png = tmp_path / "train_effect.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "train_effect.md").read_text()
    assert "QUICK" in table and all(f"| {arm} |" in table for arm in train_effect.ARMS)
