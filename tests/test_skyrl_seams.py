"""The SkyRL seams: what `vllm_sampling_mask.integrations.skyrl` relies on in the
installed SkyRL (and vLLM's `--middleware` option it is loaded through).

Each entry of `integrations.seams.SKYRL_SEAMS` (a function with its parameter names, a
name that must resolve, text a function's source must still hold) is checked by
importing SkyRL: a release that moves one fails here, naming the part of the
integration and what moved. Skipped where SkyRL is not installed (its own environment:
docs/rl_recipes.md, "SkyRL"; CI's SkyRL step).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

pytest.importorskip("skyrl", reason="SkyRL is not installed (its environment: "
                    "requirements/skyrl-0.4.0-cpu.txt, docs/rl_recipes.md 'SkyRL')")

from vllm_sampling_mask.integrations.seams import SKYRL_SEAMS, SKYRL_TESTED  # noqa: E402
from vllm_sampling_mask.seams import Function, Name, SourceUses  # noqa: E402

pytestmark = pytest.mark.skyrl


def _cases(kind):
    return [pytest.param(part, entry, id=f"{part}:{entry.name}")
            for part, rows in SKYRL_SEAMS.items() for entry in rows if isinstance(entry, kind)]


def _found(part, entry):
    obj = importlib.import_module(entry.module)
    try:
        for name in entry.name.split("."):
            obj = getattr(obj, name)
    except AttributeError:
        pytest.fail(f"SkyRL seam {part!r} moved: {entry.module}.{entry.name} no longer exists")
    return obj


@pytest.mark.parametrize("part,entry", _cases(Function))
def test_skyrl_functions_keep_their_signatures(part, entry):
    got = tuple(inspect.signature(_found(part, entry)).parameters)
    assert got == entry.params, f"SkyRL seam {part!r} moved: {entry.module}.{entry.name}{got}"


@pytest.mark.parametrize("part,entry", _cases(Name))
def test_skyrl_names_exist(part, entry):
    _found(part, entry)


@pytest.mark.parametrize("part,entry", _cases(SourceUses))
def test_skyrl_code_still_does_what_the_integration_reads(part, entry):
    source = inspect.getsource(_found(part, entry))
    missing = [u for u in entry.uses if u not in source]
    assert not missing, f"SkyRL seam {part!r} moved: {entry.module}.{entry.name} lacks {missing}"


def test_skyrl_layout_is_what_the_adapter_writes():
    """The adapter writes -1 padding in int32 rows, SkyRL's layout constants."""
    import numpy as np
    from skyrl.backends.skyrl_train.utils.sample_support import (SAMPLE_SUPPORT_DTYPE,
                                                                 SAMPLE_SUPPORT_PADDING)

    from vllm_sampling_mask.integrations import skyrl as adapter
    assert SAMPLE_SUPPORT_PADDING == adapter.PADDING
    rows = adapter.support_rows(np.array([1, 2, 3]), np.array([0, 2, 3]), 4)
    assert rows.dtype == SAMPLE_SUPPORT_DTYPE


def test_installed_skyrl_is_the_tested_range():
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    assert version("skyrl") in SpecifierSet(SKYRL_TESTED), (
        f"SkyRL {version('skyrl')}: the integration was run against {SKYRL_TESTED}")


def test_requirements_file_pins_a_tested_release():
    import pathlib

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    text = (pathlib.Path(__file__).parents[1] / "requirements" /
            "skyrl-0.4.0-cpu.txt").read_text()
    pins = [Requirement(line.split("#")[0].strip()) for line in text.splitlines()
            if line.startswith("skyrl==")]
    assert [str(p.specifier) for p in pins] == ["==0.4.0"]
    assert "0.4.0" in SpecifierSet(SKYRL_TESTED)
