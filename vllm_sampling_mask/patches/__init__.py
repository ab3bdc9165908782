"""Every change this overlay makes to vLLM, one record per patch module.

`REGISTRY` maps a patch's name to its `Patch` record (`patches.schema`): the module that
holds it (`patches/<hop>/<kind>/<name>.py`), the upstream module(s) whose import applies it
(`{role}`: where the release keeps that seam, `releases.Release.modules`), the process it
acts in, its kind, the span of releases it is written for (`since`, `until`, over
`releases.RELEASES`), the upstream issue or PR it stands in for, what would let it go,
what it changes for the user (`change`) and what it relies on upstream (`seams`, in the
entry types of `patches.seams`, each over a span of releases). Each hop writes its
patches' records beside their modules, in `patches/<hop>/records.py`; a record is the one
place those are written. Where two patches wrap the same upstream function, the outer one
declares `after=` the inner one (`tests/patches/test_registry.py` fails on an undeclared
stack), and `patches.apply` applies them in that order. `docs/patches.md`'s patch tables
and `docs/releases.md`'s record spans are written from the records, in `ORDER`
(`python -m vllm_sampling_mask.tools.patch_docs`).

This package's modules named here are data: they import no vLLM and nothing of the
machinery that applies them (`patches.apply` imports them, never the other way round).
"""

from __future__ import annotations

from typing import Iterator

from vllm_sampling_mask.patches import seams as _seams
from vllm_sampling_mask.patches.common import records as _common
from vllm_sampling_mask.patches.engine import records as _engine
from vllm_sampling_mask.patches.frontend import records as _frontend
from vllm_sampling_mask.patches.http import records as _http
from vllm_sampling_mask.patches.schema import Kind, Patch, Process
from vllm_sampling_mask.patches.worker import records as _worker

__all__ = ["Kind", "ORDER", "Patch", "Process", "REGISTRY", "applied_on", "seam_entries"]

# The order the records are listed in (the docs' tables) and hooked in: by kind, and the
# feature's along the mask's path. Every record is named once.
ORDER = (
    # -- fixes of upstream bugs ------------------------------------------------------------
    "metadata_alias", "top_p_one_rows", "cpu_generator_rewind", "cpu_seeded_sampling",
    "cpu_moe_float32_amx", "cpu_amx_tile_permission", "cpu_reload_tied_lm_head",
    "cpu_colocated_load_weights", "cpu_lora_base_rows", "token_id_validation",
    "logit_bias_keys", "shutdown_answers", "shutdown_log", "server_signals",
    "validation_messages", "refusal_log", "reload_weights_recovery",
    "collective_rpc_refusals", "collective_rpc_refusals_sync", "rpc_route_body",
    "rl_route_bodies", "abort_request_ids", "rpc_refusal_log", "rl_routes_auth",
    "cpu_verify_expand", "verify_without_drafts",
    # -- CPU / Triton-interpreter enablers -------------------------------------------------
    "interpreter_has_triton", "interpreter_top_k_top_p", "interpreter_libdevice",
    "interpreter_patch_cache", "interpreter_overflow_checks", "interpreter_masks",
    "interpreter_dummy_run",
    "cpu_op_memory_env", "cpu_op_scheduler_metadata", "cpu_op_rotary_embedding",
    "cpu_op_reshape_and_cache", "cpu_op_attention", "cpu_op_gumbel_argmax",
    "cpu_op_greedy_argmax",
    # -- the feature: the engine flag and the request's decision ---------------------------
    "model_config", "engine_args", "request_validation",
    # -- the mask's path: sampler -> runner output -> scheduler -> client -> user ----------
    "sampler", "rejection_sampler", "runner", "async_output", "runner_output", "sampler_v1",
    "rejection_sampler_v1", "runner_v1", "runner_coverage", "scheduler", "core_client",
    "output_processor",
    "completion_output",
    # -- the HTTP routes: protocol modules before any route binds their classes ------------
    "generate_protocol", "generate_endpoint", "generate_route", "completion_protocol",
    "openai_completions", "chat_protocol", "openai_chat", "json_response", "models_dtype",
    # -- diagnostics -----------------------------------------------------------------------
    "debug_state", "debug_state_core",
)


def _registry() -> dict[str, Patch]:
    records = {r.name: r for hop in (_common, _engine, _frontend, _http, _worker)
               for r in hop.RECORDS}
    unordered = sorted(set(records) - set(ORDER))
    unknown = sorted(set(ORDER) - set(records))
    if unordered or unknown or len(ORDER) != len(set(ORDER)):
        raise ValueError(f"patches.ORDER: name each record once (not named: {unordered}; "
                         f"no such record: {unknown})")
    return {name: records[name] for name in ORDER}


REGISTRY: dict[str, Patch] = _registry()


def applied_on(name: str, version: str | None) -> bool:
    """Whether patch `name`'s record is applied on vLLM `version` (None: any; a
    version that is not listed is read as `releases.nearest`): a patch written for
    other releases has no contract with this one, whatever its entries' own spans."""
    record = REGISTRY.get(name)
    if record is None or version is None:
        return True
    return record.applies_to(_seams.release_of(version))


def seam_entries(kind: type | None = None, version: str | None = None
                 ) -> Iterator[tuple[str, _seams.Entry]]:
    """(patch, entry) for every seam entry of `kind` (`seams.Function`, ...) that
    applies to vLLM `version`, of the patches applied there, its `{role}` module
    read from that release's profile."""
    for name, record in REGISTRY.items():
        if applied_on(name, version):
            for entry in record.seams:
                if kind is not None and not isinstance(entry, kind):
                    continue
                if _seams.applies(entry, version):
                    yield name, _seams.resolved(entry, version)
