"""The seam contract: what each patch relies on in vLLM 0.27.1 (and Triton 3.9).

For every patch, the upstream functions it wraps with their parameter names (the
wrappers read arguments by position or name), and the attributes, fields and
names it reads or replaces. When an upstream release moves any of them, the
failure names the patch (the seam) and what moved, before any engine starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from vllm_sampling_mask import patching
from vllm_sampling_mask.patches import REGISTRY

GPU = "vllm.v1.worker.gpu"
V1 = "vllm.v1.worker.gpu_model_runner"
TITO_P = "vllm.entrypoints.scale_out.token_in_token_out.protocol"
TITO = "vllm.entrypoints.scale_out.token_in_token_out.serving"
CMPL = "vllm.entrypoints.openai.completion"
CHAT = "vllm.entrypoints.openai.chat_completion"

# patch -> [(module, qualified name, parameter names of the original)]
FUNCTIONS = {
    "engine_args": [
        ("vllm.engine.arg_utils", "EngineArgs.add_cli_args", ["parser"]),
        ("vllm.engine.arg_utils", "EngineArgs.create_model_config", ["self"]),
        ("vllm.engine.arg_utils", "EngineArgs.create_engine_config",
         ["self", "usage_context", "headless"]),
    ],
    "request_validation": [
        ("vllm.v1.engine.input_processor", "InputProcessor._validate_params",
         ["self", "params", "supported_tasks"]),
        ("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
         ["self", "request_id", "prompt", "params", "supported_tasks", "arrival_time",
          "lora_request", "tokenization_kwargs", "trace_headers", "priority",
          "data_parallel_rank", "resumable"]),
    ],
    "sampler": [
        (f"{GPU}.sample.sampler", "Sampler.sample",
         ["self", "logits", "expanded_idx_mapping", "idx_mapping_np", "pos", "input_ids",
          "expanded_local_pos", "return_logprobs"]),
        (f"{GPU}.sample.sampler", "Sampler.__call__", ["self", "logits", "input_batch"]),
    ],
    "runner": [
        (f"{GPU}.model_runner", "GPUModelRunner.load_model",
         ["self", "load_dummy_weights", "args", "kwargs"]),
        (f"{GPU}.model_runner", "GPUModelRunner._dummy_sampler_run",
         ["self", "hidden_states"]),
    ],
    "async_output": [
        (f"{GPU}.async_utils", "AsyncOutput.__init__",
         ["self", "model_runner_output", "sampler_output", "num_sampled_tokens",
          "main_stream", "copy_stream", "check_ep_fault"]),
        (f"{GPU}.async_utils", "AsyncOutput.get_output", ["self"]),
        (f"{GPU}.async_utils", "stream", ["to_stream", "from_stream"]),
    ],
    "scheduler": [
        ("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
         ["self", "scheduler_output", "model_runner_output"]),
        ("vllm.v1.core.sched.scheduler", "Scheduler.finish_requests",
         ["self", "request_ids", "finished_status"]),
    ],
    "output_processor": [
        ("vllm.v1.engine.output_processor", "OutputProcessor.process_outputs",
         ["self", "engine_core_outputs", "engine_core_timestamp", "iteration_stats"]),
        ("vllm.v1.engine.output_processor", "RequestState.from_new_request",
         ["tokenizer", "request", "prompt", "parent_req", "request_index", "queue",
          "log_stats", "stream_interval"]),
        ("vllm.v1.engine.output_processor", "RequestState._new_completion_output",
         ["self", "token_ids", "finish_reason", "stop_reason"]),
    ],
    "completion_output": [
        ("vllm.outputs", "RequestOutput.add", ["self", "next_output", "aggregate"]),
    ],
    "generate_endpoint": [
        (TITO, "ServingTokens.serve_tokens", ["self", "request", "raw_request"]),
        (TITO, "ServingTokens.serve_tokens_full_generator",
         ["self", "request", "result_generator", "request_id", "model_name",
          "request_metadata"]),
        (TITO, "ServingTokens.serve_tokens_stream_generator",
         ["self", "request", "result_generator", "request_id", "model_name",
          "request_metadata"]),
    ],
    "completion_protocol": [
        (f"{CMPL}.protocol", "CompletionRequest.to_sampling_params",
         ["self", "max_tokens", "default_sampling_params"]),
    ],
    "openai_completions": [
        (f"{CMPL}.serving", "OpenAIServingCompletion.create_completion",
         ["self", "request", "raw_request"]),
        (f"{CMPL}.serving", "OpenAIServingCompletion.request_output_to_completion_response",
         ["self", "final_res_batch", "request", "request_id", "created_time", "model_name",
          "tokenizer", "request_metadata"]),
        (f"{CMPL}.serving", "OpenAIServingCompletion.completion_stream_generator",
         ["self", "request", "engine_inputs", "result_generator", "request_id",
          "created_time", "model_name", "num_prompts", "tokenizer", "request_metadata"]),
    ],
    "chat_protocol": [
        (f"{CHAT}.protocol", "ChatCompletionRequest.to_sampling_params",
         ["self", "max_tokens", "default_sampling_params"]),
    ],
    "openai_chat": [
        (f"{CHAT}.serving", "OpenAIServingChat.create_chat_completion",
         ["self", "request", "raw_request"]),
        (f"{CHAT}.serving", "OpenAIServingChat.chat_completion_full_generator",
         ["self", "request", "result_generator", "request_id", "model_name",
          "conversation", "tokenizer", "request_metadata", "parser", "mm_token_counts"]),
        (f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator",
         ["self", "request", "result_generator", "request_id", "model_name",
          "conversation", "tokenizer", "request_metadata", "chat_template_kwargs",
          "mm_token_counts"]),
    ],
    "interpreter_dummy_run": [
        (f"{GPU}.model_runner", "GPUModelRunner._dummy_sampler_run",
         ["self", "hidden_states"]),
    ],
    "interpreter_patch_cache": [("triton.runtime.interpreter", "_patch_lang", ["fn"])],
    "interpreter_top_k_top_p": [
        ("triton.runtime.interpreter", "_patch_lang_core", ["lang", "scope"]),
        ("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p", ["logits", "k", "p"]),
        ("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p_pytorch",
         ["logits", "k", "p", "allow_cpu_sync"]),
    ],
    "sampler_v1": [
        ("vllm.v1.sample.sampler", "Sampler.sample",
         ["self", "logits", "sampling_metadata", "logprobs_mode_override"]),
        ("vllm.v1.sample.sampler", "Sampler.forward",
         ["self", "logits", "sampling_metadata", "predict_bonus_token",
          "logprobs_mode_override"]),
    ],
    "runner_v1": [
        (V1, "GPUModelRunner.__init__", ["self", "vllm_config", "device"]),
        (V1, "GPUModelRunner._sample", ["self", "logits", "spec_decode_metadata"]),
        (V1, "GPUModelRunner.sample_tokens", ["self", "grammar_output"]),
        (V1, "AsyncGPUModelRunnerOutput.get_output", ["self"]),
        (V1, "GPUModelRunner._dummy_sampler_run", ["self", "hidden_states"]),
    ],
    "cpu_generator_rewind": [
        (V1, "GPUModelRunner._sample", ["self", "logits", "spec_decode_metadata"]),
        (V1, "GPUModelRunner._bookkeeping_sync",
         ["self", "scheduler_output", "sampler_output", "logits", "hidden_states",
          "num_scheduled_tokens"]),
    ],
}

# patch -> [(module, dotted name that must exist)]
NAMES = {
    "metadata_alias": [("vllm.version", "__version__")],
    "interpreter_has_triton": [("vllm.triton_utils.importing", "HAS_TRITON")],
    "interpreter_libdevice": [(f"{GPU}.sample.gumbel", "tldevice")],
    "model_config": [("vllm.config.model", "ModelConfig")],
    "core_client": [("vllm.v1.engine.core_client", "EngineCoreOutputs")],
    "scheduler": [("vllm.v1.core.sched.scheduler", "EngineCoreOutput"),
                  ("vllm.v1.engine", "FinishReason.ERROR"),
                  ("vllm.v1.request", "RequestStatus.FINISHED_ERROR")],
    "generate_protocol": [(TITO_P, name) for name in (
        "GenerateRequest", "GenerateResponseChoice", "GenerateResponse")],
    "completion_protocol": [(f"{CMPL}.protocol", name) for name in
                            ("CompletionResponseChoice", "CompletionResponse")],
    "chat_protocol": [(f"{CHAT}.protocol", name) for name in
                      ("ChatCompletionResponseChoice", "ChatCompletionResponse")],
    # the routes: error responses, and the error events `open_stream` turns into them
    "generate_endpoint": [
        (TITO, "GenerateResponse"), (TITO, "ServingTokens.create_error_response"),
        ("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY"),
        ("vllm.entrypoints.openai.engine.protocol", "ErrorResponse"),
        ("vllm.exceptions", "VLLMClientError")],
    "openai_completions": [
        (f"{CMPL}.serving", "OpenAIServingCompletion.create_error_response"),
        ("vllm.entrypoints.generate.base.serving",
         "GenerateBaseServing.create_streaming_error_response")],
    "openai_chat": [
        (f"{CHAT}.serving", "ChatCompletionResponse"),
        (f"{CHAT}.serving", "OpenAIServingChat.create_error_response")],
    "output_processor": [("vllm.sampling_params", "RequestOutputKind.DELTA")],
}

# patch -> [(module, dataclass, fields it reads)]
FIELDS = {
    "sampler": [(f"{GPU}.sample.output", "SamplerOutput", ["sampled_token_ids"])],
    "runner_output": [("vllm.v1.outputs", "ModelRunnerOutput",
                       ["req_ids", "req_id_to_index", "sampled_token_ids"]),
                      ("vllm.v1.outputs", "SamplerOutput",
                       ["sampled_token_ids", "logprobs_tensors"])],
    "completion_output": [("vllm.outputs", "CompletionOutput",
                           ["index", "token_ids", "finish_reason"])],
    "engine_args": [("vllm.engine.arg_utils", "EngineArgs",
                     ["logprobs_mode", "speculative_config", "logits_processors"])],
}

# patch -> [(module, function, attribute names its source must still use)]
SOURCE_USES = {
    "sampler": [(f"{GPU}.sample.sampler", "Sampler.__init__",
                 ["self.sampling_states", "self.use_flashinfer"]),
                (f"{GPU}.sample.states", "SamplingStates.__init__",
                 ["self.top_k", "self.vocab_size"])],
    "runner": [(f"{GPU}.model_runner", "GPUModelRunner.load_model",
                ["self.sampler = Sampler("])],
    "async_output": [(f"{GPU}.async_utils", "AsyncOutput.__init__",
                      ["self.num_sampled_tokens_np", "self.copy_event.record(copy_stream)"]),
                     (f"{GPU}.async_utils", "AsyncOutput.get_output",
                      ["self.copy_event.synchronize()"])],
    "output_processor": [("vllm.v1.engine.output_processor", "OutputProcessor.__init__",
                          ["self.request_states"])],
    "runner_v1": [(V1, "GPUModelRunner.__init__", ["self.sampler = Sampler("]),
                  (V1, "GPUModelRunner._sample", ["self.sampler("]),
                  ("vllm.v1.worker.gpu_input_batch", "InputBatch.__init__",
                   ["self.top_k_cpu =", "self.generators"]),
                  (V1, "AsyncGPUModelRunnerOutput.get_output",
                   ["output.sampled_token_ids = valid_sampled_token_ids"])],
    "sampler_v1": [("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_native",
                    ['self.logprobs_mode == "processed_logprobs"'])],
    "cpu_generator_rewind": [(V1, "GPUModelRunner._bookkeeping_sync",
                              ["gen.set_offset(", "self.discard_request_mask.np"])],
    # `StreamMasks`: each result's outputs are iterated once, each chunk is built from
    # the output being iterated and sent as a `data: {json}` event; the choices of
    # full responses are numbered as the patches read them; error responses are
    # what the routes return as HTTP errors.
    "generate_endpoint": [
        (TITO, "ServingTokens.serve_tokens_stream_generator",
         ["async for res in result_generator", "for output in res.outputs",
          "i = output.index", 'yield f"data: {chunk.model_dump_json()}\\n\\n"',
          # sized from the first result: `every_choice_first` hands it every choice
          "num_generated_tokens = [0] * len(res.outputs)"]),
        (TITO, "ServingTokens.serve_tokens_full_generator", ["index=output.index"]),
        ("vllm.entrypoints.scale_out.token_in_token_out.api_router", "generate",
         ["isinstance(generator, ErrorResponse)"])],
    "openai_completions": [
        (f"{CMPL}.serving", "OpenAIServingCompletion.completion_stream_generator",
         ["async for prompt_idx, res in result_generator", "for output in res.outputs",
          "i = output.index + prompt_idx * num_choices", 'yield f"data: {response_json}']),
        (f"{CMPL}.serving", "OpenAIServingCompletion.request_output_to_completion_response",
         ["for final_res in final_res_batch", "for output in final_res.outputs",
          "index=len(choices)"]),
        (f"{CMPL}.api_router", "create_completion",
         ["isinstance(generator, ErrorResponse)"])],
    "openai_chat": [
        (f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator",
         ["async for res in result_generator", "for output in res.outputs",
          "i = output.index", 'yield f"data: {data}']),
        (f"{CHAT}.serving", "OpenAIServingChat.chat_completion_full_generator",
         ["index=output.index"]),
        (f"{CHAT}.api_router", "create_chat_completion",
         ["isinstance(generator, ErrorResponse)"])],
}


# The state route (only with VLLM_SAMPLING_MASK_DEBUG_STATE=1): `build_app`, the app's
# engine client, its output processor and engine-core client, the utility call by
# name, and the per-request containers it counts in the engine core and the workers.
API = "vllm.entrypoints.openai.api_server"
FUNCTIONS["debug_state"] = [
    (API, "build_app", ["args", "supported_tasks", "model_config"]),
    ("vllm.v1.engine.core_client", "AsyncMPClient.call_utility_async",
     ["self", "method", "args"]),
]
FUNCTIONS["debug_state_core"] = [
    ("vllm.v1.engine.core", "EngineCore.collective_rpc",
     ["self", "method", "timeout", "args", "kwargs"]),
]
NAMES["debug_state_core"] = [("vllm.v1.engine.core", "EngineCore")]
SOURCE_USES["debug_state"] = [
    (API, "init_app_state", ["state.engine_client = engine_client"]),
    ("vllm.v1.engine.async_llm", "AsyncLLM.__init__",
     ["self.output_processor = ", "self.engine_core = "]),
    ("vllm.v1.engine.output_processor", "OutputProcessor.__init__",
     ["self.request_states", "self.parent_requests"]),
]
SOURCE_USES["debug_state_core"] = [
    ("vllm.v1.engine.core", "EngineCoreProc._handle_client_request",
     ["getattr(self, method_name)"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler.__init__",
     ["self.requests:", "self.waiting =", "self.skipped_waiting =", "self.running:",
      "self.finished_req_ids:", "self.kv_cache_manager = "]),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.__init__",
     ["self.coordinator = ", "self.block_pool = "]),
    ("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.__init__",
     ["self.single_type_managers = "]),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager.__init__",
     ["self.req_to_blocks:", "self.num_cached_block:"]),
    ("vllm.v1.core.block_pool", "BlockPool.__init__",
     ["self.num_gpu_blocks = ", "self.null_block = "]),
    ("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks", ["free_block_queue"]),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device", ["self.model_runner"]),
    ("vllm.v1.worker.gpu_worker", "Worker.init_device", ["self.model_runner"]),
    (V1, "GPUModelRunner.__init__", ["self.requests:", "self.input_batch = "]),
    (f"{GPU}.model_runner", "GPUModelRunner.__init__", ["self.req_states = "]),
]


def _resolve(module: str, dotted: str):
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _original(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _cases(table):
    return [pytest.param(patch, *row, id=f"{patch}:{row[1]}")
            for patch, rows in table.items() for row in rows]


# The token-id checks: the three InputProcessor methods they wrap, and what they read
# (the rendered prompt's type and ids, the model's vocabulary, the sampling parameters'
# fields, the tokenizer's encoding of bad_words, which process_inputs makes).
IP = "vllm.v1.engine.input_processor"
FUNCTIONS["token_id_validation"] = [
    (IP, "InputProcessor._validate_params", ["self", "params", "supported_tasks"]),
    (IP, "InputProcessor._validate_model_input", ["self", "prompt_input", "prompt_type"]),
    (IP, "InputProcessor.process_inputs",
     ["self", "request_id", "prompt", "params", "supported_tasks", "arrival_time",
      "lora_request", "tokenization_kwargs", "trace_headers", "priority",
      "data_parallel_rank", "resumable"]),
]
NAMES["token_id_validation"] = [
    ("vllm.config.model", "ModelConfig.get_vocab_size"),
    ("vllm.sampling_params", "SamplingParams.bad_words_token_ids"),
    ("vllm.sampling_params", "SamplingParams.__struct_fields__"),
]
SOURCE_USES["token_id_validation"] = [
    (IP, "InputProcessor._validate_model_input",
     ['prompt_input["type"] == "embeds"', 'prompt_input["prompt_token_ids"]']),
    (IP, "InputProcessor.process_inputs",
     ["self._validate_params(params", "self._validate_model_inputs(",
      "sampling_params.update_from_tokenizer("]),
    # a plain ValueError raised under this frame is named as structured_outputs'
    ("vllm.sampling_params", "SamplingParams.verify", ["self._validate_structured_outputs("]),
]


FUNCTIONS["top_p_one_rows"] = [
    ("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p_pytorch",
     ["logits", "k", "p", "allow_cpu_sync"]),
]
# the cut the patch neutralises for p >= 1 rows
SOURCE_USES["top_p_one_rows"] = [
    ("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p_pytorch",
     ["probs_sum <= 1 - p.unsqueeze(dim=1)"]),
]


# Shutdown: AsyncLLM.shutdown stops the engine core, then the pending requests are
# aborted in the output processor on the output handler's loop; a request arriving
# later fails on the dead flag that the client's resources set.
ALLM = "vllm.v1.engine.async_llm"
FUNCTIONS["shutdown_answers"] = [
    (ALLM, "AsyncLLM.shutdown", ["self", "timeout"]),
    ("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests",
     ["self", "request_ids", "internal"]),
    ("vllm.utils.async_utils", "run_in_loop", ["loop", "function", "args"]),
]
SOURCE_USES["shutdown_answers"] = [
    (ALLM, "AsyncLLM.__init__",
     ["self.output_processor = ", "self.output_handler: asyncio.Task | None = None"]),
    (ALLM, "AsyncLLM._run_output_handler", ["self.output_handler = asyncio.create_task("]),
    (ALLM, "AsyncLLM.shutdown", ["engine_core.shutdown(timeout=timeout)",
                                 "cancel_task_threadsafe(handler)"]),
    (ALLM, "AsyncLLM.add_request", ["if self.errored:", "raise EngineDeadError()"]),
    ("vllm.v1.engine.output_processor", "OutputProcessor.__init__", ["self.request_states"]),
    ("vllm.v1.engine.output_processor", "OutputProcessor.abort_requests",
     ["self.request_states.pop(request_id, None)", "finish_reason=FinishReason.ABORT",
      "req_state.queue.put(request_output)"]),
    ("vllm.v1.engine.core_client", "BackgroundResources.__call__",
     ["self.engine_dead = True"]),
]

# Request errors as people read them (branch firsthour): the API server's validation
# handler, whose answer the patch rewrites, and the serving modules whose loggers it
# filters; `/v1/models` cards; the shutdown's output-handler log.
API_SERVER = "vllm.entrypoints.openai.api_server"
FUNCTIONS["validation_messages"] = [
    (API_SERVER, "validation_exception_handler", ["req", "exc"]),
]
SOURCE_USES["validation_messages"] = [
    (API_SERVER, "build_app",
     ["app.exception_handler(RequestValidationError)(validation_exception_handler)"]),
    ("vllm.entrypoints.serve.utils.server_utils", "validation_exception_handler",
     ["JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)"]),
]
SOURCE_USES["refusal_log"] = [
    ("vllm.entrypoints.openai.completion.serving",
     "OpenAIServingCompletion.completion_stream_generator",
     ['logger.exception("Error in completion stream generator.")']),
    ("vllm.entrypoints.openai.chat_completion.serving",
     "OpenAIServingChat.chat_completion_stream_generator",
     ['logger.exception("Error in chat completion stream generator.")']),
    ("vllm.entrypoints.scale_out.token_in_token_out.serving",
     "ServingTokens.serve_tokens_stream_generator",
     ['logger.exception("Error in token generation stream.")']),
]
NAMES["refusal_log"] = [("vllm.exceptions", "VLLMClientError")]
FUNCTIONS["models_dtype"] = [
    ("vllm.entrypoints.openai.models.serving", "OpenAIServingModels.show_available_models",
     ["self"]),
]
SOURCE_USES["models_dtype"] = [
    ("vllm.entrypoints.openai.models.serving", "OpenAIServingModels.__init__",
     ["self.model_config = ", "self.base_model_paths = base_model_paths"]),
]
FUNCTIONS["shutdown_log"] = [(ALLM, "AsyncLLM.shutdown", ["self", "timeout"])]
SOURCE_USES["shutdown_log"] = [
    (ALLM, "AsyncLLM._run_output_handler",
     ['logger.exception("AsyncLLM output_handler failed.")']),
]


def test_every_patch_has_a_contract():
    covered = set(FUNCTIONS) | set(NAMES) | set(FIELDS) | set(SOURCE_USES)
    assert set(REGISTRY) <= covered, sorted(set(REGISTRY) - covered)


@pytest.fixture(scope="module", autouse=True)
def patched():
    patching.apply_all()


@pytest.mark.parametrize("patch,module,name,params", _cases(FUNCTIONS))
def test_wrapped_functions_keep_their_signatures(patch, module, name, params):
    try:
        fn = _original(_resolve(module, name))
    except AttributeError:
        pytest.fail(f"seam {patch!r} moved: {module}.{name} no longer exists")
    got = list(inspect.signature(fn).parameters)
    assert got == params, f"seam {patch!r} moved: {module}.{name}{tuple(got)}"


@pytest.mark.parametrize("patch,module,name", _cases(NAMES))
def test_names_the_patches_use_exist(patch, module, name):
    try:
        _resolve(module, name)
    except AttributeError:
        pytest.fail(f"seam {patch!r} moved: {module}.{name} no longer exists")


@pytest.mark.parametrize("patch,module,name,fields", _cases(FIELDS))
def test_dataclass_fields_the_patches_read_exist(patch, module, name, fields):
    have = {f.name for f in dataclasses.fields(_resolve(module, name))}
    missing = sorted(set(fields) - have)
    assert not missing, f"seam {patch!r} moved: {module}.{name} lost fields {missing}"


@pytest.mark.parametrize("patch,module,name,uses", _cases(SOURCE_USES))
def test_upstream_code_still_sets_what_the_patches_read(patch, module, name, uses):
    source = inspect.getsource(_original(_resolve(module, name)))
    missing = [u for u in uses if u not in source]
    assert not missing, f"seam {patch!r} moved: {module}.{name} no longer has {missing}"


def test_versions_the_patches_were_written_against():
    import triton
    import vllm
    assert vllm.__version__.split("+")[0] == "0.27.1", "every seam: vLLM moved"
    assert triton.__version__.startswith("3.9."), (
        f"interpreter patches: written for Triton 3.9, found {triton.__version__}")
