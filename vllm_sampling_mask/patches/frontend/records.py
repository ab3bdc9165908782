"""The records of the patches that act in the API server / LLM front end, outside the HTTP layer.

`patches.REGISTRY` lists them with every other hop's, in its order; `patches.schema`
says what each field means.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.schema import (Kind, Patch, Process, fields_entry,
                                               function_entry, name_entry, source_entry)
from vllm_sampling_mask.patches.upstream import (ASYNC_LLM, MASK_PR, NONE_KNOWN, OPENAI_CHAT,
                                                 OPENAI_COMPLETION, OUTPUT_PROCESSOR)

INPUT_PROCESSOR = "vllm.v1.engine.input_processor"

PROCESS_INPUTS_PARAMS = ("self", "request_id", "prompt", "params", "supported_tasks",
                         "arrival_time", "lora_request", "tokenization_kwargs", "trace_headers",
                         "priority", "data_parallel_rank", "resumable")

PROCESS_INPUTS_PARAMS_028 = (*PROCESS_INPUTS_PARAMS, "session_id")

PROCESS_INPUTS_PARAMS_031 = (*PROCESS_INPUTS_PARAMS_028, "kv_hints")

PROCESS_INPUTS_SPANS = (
    function_entry("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
                   *PROCESS_INPUTS_PARAMS,
                   until="0.28.0"),
    function_entry("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
                   *PROCESS_INPUTS_PARAMS_028, since="0.28.0", until="0.31.0"),
    function_entry("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
                   *PROCESS_INPUTS_PARAMS_031, since="0.31.0"),
)


RECORDS = (
    # -- fixes of upstream bugs -------------------------------------------------------------
    Patch("token_id_validation", (INPUT_PROCESSOR,), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "token ids out of the model's vocabulary kill the engine "
          "(prompt id == vocab size, stop_token_ids unchecked, 64-bit overflow is a 500)",
          "upstream checks ids against the model and answers these with 400",
          after=("request_validation",),
          change=("every token id a request carries against the model's vocabulary "
                  "(upstream let a prompt id == vocab size through and the worker "
                  "died), 64-bit integers, whitespace-only bad words, "
                  "structured-output errors as 400s"),
          seams=(
              # The token-id checks: the three InputProcessor methods they wrap, and what they read
              # (the rendered prompt's type and ids, the model's vocabulary, the sampling
              # parameters' fields, the tokenizer's encoding of bad_words, which process_inputs
              # makes).
              function_entry(INPUT_PROCESSOR, "InputProcessor._validate_params", "self", "params",
                             "supported_tasks"),
              function_entry(INPUT_PROCESSOR, "InputProcessor._validate_model_input", "self",
                             "prompt_input",
                             "prompt_type"),
              *PROCESS_INPUTS_SPANS,
              name_entry("vllm.config.model", "ModelConfig.get_vocab_size"),
              name_entry("vllm.sampling_params", "SamplingParams.bad_words_token_ids"),
              name_entry("vllm.sampling_params", "SamplingParams.__struct_fields__"),
              source_entry(INPUT_PROCESSOR, "InputProcessor._validate_model_input",
                           'prompt_input["type"] == "embeds"', 'prompt_input["prompt_token_ids"]'),
              source_entry(INPUT_PROCESSOR, "InputProcessor.process_inputs",
                           "self._validate_params(params",
                           "self._validate_model_inputs(",
                           "sampling_params.update_from_tokenizer("),
              # a plain ValueError raised under this frame is named as structured_outputs'
              source_entry("vllm.sampling_params", "SamplingParams.verify",
                           "self._validate_structured_outputs("),
              # a client error already (`Release.client_error`) passes as it is
              name_entry("vllm.exceptions", "VLLMValidationError", until="0.27.1"),
              name_entry("vllm.exceptions", "VLLMClientError", since="0.27.1"),
          )),
    Patch("logit_bias_keys", ("vllm.sampling_params",), Process.API_SERVER, Kind.FIX,
          "vLLM #46612 (0.27.1 names logit_bias for a key int() does not take; 0.24's "
          "bare int() raised a plain ValueError, a 400 naming no parameter)",
          "0.24 is dropped (fixed upstream in 0.27.1)", until="0.27.1",
          change=("a `logit_bias` key that is no token id is a 400 naming "
                  "`logit_bias` (0.24's bare `int()` gave one naming no parameter)"),
          seams=(
              # 0.24's SamplingParams.from_optional, which the OpenAI requests call with their
              # logit_bias (by keyword), and its bare conversion of the keys
              function_entry("vllm.sampling_params", "SamplingParams.from_optional", "n",
                             "presence_penalty",
                             "frequency_penalty", "repetition_penalty", "temperature", "top_p",
                             "top_k",
                             "min_p", "seed", "stop", "stop_token_ids", "bad_words",
                             "thinking_token_budget",
                             "include_stop_str_in_output", "ignore_eos", "max_tokens",
                             "min_tokens",
                             "logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens",
                             "spaces_between_special_tokens",
                             "output_kind", "structured_outputs", "logit_bias",
                             "allowed_token_ids",
                             "extra_args", "skip_clone", "repetition_detection"),
              source_entry("vllm.sampling_params", "SamplingParams.from_optional",
                           "int(token): min(100.0, max(-100.0, bias))"),
              source_entry(f"{OPENAI_COMPLETION}.protocol", "CompletionRequest.to_sampling_params",
                           "SamplingParams.from_optional(", "logit_bias=self.logit_bias"),
              source_entry(f"{OPENAI_CHAT}.protocol", "ChatCompletionRequest.to_sampling_params",
                           "SamplingParams.from_optional(", "logit_bias=self.logit_bias"),
          )),
    Patch("shutdown_answers", ("vllm.v1.engine.async_llm", "vllm.v1.engine.output_processor"),
          Process.API_SERVER, Kind.FIX,
          "vLLM #36964 (open: the engine core aborts and flushes on SIGTERM; still "
          "misses a core killed mid-step and requests sent after its drain)",
          "AsyncLLM.shutdown fails or answers the requests still pending",
          change=("on shutdown (SIGTERM), every request still pending gets upstream's "
                  "abort output instead of no answer (or a 500, when the output "
                  "handler sees the engine core die first)"),
          seams=(
              # Shutdown: AsyncLLM.shutdown stops the engine core, then the pending requests are
              # aborted in the output processor on the output handler's loop; a request arriving
              # later fails on the dead flag that the client's resources set.
              function_entry(ASYNC_LLM, "AsyncLLM.shutdown", "self", "timeout"),
              function_entry(OUTPUT_PROCESSOR, "OutputProcessor.abort_requests", "self",
                             "request_ids", "internal"),
              function_entry("vllm.utils.async_utils", "run_in_loop", "loop", "function", "args"),
              source_entry(ASYNC_LLM, "AsyncLLM.__init__", "self.output_processor = ",
                           "self.output_handler: asyncio.Task | None = None"),
              source_entry(ASYNC_LLM, "AsyncLLM._run_output_handler",
                           "self.output_handler = asyncio.create_task(",
                           "output_processor.propagate_error(e)"),
              function_entry(OUTPUT_PROCESSOR, "OutputProcessor.propagate_error", "self", "e"),
              name_entry("vllm.v1.engine.exceptions", "EngineDeadError"),
              source_entry(ASYNC_LLM, "AsyncLLM.shutdown", "engine_core.shutdown(timeout=timeout)",
                           "cancel_task_threadsafe(handler)"),
              source_entry(ASYNC_LLM, "AsyncLLM.add_request", "if self.errored:",
                           "raise EngineDeadError()"),
              source_entry(OUTPUT_PROCESSOR, "OutputProcessor.__init__", "self.request_states"),
              source_entry(OUTPUT_PROCESSOR, "OutputProcessor.abort_requests",
                           "self.request_states.pop(request_id, None)",
                           "finish_reason=FinishReason.ABORT",
                           "req_state.queue.put(request_output)"),
              source_entry("vllm.v1.engine.core_client", "BackgroundResources.__call__",
                           "self.engine_dead = True"),
          )),
    Patch("shutdown_log", ("vllm.v1.engine.async_llm",), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "a requested shutdown (SIGTERM) ends the log in an EngineDeadError "
          "traceback from AsyncLLM's output handler although nothing went wrong",
          "upstream's output handler exits quietly on an engine it is stopping",
          after=("shutdown_answers",),
          change=("a requested shutdown ends the log without the output handler's "
                  "EngineDeadError traceback"),
          seams=(
              function_entry("vllm.v1.engine.async_llm", "AsyncLLM.shutdown", "self", "timeout"),
              source_entry("vllm.v1.engine.async_llm", "AsyncLLM._run_output_handler",
                           'logger.exception("AsyncLLM output_handler failed.")'),
          )),
    Patch("collective_rpc_refusals", ("vllm.v1.engine.async_llm",), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "/collective_rpc answers caller errors with 500 (the worker's "
          "exception crosses processes as text) and runs any attribute of the worker, "
          "private ones included",
          "upstream's utility calls keep the worker's exception class and the route "
          "answers client errors with 4xx",
          change=("`/collective_rpc`: a call that cannot run (a method that is no "
                  "string, private or not the worker's, arguments of the wrong type "
                  "or that do not bind) and a refused reload are HTTP 400 naming the "
                  "parameter, an undone reload its one line (upstream answered every "
                  "worker exception with 500 and the worker's wrapped text, and ran "
                  "`__init__`)"),
          seams=(
              function_entry(ASYNC_LLM, "AsyncLLM.collective_rpc", "self", "method", "timeout",
                             "args", "kwargs"),
              # where a call by name finds its method: the wrapper, then the worker
              source_entry("vllm.v1.worker.worker_base", "WorkerWrapperBase.__getattr__",
                           "getattr(self.worker, attr)"),
              fields_entry("vllm.config.parallel", "ParallelConfig", "worker_cls",
                           "worker_extension_cls"),
              name_entry("vllm.utils.import_utils", "resolve_obj_by_qualname"),
              source_entry("vllm.v1.engine.core", "EngineCoreProc._invoke_utility_method",
                           'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
              source_entry("vllm.v1.engine.core_client", "_process_utility_output",
                           "future.set_exception(Exception(failure_message))"),
          )),
    Patch("collective_rpc_refusals_sync", ("vllm.v1.engine.llm_engine",), Process.API_SERVER,
          Kind.FIX,
          NONE_KNOWN + "collective_rpc: a worker's exception reaches the caller as a "
          "plain Exception with its text wrapped twice",
          "upstream's utility calls carry the worker's exception class across processes",
          change=("`LLM.collective_rpc`: the same checks as a `ValueError`; a refused "
                  "reload raises `WeightsRefusedError` (a ValueError), an undone one "
                  "`WeightsRestoredError` (upstream: a plain `Exception` with the "
                  "text wrapped twice)"),
          seams=(
              function_entry("vllm.v1.engine.llm_engine", "LLMEngine.collective_rpc", "self",
                             "method",
                             "timeout", "args", "kwargs"),
              source_entry("vllm.v1.engine.core_client", "_process_utility_output",
                           "future.set_exception(Exception(failure_message))"),
          )),
    # -- the feature ------------------------------------------------------------------------
    Patch("request_validation", (INPUT_PROCESSOR,), Process.API_SERVER, Kind.FEATURE, MASK_PR,
          ("upstream decides masks per request (vLLM #49577, since 0.28, has one "
           "engine-wide flag and refuses top-p-only and greedy rows with a plain "
           "ValueError)."),
          change=("per-request checks (400 / ValueError); the per-request decision in "
                  "`extra_args`"),
          seams=(
              function_entry(INPUT_PROCESSOR, "InputProcessor._validate_params", "self", "params",
                             "supported_tasks"),
              *PROCESS_INPUTS_SPANS,
          )),
    Patch("core_client", ("vllm.v1.engine.core_client",), Process.API_SERVER, Kind.FEATURE,
          MASK_PR,
          "upstream carries the mask in `EngineCoreOutput`.",
          change="decode the subclass (base decoder drops trailing fields)",
          seams=(
              name_entry("vllm.v1.engine.core_client", "EngineCoreOutputs"),
          )),
    Patch("output_processor", ("vllm.v1.engine.output_processor",), Process.API_SERVER,
          Kind.FEATURE, MASK_PR,
          ("upstream's output processor (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size-limit reason and the support logprobs, and "
           "masks every delta (0.28-0.31 emit them on the final output only); from "
           "0.28 this replaces it."),
          change="accumulate, set `CompletionOutput.sampling_mask`",
          seams=(
              function_entry(OUTPUT_PROCESSOR, "OutputProcessor.process_outputs", "self",
                             "engine_core_outputs",
                             "engine_core_timestamp", "iteration_stats", until="0.32.0"),
              function_entry(OUTPUT_PROCESSOR, "OutputProcessor.process_outputs", "self",
                             "engine_core_outputs",
                             "engine_core_timestamp", "iteration_stats", "weight_version",
                             since="0.32.0"),
              function_entry(OUTPUT_PROCESSOR, "RequestState.from_new_request", "tokenizer",
                             "request", "prompt",
                             "parent_req", "request_index", "queue", "log_stats",
                             "stream_interval"),
              function_entry(OUTPUT_PROCESSOR, "RequestState._new_completion_output", "self",
                             "token_ids",
                             "finish_reason", "stop_reason"),
              name_entry("vllm.sampling_params", "RequestOutputKind.DELTA"),
              source_entry(OUTPUT_PROCESSOR, "OutputProcessor.__init__", "self.request_states"),
          )),
)
