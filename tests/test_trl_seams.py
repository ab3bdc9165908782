"""The TRL seams: what `vllm_sampling_mask.integrations.trl` relies on in the installed TRL.

Each entry of `integrations.seams.TRL_SEAMS` (a function with its parameter names, a
name that must resolve, text a function's source must still hold) is checked by
importing TRL: a release that moves one fails here, naming the part of the
integration and what moved, before any training run. Skipped where TRL is not
installed (CI installs it on the vLLM 0.31.0 tier, the release TRL 1.16 allows).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")

from vllm_sampling_mask.integrations.seams import TRL_SEAMS, TRL_TESTED  # noqa: E402
from vllm_sampling_mask.seams import Function, Name, SourceUses  # noqa: E402

pytestmark = pytest.mark.trl


def _cases(kind):
    return [pytest.param(part, entry, id=f"{part}:{entry.name}")
            for part, rows in TRL_SEAMS.items() for entry in rows if isinstance(entry, kind)]


def _resolve(module: str, dotted: str):
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _found(part, entry):
    try:
        return _resolve(entry.module, entry.name)
    except AttributeError:
        pytest.fail(f"TRL seam {part!r} moved: {entry.module}.{entry.name} no longer exists")


@pytest.mark.parametrize("part,entry", _cases(Function))
def test_trl_functions_keep_their_signatures(part, entry):
    got = tuple(inspect.signature(_found(part, entry)).parameters)
    assert got == entry.params, f"TRL seam {part!r} moved: {entry.module}.{entry.name}{got}"


@pytest.mark.parametrize("part,entry", _cases(Name))
def test_trl_names_exist(part, entry):
    _found(part, entry)


@pytest.mark.parametrize("part,entry", _cases(SourceUses))
def test_trl_code_still_does_what_the_integration_reads(part, entry):
    source = inspect.getsource(_found(part, entry))
    missing = [u for u in entry.uses if u not in source]
    assert not missing, f"TRL seam {part!r} moved: {entry.module}.{entry.name} lacks {missing}"


def test_installed_trl_is_the_tested_range():
    from packaging.specifiers import SpecifierSet

    import trl
    assert trl.__version__ in SpecifierSet(TRL_TESTED), (
        f"TRL {trl.__version__}: the integration was run against {TRL_TESTED}")


def test_pyproject_extra_pins_the_tested_range():
    import pathlib
    import tomllib

    meta = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = meta["project"]["optional-dependencies"]["trl"]
    assert extra == [f"trl{TRL_TESTED}"]
