"""Every fix in `patches.REGISTRY` has a test file whose name names it:
`test_fix_<name>.py` (tests/patches/fixes/) or `test_<name>.py` (beside its hop's
tests, as tests/http/test_rl_route_bodies.py), so that a reader finds a fix's tests
by its name.

`NOT_YET` lists the fixes whose tests still sit inside behaviour modules, each with
where: those modules start their own engine or server for the tests beside them, and
a file of its own would start another (CI keeps one engine per module). The list
only shrinks: a fix that gains its file, or leaves the registry, must leave it too.
"""

from __future__ import annotations

import os

import pytest

from vllm_sampling_mask.patches import REGISTRY, Kind

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# fix -> where its tests sit today (no file of its own yet)
NOT_YET = {
    "shutdown_answers": "tests/server/test_faults.py (its server's SIGTERM tests; the "
                        "module's other fault tests share those servers)",
    "cpu_colocated_load_weights": "tests/llm/test_colocated_engine.py (one of its two "
                                  "tests; the other, the VLLM_SAMPLING_MASK_RETURN "
                                  "switch, shares its engine), "
                                  "tests/integrations/test_trl_integration.py",
    "cpu_generator_rewind": "tests/llm/test_engine.py (one test of many on its engines)",
    "cpu_reload_tied_lm_head": "tests/server/test_weight_update.py (its servers' "
                               "new-weight checks)",
}


def file_names() -> set[str]:
    return {name for _, _, files in os.walk(TESTS) for name in files
            if name.startswith("test_") and name.endswith(".py")}


def has_test_file(fix: str, names: set[str]) -> bool:
    return f"test_fix_{fix}.py" in names or f"test_{fix}.py" in names


FIXES = sorted(name for name, record in REGISTRY.items() if record.kind is Kind.FIX)


def test_the_registry_has_fixes():
    assert len(FIXES) >= 20, FIXES


@pytest.mark.parametrize("fix", FIXES)
def test_every_fix_has_a_test_file_naming_it(fix):
    names = file_names()
    if fix in NOT_YET:
        assert not has_test_file(fix, names), (
            f"{fix} has its test file now: take it out of NOT_YET")
        return
    assert has_test_file(fix, names), (
        f"the fix {fix!r} has no test file: add tests/patches/fixes/test_fix_{fix}.py "
        "with its tests")


def test_not_yet_names_only_fixes_of_the_registry():
    assert sorted(set(NOT_YET) - set(FIXES)) == []
