"""The records of the patches that act in the engine core (the scheduler).

`patches.REGISTRY` lists them with every other hop's, in its order; `patches.schema`
says what each field means.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.schema import (Kind, Patch, Process, function_entry,
                                               name_entry, source_entry)
from vllm_sampling_mask.patches.upstream import MASK_PR, RUNNER_V2, V1_RUNNER

SCHEDULER = "vllm.v1.core.sched.scheduler"


RECORDS = (
    # -- the feature ------------------------------------------------------------------------
    Patch("scheduler", ("vllm.v1.core.sched.scheduler",), Process.ENGINE_CORE, Kind.FEATURE,
          MASK_PR,
          ("upstream's `EngineCoreOutput` mask (vLLM #49577, since 0.28) carries the "
           "overlay's block, the size-limit reason and the support logprobs; from "
           "0.28 this replaces upstream's slicing."),
          change=("the step's rows checked at once, per-request byte slices into "
                  "`MaskedEngineCoreOutput`; a row it cannot describe ends a request "
                  "that asked, drops the mask (`sampling_mask_reason`) of one that "
                  "did not"),
          seams=(
              function_entry(SCHEDULER, "Scheduler.update_from_output", "self", "scheduler_output",
                             "model_runner_output"),
              function_entry(SCHEDULER, "Scheduler.finish_requests", "self", "request_ids",
                             "finished_status"),
              source_entry(SCHEDULER, "Scheduler.__init__", "self.requests:"),
                 # a dropped mask's request
              name_entry(SCHEDULER, "EngineCoreOutput"),
              name_entry("vllm.v1.engine", "FinishReason.ERROR"),
              name_entry("vllm.v1.request", "RequestStatus.FINISHED_ERROR"),
          )),
    # -- diagnostics ------------------------------------------------------------------------
    Patch("debug_state_core", ("vllm.v1.engine.core",), Process.ENGINE_CORE, Kind.DIAGNOSTIC,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)"),
          seams=(
              function_entry("vllm.v1.engine.core", "EngineCore.collective_rpc", "self", "method",
                             "timeout", "args", "kwargs"),
              name_entry("vllm.v1.engine.core", "EngineCore"),
              source_entry("vllm.v1.engine.core", "EngineCoreProc._handle_client_request",
                           "getattr(self, method_name)"),
              source_entry(SCHEDULER, "Scheduler.__init__", "self.requests:", "self.waiting =",
                           "self.running:", "self.finished_req_ids:", "self.kv_cache_manager = "),
              source_entry(SCHEDULER, "Scheduler.__init__", "self.skipped_waiting =",
                           until="0.31.0"),
              source_entry(SCHEDULER, "Scheduler.__init__", "self.kv_holding_waiting =",
                           "self.deferred_waiting",
                           since="0.31.0"),
              source_entry("vllm.v1.core.kv_cache_manager", "KVCacheManager.__init__",
                           "self.coordinator = ", "self.block_pool = "),
              source_entry("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.__init__",
                           "self.single_type_managers = "),
              source_entry("vllm.v1.core.single_type_kv_cache_manager",
                           "SingleTypeKVCacheManager.__init__", "self.req_to_blocks:",
                           "self.num_cached_block:"),
              source_entry("vllm.v1.core.block_pool", "BlockPool.__init__",
                           "self.num_gpu_blocks = ",
                           "self.null_block = "),
              source_entry("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks",
                           "free_block_queue"),
              source_entry("vllm.v1.worker.cpu_worker", "CPUWorker.init_device",
                           "self.model_runner"),
              source_entry("vllm.v1.worker.gpu_worker", "Worker.init_device", "self.model_runner",
                           until="0.32.0"),
              source_entry("vllm.v1.worker.gpu_worker", "Worker._init_workspace_and_model_runner",
                           "self.model_runner", since="0.32.0"),
              source_entry(V1_RUNNER, "GPUModelRunner.__init__", "self.requests:",
                           "self.input_batch = ",
                           until="0.34.0"),
              source_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.__init__",
                           "self.req_states = "),
          )),
)
