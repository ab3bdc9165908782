"""`python -m vllm_sampling_mask.tools.replay_check`: in-process and against the shared
server, end to end on the demo model (small grids), and its argument errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from PIL import Image

from conftest import free_port
from test_readme import clean_env

from vllm_sampling_mask.tools import replay_check

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_report(out_dir, arms: int, max_tokens_total: int) -> dict:
    with open(os.path.join(out_dir, "replay_check.json")) as f:
        report = json.load(f)
    assert len(report["arms"]) == arms
    for arm in report["arms"]:
        assert 0 < arm["tokens"] <= max_tokens_total
        masked, unmasked = arm["masked"], arm["unmasked"]
        # with the mask the trainer's float32 recomputation is the engine's draw
        assert abs(masked["ratio_mean"] - 1) < 1e-3, arm
        assert abs(masked["ratio_p1"] - 1) < 1e-3 and abs(masked["ratio_p99"] - 1) < 1e-3
        assert masked["mismatch_kl"] < 1e-6 and masked["out_of_band"] == 0
        # without it the ratio is biased below 1 by the mass the sampler cut away
        assert unmasked["ratio_mean"] < 0.97, arm
        assert unmasked["mismatch_kl"] > 1e-3, arm
        assert unmasked["ratio_p99"] <= 1 + 1e-3
        support = arm["support"]
        assert 1 <= support["support_median"] <= support["support_p99"]
        assert 0 <= support["singleton_share"] <= 1
    with Image.open(report["png"] if os.path.isabs(report["png"])
                    else os.path.join(out_dir, os.path.basename(report["png"]))) as png:
        assert png.format == "PNG"
        w, h = png.size
        assert w > 500 and h > 250 * arms
        assert len(png.convert("RGB").getcolors(1 << 16) or ()) > 10   # not blank
    return report


def test_in_process_small_grid(tmp_path):
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "vllm_sampling_mask.tools.replay_check",
           "--arm", "temperature=1.0,top_k=50", "--arm", "temperature=0.8,min_p=0.05",
           "--samples", "2", "--max-tokens", "12", "--out", str(out)]
    r = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = check_report(out, arms=2, max_tokens_total=8 * 2 * 12)
    assert report["source"] == "in-process"
    assert report["engine_dtype"] == "float32" and report["dtype_note"] is None
    top_k_arm = report["arms"][0]
    assert top_k_arm["support"]["support_p99"] <= 50
    assert "with the mask" in r.stdout and "top_k=50" in r.stdout
    assert "it/s" in r.stderr or "seq/s" in r.stderr        # progress bars were shown


def test_against_a_server(mask_server, tmp_path):
    out = tmp_path / "report"
    code = replay_check.main(["--server", mask_server, "--arm", "temperature=1.0,top_k=50",
                              "--arm", "temperature=0.7,top_k=20,top_p=0.95",
                              "--samples", "2", "--max-tokens", "8", "--out", str(out)])
    assert code == 0
    report = check_report(out, arms=2, max_tokens_total=8 * 2 * 8)
    assert report["source"] == mask_server
    assert report["engine_dtype"] == "float32" and report["dtype_note"] is None
    for arm in report["arms"]:   # the engine's log S: the truncation kept < all the mass
        kept = arm["log_kept"]
        assert kept["p1"] <= kept["mean"] < 0


def test_a_server_not_in_float32_is_said_to_cause_the_spread(mask_server, tmp_path,
                                                             monkeypatch, capsys):
    """The report names the dtype as the masked ratio's cause, with the float32
    figures to expect (the server is float32; what it says of its dtype is not)."""
    real = replay_check.server_model
    monkeypatch.setattr(replay_check, "server_model",
                        lambda server: (real(server)[0], "bfloat16"))
    out = tmp_path / "report"
    assert replay_check.main(["--server", mask_server, "--arm", "temperature=1.0,top_k=50",
                              "--samples", "1", "--max-tokens", "4", "--out", str(out)]) == 0
    with open(out / "replay_check.json") as f:
        report = json.load(f)
    assert report["engine_dtype"] == "bfloat16"
    note = report["dtype_note"]
    assert "bfloat16" in note and "not from the mask" in note and "1.000" in note
    assert report["float32_expected"]["masked"]["ratio_p1"] == 1.0
    captured = capsys.readouterr()
    assert f"note: {note}" in captured.out and note in captured.err
    assert replay_check.dtype_note("float32", "in-process") is None
    assert "does not say its dtype" in replay_check.dtype_note(None, mask_server)


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        replay_check.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for said in ("(default: 4)", "(default: 32)", "(default: 0)", "(default: float32)",
                 "(default: 1G)", "(default: ./replay_check"):
        assert said in text, said


@pytest.mark.parametrize("argv, message", [
    (["--arm", "temperature=0,top_k=5"], "greedy"),
    (["--arm", "temperature=1.0"], "full vocabulary"),
    (["--arm", "top_q=0.9"], "is not one of"),
    (["--arm", "top_k=ten"], "top_k must be a number"),
    (["--model", "/nonexistent/model"], "transformers cannot load it"),
    (["--prompts", "/nonexistent/prompts.txt"], "cannot read it"),
])
def test_bad_arguments_are_clear_errors(argv, message, capsys, tmp_path):
    assert replay_check.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_server_that_is_down_is_a_clear_error(capsys, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    assert replay_check.main(["--server", url, "--out", str(tmp_path)]) == 2
    assert f"nothing answers at {url}" in capsys.readouterr().err


def test_a_server_without_a_scheme_is_read_as_http(capsys, tmp_path):
    port = free_port()
    assert replay_check.main(["--server", f"127.0.0.1:{port}", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"nothing answers at http://127.0.0.1:{port}" in err and "Traceback" not in err
    assert replay_check.main(["--server", "ftp://127.0.0.1:1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "give an http(s) URL such as http://localhost:8000" in err
    assert len(err.strip().splitlines()) == 1


def test_the_docs_figures_are_the_recorded_run():
    """docs/replay_check.md's table and release are those of the run it names, kept
    as docs/replay_check_demo.json (that run's replay_check.json, beside its PNG)."""
    docs = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs")
    with open(os.path.join(docs, "replay_check_demo.json")) as f:
        run = json.load(f)
    with open(os.path.join(docs, "replay_check.md")) as f:
        page = f.read()
    assert f"vLLM {run['vllm']}" in page and run["source"] == "in-process"
    assert (run["prompts"], run["samples"], run["max_tokens"], run["seed"]) == (8, 4, 32, 0)
    assert [a["label"] for a in run["arms"]] == [
        replay_check.parse_arm(a).label for a in replay_check.DEFAULT_ARMS]
    for arm in run["arms"]:
        s, m, u = arm["support"], arm["masked"], arm["unmasked"]
        row = (f"| {arm['label']} | {arm['tokens']:,} | {s['support_median']:.3g} / "
               f"{s['support_p99']:.3g} | {s['singleton_share']:.1%} | "
               f"{m['mismatch_kl']:.1e} / {m['ratio_mean']:.4f} / {m['ratio_p1']:.3f} / "
               f"{m['ratio_p99']:.3f} / {m['out_of_band']:.1%} | "
               f"{u['mismatch_kl']:.1e} / {u['ratio_mean']:.4f} / {u['ratio_p1']:.3f} / "
               f"{u['ratio_p99']:.3f} / {u['out_of_band']:.1%} |")
        assert row in page, row
