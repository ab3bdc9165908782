"""The seam contract as data: what each patch relies on in upstream vLLM (and Triton).

Plain data, no vLLM import. Keyed by patch name (the names in `patches.REGISTRY`).
Four kinds of entry:

- `Function`: an upstream function or method a patch wraps or calls, with the parameter
  names of the original in order (the wrappers read arguments by position or by name);
- `Name`: a dotted name that must resolve in a module (class, attribute, enum member);
- `Fields`: fields of a dataclass / struct that a patch reads;
- `SourceUses`: text the upstream function's source must still contain (what it sets or
  calls that a patch reads or relies on).

Two consumers: `tests/patches/test_seams.py` checks every entry against the installed vLLM by
importing it, and `python -m vllm_sampling_mask.tools.seam_report PATH` checks them statically
(`ast`) against any vLLM source tree or wheel, without importing it.

Per-release differences are data, not code: every entry holds over a span of the
supported releases (`releases.RELEASES`), `since` one (inclusive) `until` the release
that changed it (exclusive), open-ended by default. When a release changes a seam, the
old entry gets `until=` that release and a new entry with the release's own shape is
added beside it with `since=`; a module the release moved is written `{role}` and read
from the release's profile (`Release.modules`); a version that is not listed is read as
`releases.nearest(version)`. A patch's record reaches its entries (`Patch.seams`), and
`patches.seam_entries()` picks those of one release, leaving out a patch that is not
applied there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from vllm_sampling_mask import releases
from vllm_sampling_mask.releases import Release

__all__ = ["Function", "Name", "Fields", "SourceUses", "Entry", "SEAMS", "applies",
           "resolved", "release_of"]

Since = Union[str, None]


@dataclass(frozen=True)
class Function:
    """`module.name` (dotted for methods) exists with exactly these parameter names."""
    module: str
    name: str
    params: tuple[str, ...]
    since: Since = None
    until: Since = None


@dataclass(frozen=True)
class Name:
    """`module.name` (dotted) resolves."""
    module: str
    name: str
    since: Since = None
    until: Since = None


@dataclass(frozen=True)
class Fields:
    """The dataclass (or struct) `module.name` still has these fields."""
    module: str
    name: str
    fields: tuple[str, ...]
    since: Since = None
    until: Since = None


@dataclass(frozen=True)
class SourceUses:
    """The source of `module.name` still contains each of these strings."""
    module: str
    name: str
    uses: tuple[str, ...]
    since: Since = None
    until: Since = None


Entry = Union[Function, Name, Fields, SourceUses]


def release_of(version: str) -> Release:
    """The profile whose entries describe vLLM `version` (`releases.nearest`: itself,
    or for a release that is not listed, the next port read by `seam_report`, the
    newest listed release not newer than it)."""
    return releases.nearest(version)


def applies(entry: Entry, version: str | None) -> bool:
    """Whether `entry` holds for vLLM `version` ("0.27.1", local suffix ignored;
    None: every entry)."""
    return version is None or releases.within(release_of(version), entry.since, entry.until)


def resolved(entry: Entry, version: str | None) -> Entry:
    """`entry` with its `{role}` module read from `version`'s profile (None: as written)."""
    if version is None or not entry.module.startswith("{"):
        return entry
    return replace(entry, module=releases.resolve(entry.module, release_of(version)))


def _f(module: str, name: str, *params: str, since: Since = None, until: Since = None
       ) -> Function:
    return Function(module, name, tuple(params), since, until)


def _n(module: str, name: str, since: Since = None, until: Since = None) -> Name:
    return Name(module, name, since, until)


def _d(module: str, name: str, *fields: str, since: Since = None, until: Since = None
       ) -> Fields:
    return Fields(module, name, tuple(fields), since, until)


def _s(module: str, name: str, *uses: str, since: Since = None, until: Since = None
       ) -> SourceUses:
    return SourceUses(module, name, tuple(uses), since, until)


GPU = "vllm.v1.worker.gpu"
CPU_MOE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"
LORA_OPS = "vllm.lora.ops.torch_ops.lora_ops"
API_SERVER = "vllm.entrypoints.openai.api_server"
EXC_REGISTER = "vllm.entrypoints.serve.exception_handling.register"
EXC_HANDLERS = "vllm.entrypoints.serve.exception_handling.handlers"
# the releases that changed a seam: entries before one say `until=` it, from it `since=`
R27, R28, R29, R30, R31, R32 = "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"
R33, R34 = "0.33.0", "0.34.0"
# `reload_weights`' parameters (the runner's; the worker's own from 0.34)
_RELOAD = ("self", "weights_iterator", "weights_path", "is_checkpoint_format")
# Where a runner adapter asks whether its worker is the executor's output rank
# (`patches/worker/_runner.py`): the groups, and the executor's own definition of that rank.
_PS = "vllm.distributed.parallel_state"
_OUTPUT_RANK = (
    _n(_PS, "get_pp_group"), _n(_PS, "get_tp_group"), _n(_PS, "get_pcp_group"),
    _n(_PS, "GroupCoordinator.is_first_rank"), _n(_PS, "GroupCoordinator.is_last_rank"),
    _n("vllm.v1.executor.uniproc_executor", "ExecutorWithExternalLauncher"),
    _s("vllm.config.parallel", "ParallelConfig.__post_init__", '"external_launcher"'),
    _s("vllm.v1.executor.multiproc_executor", "MultiprocExecutor._get_output_rank",
       "self.world_size", "self.parallel_config.tensor_parallel_size",
       "self.parallel_config.prefill_context_parallel_size"),
)
V1 = "vllm.v1.worker.gpu_model_runner"
# the generate route's modules (`serve.disagg` on 0.24, `scale_out.token_in_token_out`
# from 0.27)
TITO_P = "{generate_protocol}"
TITO = "{generate_serving}"
TITO_R = "{generate_router}"
# vLLM's dev-mode RL routes (`serve.dev.rlhf` up to 0.31, `rl.online` from 0.32)
RL = "{rl_router}"
CMPL = "vllm.entrypoints.openai.completion"
CHAT = "vllm.entrypoints.openai.chat_completion"
API = "vllm.entrypoints.openai.api_server"
IP = "vllm.v1.engine.input_processor"
ALLM = "vllm.v1.engine.async_llm"
OP = "vllm.v1.engine.output_processor"
SCHED = "vllm.v1.core.sched.scheduler"
TKTP = "vllm.v1.sample.ops.topk_topp_sampler"
REJECTION = "vllm.v1.sample.rejection_sampler"

_PROCESS_INPUTS = ("self", "request_id", "prompt", "params", "supported_tasks",
                   "arrival_time", "lora_request", "tokenization_kwargs", "trace_headers",
                   "priority", "data_parallel_rank", "resumable")
_PROCESS_INPUTS_028 = (*_PROCESS_INPUTS, "session_id")
_PROCESS_INPUTS_031 = (*_PROCESS_INPUTS_028, "kv_hints")
_PROCESS_INPUTS_SPANS = (
    _f("vllm.v1.engine.input_processor", "InputProcessor.process_inputs", *_PROCESS_INPUTS,
       until=R28),
    _f("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
       *_PROCESS_INPUTS_028, since=R28, until=R31),
    _f("vllm.v1.engine.input_processor", "InputProcessor.process_inputs",
       *_PROCESS_INPUTS_031, since=R31),
)

SEAMS: dict[str, tuple[Entry, ...]] = {
    # -- packaging ---------------------------------------------------------------------
    "metadata_alias": (
        _n("vllm.version", "__version__"),
    ),
    # -- Model Runner V2 on a CPU host under TRITON_INTERPRET=1 -----------------------------
    "interpreter_has_triton": (
        _n("vllm.triton_utils.importing", "HAS_TRITON"),
    ),
    "interpreter_libdevice": (
        _n(f"{GPU}.sample.gumbel", "tldevice"),
    ),
    "interpreter_patch_cache": (
        _f("triton.runtime.interpreter", "_patch_lang", "fn"),
    ),
    "interpreter_top_k_top_p": (
        _f("triton.runtime.interpreter", "_patch_lang_core", "lang", "scope"),
        _f(TKTP, "apply_top_k_top_p", "logits", "k", "p", until=R33),
        _f(TKTP, "apply_top_k_top_p", "logits", "k", "p", "has_topp_only_rows", since=R33),
        _f(TKTP, "apply_top_k_top_p_pytorch", "logits", "k", "p", "allow_cpu_sync"),
    ),
    "interpreter_masks": (
        # Triton 3.6 (0.24's torch), then 3.9, then 3.8 (0.33's torch 2.14) with 3.6's
        # parameters (`Release.triton`)
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_load", "self",
           "ptrs", "mask", "other", "cache_modifier", "eviction_policy", "is_volatile",
           until="0.27.1"),
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_load", "self",
           "ptrs", "mask", "other", "cache_modifier", "eviction_policy", "is_volatile",
           since=R33),
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_store", "self",
           "ptrs", "value", "mask", "cache_modifier", "eviction_policy", since=R33),
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_store", "self",
           "ptrs", "value", "mask", "cache_modifier", "eviction_policy", until="0.27.1"),
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_load", "self",
           "ptrs", "mask", "other", "cache_policy", "is_volatile", since="0.27.1",
           until=R33),
        _f("triton.runtime.interpreter", "InterpreterBuilder.create_masked_store", "self",
           "ptrs", "value", "mask", "cache_policy", since="0.27.1", until=R33),
        _n("triton.runtime.interpreter", "TensorHandle"),
    ),
    "interpreter_dummy_run": (
        _f(f"{GPU}.model_runner", "GPUModelRunner._dummy_sampler_run", "self",
           "hidden_states"),
    ),
    # -- the CPU kernels a CUDA wheel lacks on a CPU host (the calls they answer) --------
    "cpu_op_memory_env": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _s("vllm.v1.worker.cpu_worker", "CPUWorker.__init__", "init_cpu_memory_env("),
    ),
    "cpu_op_scheduler_metadata": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _s("{cpu_ops}", "cpu_attn_get_scheduler_metadata", "get_scheduler_metadata("),
    ),
    "cpu_op_rotary_embedding": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _f("vllm._custom_ops", "rotary_embedding", "positions", "query", "key",
           "head_size", "cos_sin_cache", "is_neox", "rope_dim_offset", "inverse"),
    ),
    "cpu_op_reshape_and_cache": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _f("{cpu_ops}", "cpu_attn_reshape_and_cache", "key", "value", "key_cache",
           "value_cache", "slot_mapping", "isa", "k_scale", "v_scale", "kv_cache_dtype"),
    ),
    "cpu_op_gumbel_argmax": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _s(TKTP, "TopKTopPSampler.forward_cpu", "torch.ops._C.fused_gumbel_argmax("),
    ),
    "cpu_op_greedy_argmax": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _s("vllm.v1.sample.sampler", "Sampler.greedy_sample", "torch.ops._C.greedy_argmax("),
    ),
    "cpu_op_attention": (
        _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
        _f("{cpu_ops}", "cpu_attention_with_kv_cache", "query", "key_cache", "value_cache",
           "output", "query_start_loc", "seq_lens", "scale", "causal", "alibi_slopes",
           "sliding_window", "block_table", "softcap", "scheduler_metadata", "s_aux",
           "dynamic_causal", "k_scale", "v_scale", "kv_cache_dtype"),
    ),
    # -- fixes of upstream bugs ------------------------------------------------------------
    "top_p_one_rows": (
        _f(TKTP, "apply_top_k_top_p_pytorch", "logits", "k", "p", "allow_cpu_sync"),
        # the cut the patch neutralises for p >= 1 rows
        _s(TKTP, "apply_top_k_top_p_pytorch", "probs_sum <= 1 - p.unsqueeze(dim=1)"),
    ),
    "cpu_seeded_sampling": (
        _f(TKTP, "TopKTopPSampler.forward_cpu", "self", "logits", "generators", "k", "p"),
        _f(TKTP, "empty_exponential_noise_like", "probs", "use_fp64_gumbel"),
        _f(TKTP, "sample_with_exponential_noise", "probs", "q"),
        # the condition the patch takes over, and what upstream returns per logprobs mode
        _s(TKTP, "TopKTopPSampler.forward_cpu", "len(generators) != logits.shape[0]",
           "apply_top_k_top_p(logits, k, p)", 'self.logprobs_mode == "processed_logits"',
           'self.logprobs_mode == "processed_logprobs"',
           "q[i].exponential_(generator=generator)"),
    ),
    "cpu_moe_float32_amx": (
        _f(CPU_MOE, "CPUFusedMOE.check_grouped_gemm", "self", "layer"),
        _s(CPU_MOE, "CPUFusedMOE.check_grouped_gemm",
           "supports_amx = torch.cpu._is_amx_tile_supported()", "dtype == torch.bfloat16",
           "raise RuntimeError(self._grouped_gemm_alignment_error(layer))"),
        _s(CPU_MOE, "CPUFusedMOE.__init__", "self.check_grouped_gemm(layer)"),
    ),
    "cpu_amx_tile_permission": (
        # the module whose import applies it: a process imports it when it picks the
        # CPU platform, before any CPU kernel runs
        _n("vllm.platforms.cpu", "CpuPlatform"),
        _s("vllm.platforms", "cpu_platform_plugin", '"vllm.platforms.cpu.CpuPlatform"'),
    ),
    "cpu_reload_tied_lm_head": (
        _f("vllm.v1.worker.gpu_worker", "Worker.reload_weights", "self", "args", "kwargs",
           until=R34),
        _f("vllm.v1.worker.gpu_worker", "Worker.reload_weights", *_RELOAD, since=R34),
        _n("vllm.model_executor.layers.vocab_parallel_embedding",
           "UnquantizedEmbeddingMethod.process_weights_after_loading"),
        _s("vllm.model_executor.layers.vocab_parallel_embedding",
           "UnquantizedEmbeddingMethod.process_weights_after_loading",
           "dispatch_cpu_unquantized_gemm(layer, remove_weight=False)"),
        _s("vllm.model_executor.layers.vocab_parallel_embedding",
           "UnquantizedEmbeddingMethod.tie_weights", "layer.weight = embed_tokens.weight"),
        _s("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm",
           "layer.cpu_linear = "),
    ),
    "cpu_colocated_load_weights": (
        _f("vllm.v1.worker.gpu_worker", "Worker.load_model", "self", "load_dummy_weights"),
        _f("vllm.v1.worker.gpu_worker", "Worker.execute_model", "self", "scheduler_output"),
        _n("vllm.model_executor.model_loader.reload.layerwise", "get_layerwise_info"),
        _n("vllm.model_executor.model_loader.reload.layerwise", "LayerReloadingInfo.can_load"),
        _f("vllm.model_executor.model_loader.reload.layerwise", "initialize_layerwise_reload",
           "model", until=R34),
        _f("vllm.model_executor.model_loader.reload.layerwise", "initialize_layerwise_reload",
           "model", "defer_processing", since=R34),
        _n("vllm.model_executor.model_loader.reload.layerwise", "finalize_layerwise_reload"),
        _s("vllm.model_executor.model_loader.utils", "initialize_model",
           "record_metadata_for_reloading(model)"),
        _s("vllm.model_executor.layers.linear", "UnquantizedLinearMethod.process_weights_after_loading",
           "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"),
    ),
    "reload_weights_recovery": (
        _f("vllm.v1.worker.gpu_worker", "Worker.reload_weights", "self", "args", "kwargs",
           until=R34),
        _f("vllm.v1.worker.gpu_worker", "Worker.reload_weights", *_RELOAD, since=R34),
        _f(V1, "GPUModelRunner.reload_weights", *_RELOAD, until=R34),
        _f(f"{GPU}.model_runner", "GPUModelRunner.reload_weights", *_RELOAD, since=R34),
        _n("vllm.model_executor.model_loader.reload.layerwise", "LAYERWISE_INFO"),
        _n("vllm.model_executor.model_loader.reload.layerwise", "LOADING_LAYERS"),
        _n("vllm.model_executor.model_loader.reload.types", "LayerReloadingInfo.reset"),
        _s("vllm.model_executor.model_loader.reload.layerwise",
           "initialize_layerwise_reload", "restore_layer_on_meta(layer, info)"),
        # the model config's fields a reload from a path rewrites before it loads
        _s(V1, "GPUModelRunner.reload_weights", "model_config.model = weights_path",
           until=R32),
        _s("vllm.model_executor.model_loader.reload.inplace", "reload_weights",
           "model_config.model = weights_path", since=R32),
    ),
    "collective_rpc_refusals": (
        _f(ALLM, "AsyncLLM.collective_rpc", "self", "method", "timeout", "args", "kwargs"),
        # where a call by name finds its method: the wrapper, then the worker
        _s("vllm.v1.worker.worker_base", "WorkerWrapperBase.__getattr__",
           "getattr(self.worker, attr)"),
        _d("vllm.config.parallel", "ParallelConfig", "worker_cls", "worker_extension_cls"),
        _n("vllm.utils.import_utils", "resolve_obj_by_qualname"),
        _s("vllm.v1.engine.core", "EngineCoreProc._invoke_utility_method",
           'output.failure_message = f"Call to {name} method failed: {str(e)}"'),
        _s("vllm.v1.engine.core_client", "_process_utility_output",
           "future.set_exception(Exception(failure_message))"),
    ),
    "collective_rpc_refusals_sync": (
        _f("vllm.v1.engine.llm_engine", "LLMEngine.collective_rpc", "self", "method",
           "timeout", "args", "kwargs"),
        _s("vllm.v1.engine.core_client", "_process_utility_output",
           "future.set_exception(Exception(failure_message))"),
    ),
    "rpc_route_body": (
        _n("vllm.entrypoints.serve.dev.rpc.api_router", "router", until=R32),
        _s("vllm.entrypoints.serve.dev.rpc.api_router", "collective_rpc",
           'method = body.get("method")', "await raw_request.json()", until=R32),
        _s("vllm.entrypoints.serve.dev.rpc.api_router", "attach_router",
           "app.include_router(router)", until=R32),
    ),
    "rl_route_bodies": (
        _n(RL, "router"),
        # the endpoints it puts its checks before, by name (`raw_request`), and the
        # body fields each reads (`rl_route_bodies.ROUTE_FIELDS`)
        _f(RL, "init_weight_transfer_engine", "raw_request", until=R32),
        _s(RL, "init_weight_transfer_engine", 'body.get("init_info")', until=R32),
        _f(RL, "init_weight_transfer_engine", "raw_request", "init_info", since=R32),
        _f(RL, "start_weight_update", "raw_request"),
        _s(RL, "start_weight_update", 'body.get("is_checkpoint_format", True)', until=R27),
        _f(RL, "start_draft_weight_update", "raw_request", since=R27),
        _f(RL, "update_weights", "raw_request", until=R32),
        _s(RL, "update_weights", 'body.get("update_info")', until=R32),
        _f(RL, "update_weights", "raw_request", "update_info", since=R32),
        _f(RL, "finish_weight_update", "raw_request", until=R27),
        _f(RL, "finish_weight_update", "raw_request", "weight_version", since=R27),
        _f(RL, "abort_requests", "raw_request", since=R27),
        _s(RL, "abort_requests", 'request_ids = body.get("request_ids")',
           "await engine.abort(request_ids)", since=R27),
        # no backend: the worker raises (an HTTP 500); the config says so before
        _d("vllm.config.vllm", "VllmConfig", "weight_transfer_config"),
        _s("vllm.v1.worker.gpu_worker", "Worker._check_weight_transfer_engine",
           "self.weight_transfer_engine is None"),
    ),
    "abort_request_ids": (
        _f(TITO_R, "attach_router", "app"),
        _s(TITO_R, "attach_router", 'body.get("request_ids")',
           "app.include_router(router)", until=R32),
        _n(TITO_R, "router", since=R32),
        _n(TITO_R, "abort_router", since=R32),
        _f(TITO_R, "abort_requests", "raw_request", since=R32),
        # 0.34 validates the body with a model of its own (`AbortRequestsRequest`)
        _s(TITO_R, "abort_requests", 'request_ids = body.get("request_ids")',
           ".abort(request_ids)", since=R32, until=R34),
    ),
    "rpc_refusal_log": (
        _s("vllm.v1.engine.core", "EngineCoreProc._invoke_utility_method",
           'logger.exception("Invocation of %s method failed", name)'),
        _s("vllm.v1.executor.multiproc_executor", "WorkerProc",
           'logger.exception("WorkerProc hit an exception.")'),
    ),
    "rl_routes_auth": (
        _f("{auth}", "AuthenticationMiddleware.__call__", "self", "scope", "receive", "send"),
        _f("{auth}", "AuthenticationMiddleware.verify_token", "self", "headers"),
        _s("{auth}", "AuthenticationMiddleware.__call__",
           "url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers)",
           'JSONResponse(content={"error": "Unauthorized"}, status_code=401)'),
    ),
    "cpu_lora_base_rows": (
        _f(LORA_OPS, "bgmv_shrink", "inputs", "lora_b_weights", "output_tensor",
           "lora_indices_tensor", "scaling"),
        _f(LORA_OPS, "bgmv_expand", "inputs", "lora_b_weights", "output_tensor",
           "lora_indices_tensor", "add_inputs"),
        _f(LORA_OPS, "bgmv_expand_slice", "inputs", "lora_b_weights", "output_tensor",
           "lora_indices_tensor", "slice_offset", "slice_size", "add_inputs"),
        # the gather that reads -1 as the last slot (0.33.0 clamps it: the patch ends
        # there), and the prefill ops going through the module's (wrapped) bgmv ops
        _s(LORA_OPS, "bgmv_shrink", "lora_b_weights[lora_indices_tensor]"),
        _s(LORA_OPS, "sgmv_shrink", "bgmv_shrink("),
        _s(LORA_OPS, "sgmv_expand", "bgmv_expand("),
        _s(LORA_OPS, "sgmv_expand_slice", "bgmv_expand_slice("),
        _n("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"),
    ),
    "cpu_generator_rewind": (
        _f(V1, "GPUModelRunner._sample", "self", "logits", "spec_decode_metadata"),
        _f(V1, "GPUModelRunner._bookkeeping_sync", "self", "scheduler_output",
           "sampler_output", "logits", "hidden_states", "num_scheduled_tokens"),
        _s(V1, "GPUModelRunner._bookkeeping_sync", "gen.set_offset(",
           "self.discard_request_mask.np"),
    ),
    # The token-id checks: the three InputProcessor methods they wrap, and what they read
    # (the rendered prompt's type and ids, the model's vocabulary, the sampling
    # parameters' fields, the tokenizer's encoding of bad_words, which process_inputs
    # makes).
    "token_id_validation": (
        _f(IP, "InputProcessor._validate_params", "self", "params", "supported_tasks"),
        _f(IP, "InputProcessor._validate_model_input", "self", "prompt_input",
           "prompt_type"),
        *_PROCESS_INPUTS_SPANS,
        _n("vllm.config.model", "ModelConfig.get_vocab_size"),
        _n("vllm.sampling_params", "SamplingParams.bad_words_token_ids"),
        _n("vllm.sampling_params", "SamplingParams.__struct_fields__"),
        _s(IP, "InputProcessor._validate_model_input",
           'prompt_input["type"] == "embeds"', 'prompt_input["prompt_token_ids"]'),
        _s(IP, "InputProcessor.process_inputs", "self._validate_params(params",
           "self._validate_model_inputs(", "sampling_params.update_from_tokenizer("),
        # a plain ValueError raised under this frame is named as structured_outputs'
        _s("vllm.sampling_params", "SamplingParams.verify",
           "self._validate_structured_outputs("),
        # a client error already (`Release.client_error`) passes as it is
        _n("vllm.exceptions", "VLLMValidationError", until=R27),
        _n("vllm.exceptions", "VLLMClientError", since=R27),
    ),
    # 0.24's SamplingParams.from_optional, which the OpenAI requests call with their
    # logit_bias (by keyword), and its bare conversion of the keys
    "logit_bias_keys": (
        _f("vllm.sampling_params", "SamplingParams.from_optional", "n", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k",
           "min_p", "seed", "stop", "stop_token_ids", "bad_words", "thinking_token_budget",
           "include_stop_str_in_output", "ignore_eos", "max_tokens", "min_tokens",
           "logprobs", "prompt_logprobs", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
           "output_kind", "structured_outputs", "logit_bias", "allowed_token_ids",
           "extra_args", "skip_clone", "repetition_detection"),
        _s("vllm.sampling_params", "SamplingParams.from_optional",
           "int(token): min(100.0, max(-100.0, bias))"),
        _s(f"{CMPL}.protocol", "CompletionRequest.to_sampling_params",
           "SamplingParams.from_optional(", "logit_bias=self.logit_bias"),
        _s(f"{CHAT}.protocol", "ChatCompletionRequest.to_sampling_params",
           "SamplingParams.from_optional(", "logit_bias=self.logit_bias"),
    ),
    # Shutdown: AsyncLLM.shutdown stops the engine core, then the pending requests are
    # aborted in the output processor on the output handler's loop; a request arriving
    # later fails on the dead flag that the client's resources set.
    "shutdown_answers": (
        _f(ALLM, "AsyncLLM.shutdown", "self", "timeout"),
        _f(OP, "OutputProcessor.abort_requests", "self", "request_ids", "internal"),
        _f("vllm.utils.async_utils", "run_in_loop", "loop", "function", "args"),
        _s(ALLM, "AsyncLLM.__init__", "self.output_processor = ",
           "self.output_handler: asyncio.Task | None = None"),
        _s(ALLM, "AsyncLLM._run_output_handler",
           "self.output_handler = asyncio.create_task(",
           "output_processor.propagate_error(e)"),
        _f(OP, "OutputProcessor.propagate_error", "self", "e"),
        _n("vllm.v1.engine.exceptions", "EngineDeadError"),
        _s(ALLM, "AsyncLLM.shutdown", "engine_core.shutdown(timeout=timeout)",
           "cancel_task_threadsafe(handler)"),
        _s(ALLM, "AsyncLLM.add_request", "if self.errored:", "raise EngineDeadError()"),
        _s(OP, "OutputProcessor.__init__", "self.request_states"),
        _s(OP, "OutputProcessor.abort_requests",
           "self.request_states.pop(request_id, None)", "finish_reason=FinishReason.ABORT",
           "req_state.queue.put(request_output)"),
        _s("vllm.v1.engine.core_client", "BackgroundResources.__call__",
           "self.engine_dead = True"),
    ),
    # -- the engine flag and its validation ------------------------------------------------
    "model_config": (
        _n("vllm.config.model", "ModelConfig"),
    ),
    "engine_args": (
        _f("vllm.engine.arg_utils", "EngineArgs.add_cli_args", "parser"),
        _f("vllm.engine.arg_utils", "EngineArgs.create_model_config", "self"),
        _f("vllm.engine.arg_utils", "EngineArgs.create_engine_config", "self",
           "usage_context", "headless"),
        _d("vllm.engine.arg_utils", "EngineArgs", "logprobs_mode", "speculative_config",
           "logits_processors"),
    ),
    "request_validation": (
        _f(IP, "InputProcessor._validate_params", "self", "params", "supported_tasks"),
        *_PROCESS_INPUTS_SPANS,
    ),
    # -- the mask's path: sampler -> runner output -> scheduler -> client -> user ----------
    "sampler": (
        _f(f"{GPU}.sample.sampler", "Sampler.sample", "self", "logits",
           "expanded_idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "return_logprobs", until=R28),
        _f(f"{GPU}.sample.sampler", "Sampler.sample", "self", "logits",
           "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "return_logprobs", since=R28, until=R31),
        _f(f"{GPU}.sample.sampler", "Sampler.sample", "self", "logits",
           "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "seq_lens_upper_bound_np", "return_logprobs",
           since=R31),
        # a verify step's processed logits: each call's result handed to the step
        # (the rejection sampler processes every position with it)
        _f(f"{GPU}.sample.sampler", "Sampler.apply_sampling_params", "self", "logits",
           "expanded_idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "skip_top_k_top_p", until=R28),
        _f(f"{GPU}.sample.sampler", "Sampler.apply_sampling_params", "self", "logits",
           "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "skip_top_k_top_p", since=R28, until=R31),
        _f(f"{GPU}.sample.sampler", "Sampler.apply_sampling_params", "self", "logits",
           "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos", "input_ids",
           "expanded_local_pos", "seq_lens_upper_bound_np", "skip_top_k_top_p",
           since=R31),
        _s(f"{GPU}.sample.sampler", "Sampler.__init__", "self.sampling_states",
           "self.use_flashinfer"),
        _s(f"{GPU}.sample.states", "SamplingStates.__init__", "self.top_k",
           "self.vocab_size"),
        # support logprobs: min-p's input is the temperature-scaled logits
        _f(f"{GPU}.sample.states", "SamplingStates.apply_min_p", "self", "logits",
           "expanded_idx_mapping", "idx_mapping_np"),
        _s(f"{GPU}.sample.sampler", "Sampler.apply_sampling_params",
           "self.sampling_states.apply_temperature(", "self.sampling_states.apply_min_p("),
    ),
    "runner": (
        _f(f"{GPU}.model_runner", "GPUModelRunner.load_model", "self",
           "load_dummy_weights", "args", "kwargs", until=R32),
        _f(f"{GPU}.model_runner", "GPUModelRunner.load_model", "self",
           "load_dummy_weights", "args", "model", "kwargs", since=R32),
        _f(f"{GPU}.model_runner", "GPUModelRunner._dummy_sampler_run", "self",
           "hidden_states"),
        _f(f"{GPU}.model_runner", "GPUModelRunner._remove_request", "self", "req_id"),
        _f(f"{GPU}.model_runner", "GPUModelRunner.sample", "self", "hidden_states",
           "input_batch", "grammar_output"),
        _f(f"{GPU}.model_runner", "GPUModelRunner.sample_tokens", "self", "grammar_output"),
        # the step is open around `sample_tokens`, which samples through `sample`
        _s(f"{GPU}.model_runner", "GPUModelRunner.sample_tokens", "self.sample("),
        # `sample` plans the step from its input batch, the one the sampler or the
        # rejection sampler gets (batch-sharded sampling, which shards it, is refused)
        _s(f"{GPU}.model_runner", "GPUModelRunner.sample", "self.sampler(logits, input_batch)",
           "self.rejection_sampler("),
        _s(f"{GPU}.sample.states", "SamplingStates.__init__", "self.top_k"),
        # the rows that sample nothing (partial prefill chunks), not extracted: the
        # host mirror of upstream's rule (seq_len < prefill_len of the row's slot)
        _d(f"{GPU}.input_batch", "InputBatch", "idx_mapping_np", "seq_lens_cpu_upper_bound"),
        _s(f"{GPU}.sample.sampler", "Sampler.__init__", "self.req_states = req_states"),
        _s(f"{GPU}.sample.sampler", "Sampler.__call__", "get_num_sampled_and_rejected(",
           "input_batch.seq_lens,", "self.req_states.prefill_len.gpu"),
        _n(f"{GPU}.input_batch", "_get_num_sampled_and_rejected_kernel"),
        _s(f"{GPU}.states", "RequestState.__init__", "self.prefill_len = UvaBackedTensor("),
        _s(f"{GPU}.model_runner", "GPUModelRunner.prepare_inputs",
           "num_computed_tokens_np = self.req_states.num_computed_tokens_np[idx_mapping_np]",
           "out=seq_lens_cpu_upper_bound_np[:num_reqs]",
           "seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound"),
        _s(f"{GPU}.model_runner", "GPUModelRunner.load_model", "self.sampler = Sampler("),
        *_OUTPUT_RANK,
    ),
    "async_output": (
        _f(f"{GPU}.async_utils", "AsyncOutput.__init__", "self", "model_runner_output",
           "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
           until=R27),
        _f(f"{GPU}.async_utils", "AsyncOutput.__init__", "self", "model_runner_output",
           "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
           "check_ep_fault", since=R27, until=R28),
        _f(f"{GPU}.async_utils", "AsyncOutput.__init__", "self", "model_runner_output",
           "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
           "check_ep_fault", "routed_experts", since=R28, until=R31),
        _f(f"{GPU}.async_utils", "AsyncOutput.__init__", "self", "model_runner_output",
           "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
           "check_ep_fault", "pending_aux_output", since=R31),
        _f(f"{GPU}.async_utils", "AsyncOutput.get_output", "self"),
        _f(f"{GPU}.async_utils", "stream", "to_stream", "from_stream"),
        _s(f"{GPU}.async_utils", "AsyncOutput.__init__", "self.num_sampled_tokens_np",
           "self.copy_event.record(copy_stream)"),
        _s(f"{GPU}.async_utils", "AsyncOutput.get_output", "self.copy_event.synchronize()"),
    ),
    "runner_output": (
        _d("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "req_id_to_index",
           "sampled_token_ids", until=R34),
        # 0.34: a request's row is its place in `req_ids` (scheduler._rows)
        _d("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "sampled_token_ids",
           since=R34),
    ),
    "sampler_v1": (
        _f("vllm.v1.sample.sampler", "Sampler.sample", "self", "logits",
           "sampling_metadata", "logprobs_mode_override"),
        _s(TKTP, "TopKTopPSampler.forward_native",
           'self.logprobs_mode == "processed_logprobs"'),
        # support logprobs: the temperature-scaled logits exist only as this static
        # method's result (called as `self.apply_temperature`, so an instance
        # attribute shadows it), before the argmax-invariant processors (min-p)
        # and top-k/top-p edit them in place
        _f("vllm.v1.sample.sampler", "Sampler.apply_temperature", "logits", "temp",
           "all_random"),
        _s("vllm.v1.sample.sampler", "Sampler.sample", "logits = self.apply_temperature(",
           "sampling_metadata.logitsprocs.argmax_invariant"),
    ),
    "rejection_sampler": (
        _f(f"{GPU}.spec_decode.rejection_sampler", "RejectionSampler.__call__", "self",
           "logits", "input_batch", "draft_logits", until="0.32.0"),
        _f(f"{GPU}.spec_decode.rejection_sampler", "RejectionSampler.__call__", "self",
           "logits", "input_batch", "draft_logits", "invalid_drafts", since="0.32.0",
           until=R34),
        _f(f"{GPU}.spec_decode.rejection_sampler", "RejectionSampler.__call__", "self",
           "logits", "input_batch", "draft_logits", since=R34),
        # every position's processed logits come from the sampler's own processing
        # (handed to the step by the `sampler` patch's wrapper), rows per request
        # from the host cumsum
        _s(f"{GPU}.spec_decode.rejection_sampler", "RejectionSampler",
           "self.sampler.apply_sampling_params(", "input_batch.cu_num_logits_np"),
        _s(f"{GPU}.sample.sampler", "Sampler.apply_sampling_params",
           "self.sampling_states.apply_min_p("),
    ),
    "rejection_sampler_v1": (
        _f(REJECTION, "RejectionSampler.forward", "self", "metadata", "draft_probs",
           "logits", "sampling_metadata"),
        # the bonus positions go through the plain sampler (`sampler_v1` hands their
        # processed logprobs over); the draft positions' processed logits are what
        # `apply_top_k_top_p`, a module global (wrapped), returns inside the constraints
        _s(REJECTION, "RejectionSampler.forward", "self.sampler(",
           "target_logits = apply_sampling_constraints("),
        _s(REJECTION, "apply_sampling_constraints", "logits.div_(temperature",
           "return apply_top_k_top_p(logits, top_k, top_p)"),
        _f(REJECTION, "apply_top_k_top_p", "logits", "k", "p", until=R33),
        _f(REJECTION, "apply_top_k_top_p", "logits", "k", "p", "has_topp_only_rows",
           since=R33),
        _d("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata", "num_draft_tokens",
           "target_logits_indices", "bonus_logits_indices"),
    ),
    "cpu_verify_expand": (
        _f(REJECTION, "expand_batch_to_tokens", "x", "cu_num_tokens", "num_tokens",
           "replace_from", "replace_to"),
        _s(REJECTION, "apply_sampling_constraints", "expand_batch_to_tokens("),
    ),
    "verify_without_drafts": (
        _f(REJECTION, "apply_sampling_constraints", "logits", "cu_num_draft_tokens",
           "sampling_metadata"),
    ),
    "runner_v1": (
        _f(V1, "GPUModelRunner.__init__", "self", "vllm_config", "device"),
        _f(V1, "GPUModelRunner.sample_tokens", "self", "grammar_output"),
        _f(V1, "AsyncGPUModelRunnerOutput.get_output", "self"),
        _f(V1, "GPUModelRunner._dummy_sampler_run", "self", "hidden_states"),
        _f(V1, "GPUModelRunner._may_reorder_batch", "self", "scheduler_output"),
        _s(V1, "GPUModelRunner.__init__", "self.sampler = Sampler("),
        *_OUTPUT_RANK,
        # the step the sampler extracts into is open around `sample_tokens`, which
        # samples through `_sample`
        _s(V1, "GPUModelRunner.sample_tokens", "self._sample("),
        _s(V1, "GPUModelRunner._sample", "self.sampler("),
        _s("vllm.v1.worker.gpu_input_batch", "InputBatch.__init__", "self.top_k_cpu =",
           "self.generators"),
        _s(V1, "AsyncGPUModelRunnerOutput.get_output",
           "output.sampled_token_ids = valid_sampled_token_ids"),
        # the rows whose sampled token is discarded this step (partial prefill
        # chunks), not extracted: the host buffer `_prepare_inputs` fills for the
        # step and `_bookkeeping_sync` clears (or invalidates) those rows' tokens by
        _s(V1, "GPUModelRunner.__init__", "self.discard_request_mask = self._make_buffer("),
        _s(V1, "GPUModelRunner._prepare_inputs", "self.discard_request_mask.np[:num_reqs] = ("),
        _s(V1, "GPUModelRunner._bookkeeping_sync", "self.discard_request_mask.np[:num_reqs]",
           "valid_sampled_token_ids[int(i)].clear()",
           "invalid_req_indices = discard_sampled_tokens_req_indices.tolist()"),
    ),
    "scheduler": (
        _f(SCHED, "Scheduler.update_from_output", "self", "scheduler_output",
           "model_runner_output"),
        _f(SCHED, "Scheduler.finish_requests", "self", "request_ids", "finished_status"),
        _s(SCHED, "Scheduler.__init__", "self.requests:"),   # a dropped mask's request
        _n(SCHED, "EngineCoreOutput"),
        _n("vllm.v1.engine", "FinishReason.ERROR"),
        _n("vllm.v1.request", "RequestStatus.FINISHED_ERROR"),
    ),
    "core_client": (
        _n("vllm.v1.engine.core_client", "EngineCoreOutputs"),
    ),
    "output_processor": (
        _f(OP, "OutputProcessor.process_outputs", "self", "engine_core_outputs",
           "engine_core_timestamp", "iteration_stats", until=R32),
        _f(OP, "OutputProcessor.process_outputs", "self", "engine_core_outputs",
           "engine_core_timestamp", "iteration_stats", "weight_version", since=R32),
        _f(OP, "RequestState.from_new_request", "tokenizer", "request", "prompt",
           "parent_req", "request_index", "queue", "log_stats", "stream_interval"),
        _f(OP, "RequestState._new_completion_output", "self", "token_ids",
           "finish_reason", "stop_reason"),
        _n("vllm.sampling_params", "RequestOutputKind.DELTA"),
        _s(OP, "OutputProcessor.__init__", "self.request_states"),
    ),
    "completion_output": (
        _f("vllm.outputs", "RequestOutput.add", "self", "next_output", "aggregate"),
        _d("vllm.outputs", "CompletionOutput", "index", "token_ids", "finish_reason"),
    ),
    # -- the HTTP routes -----------------------------------------------------------------
    "generate_protocol": (
        _n(TITO_P, "GenerateRequest"),
        *(_n(TITO_P, name, until=R32) for name in (
            "GenerateResponseChoice", "GenerateResponse")),
        # 0.32: one response and choice class per output mode, streamed or not
        *(_d(TITO_P, f"Generate{mode}{kind}Choice", "index", "token_ids", "sampling_mask",
             since=R32)
          for mode in ("Tokens", "Text") for kind in ("", "Stream")),
        *(_d(TITO_P, f"Generate{mode}{kind}Response", "choices", since=R32)
          for mode in ("Tokens", "Text") for kind in ("", "Stream")),
        _n(TITO_P, "GenerateResponseBase", since=R32),
    ),
    "generate_endpoint": (
        _f(TITO, "ServingTokens.serve_tokens", "self", "request", "raw_request"),
        _f(TITO, "ServingTokens.serve_tokens_full_generator", "self", "request",
           "result_generator", "request_id", "model_name", "request_metadata", until=R33),
        _f(TITO, "ServingTokens.serve_tokens_full_generator", "self", "request",
           "result_generator", "request_id", "model_name", "request_metadata",
           "derender_request", since=R33),
        _f(TITO, "ServingTokens.serve_tokens_stream_generator", "self", "request",
           "result_generator", "request_id", "model_name", "request_metadata", until=R34),
        _f(TITO, "ServingTokens.serve_tokens_stream_generator", "self", "request",
           "result_generator", "request_id", "model_name", "request_metadata", "processors",
           since=R34),
        # the routes: error responses, and the error events `open_stream` turns into them
        _n(TITO_P, "GenerateResponse", until=R32),
        _n(TITO_P, "GenerateResponseBase", since=R32),
        _n(TITO, "ServingTokens.create_error_response"),
        _n("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY"),
        _n("{error_response}", "ErrorResponse"),
        # the release's class of client errors (`Release.client_error`)
        _n("vllm.exceptions", "VLLMValidationError", until=R27),
        _n("vllm.exceptions", "VLLMClientError", since=R27),
        # `StreamMasks`: each result's outputs are iterated once, no chunk is built from a
        # result before them (chat's role chunk aside: `openai_chat`), each chunk is built
        # from the output being iterated and sent as a `data: {json}` event; the choices of
        # full responses are numbered as the patches read them; error responses are
        # what the routes return as HTTP errors.
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           "async for res in result_generator", "for output in res.outputs",
           "i = output.index"),
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           'yield f"data: {chunk.model_dump_json()}\\n\\n"', until=R30),
        # 0.30: chunks leave out absent fields
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           'yield f"data: {chunk.model_dump_json(exclude=exclude)}\\n\\n"', since=R30),
        # sized from the first result: `every_choice_first` hands it every choice ...
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           "num_generated_tokens = [0] * len(res.outputs)", until=R32),
        # ... until 0.32 sizes them by n (fixed upstream)
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           "num_generated_tokens = [0] * sampling_params.n", since=R32),
        # 0.29: unstreamed requests run FINAL_ONLY (fixed upstream)
        _s(TITO, "ServingTokens.serve_tokens",
           "RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY",
           since=R29),
        _s(TITO, "ServingTokens.serve_tokens_full_generator", "index=output.index"),
        _s(TITO_R, "generate", "isinstance(generator, ErrorResponse)"),
    ),
    "generate_route": (
        _f("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
           "app", "supported_tasks"),
        _s("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
           'getattr(args, "enable_scale_out", False)', 'getattr(args, "tokens_only", False)'),
        # 0.32: without the option, 403 stubs the patch replaces (0.30-0.31: no route)
        _s("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
           "disabled_scale_out", since=R32),
        _n(TITO_R, "router"),
    ),
    "json_response": (
        _f("starlette.responses", "JSONResponse.render", "self", "content"),
        # every route returns a full response as the JSON of its bare `model_dump()`
        _s(f"{CMPL}.api_router", "create_completion",
           "JSONResponse(\n            content=generator.model_dump(),\n"),
        _s(f"{CHAT}.api_router", "create_chat_completion",
           "JSONResponse(\n            content=generator.model_dump(),\n"),
        _s(TITO_R, "generate", "return JSONResponse(content=generator.model_dump())"),
    ),
    "completion_protocol": (
        _f(f"{CMPL}.protocol", "CompletionRequest.to_sampling_params", "self",
           "max_tokens", "default_sampling_params"),
        _n(f"{CMPL}.protocol", "CompletionResponseChoice"),
        _n(f"{CMPL}.protocol", "CompletionResponse"),
    ),
    "openai_completions": (
        _f(f"{CMPL}.serving", "OpenAIServingCompletion.create_completion", "self",
           "request", "raw_request"),
        _f(f"{CMPL}.serving", "OpenAIServingCompletion.request_output_to_completion_response",
           "self", "final_res_batch", "request", "request_id", "created_time",
           "model_name", "tokenizer", "request_metadata"),
        _f(f"{CMPL}.serving", "OpenAIServingCompletion.completion_stream_generator",
           "self", "request", "engine_inputs", "result_generator", "request_id",
           "created_time", "model_name", "num_prompts", "tokenizer", "request_metadata"),
        _n(f"{CMPL}.serving", "OpenAIServingCompletion.create_error_response"),
        # the error event a stream generator writes for an exception (0.24 defines it
        # on `openai.engine.serving.OpenAIServing`, 0.27 on
        # `generate.base.serving.GenerateBaseServing`)
        _n(f"{CMPL}.serving", "OpenAIServingCompletion.create_streaming_error_response"),
        _s(f"{CMPL}.serving", "OpenAIServingCompletion.completion_stream_generator",
           "async for prompt_idx, res in result_generator", "for output in res.outputs",
           "i = output.index + prompt_idx * num_choices", 'yield f"data: {response_json}'),
        _s(f"{CMPL}.serving", "OpenAIServingCompletion.request_output_to_completion_response",
           "for final_res in final_res_batch", "for output in final_res.outputs",
           "index=len(choices)"),
        _s(f"{CMPL}.api_router", "create_completion",
           "isinstance(generator, ErrorResponse)"),
    ),
    "chat_protocol": (
        _f(f"{CHAT}.protocol", "ChatCompletionRequest.to_sampling_params", "self",
           "max_tokens", "default_sampling_params"),
        _n(f"{CHAT}.protocol", "ChatCompletionResponseChoice"),
        _n(f"{CHAT}.protocol", "ChatCompletionResponse"),
    ),
    "openai_chat": (
        _f(f"{CHAT}.serving", "OpenAIServingChat.create_chat_completion", "self",
           "request", "raw_request"),
        _f(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_full_generator", "self",
           "request", "result_generator", "request_id", "model_name", "conversation",
           "tokenizer", "request_metadata", "parser", "mm_token_counts"),
        _f(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator", "self",
           "request", "result_generator", "request_id", "model_name", "conversation",
           "tokenizer", "request_metadata", "chat_template_kwargs", "mm_token_counts"),
        _n(f"{CHAT}.serving", "ChatCompletionResponse"),
        _n(f"{CHAT}.serving", "OpenAIServingChat.create_error_response"),
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator",
           "async for res in result_generator", "for output in res.outputs",
           "i = output.index", 'yield f"data: {data}', until=R33),
        # 0.33: the generator (the one wrapped) serialises the chunks of `..._raw`, which
        # reads the results
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator",
           "self.chat_completion_stream_generator_raw(", "result_generator",
           'yield f"data: {data}', since=R33),
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator_raw",
           "async for res in result_generator", "for output in res.outputs",
           "i = output.index", since=R33),
        # chunks built from a result before its outputs are read: the role chunk (and
        # echo's), from the first result only (`StreamMasks`' `ahead`)
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator",
           "if first_iteration:", "first_iteration = False", until=R33),
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_stream_generator_raw",
           "if first_iteration:", "first_iteration = False", since=R33),
        _s(f"{CHAT}.serving", "OpenAIServingChat.chat_completion_full_generator",
           "index=output.index"),
        _s(f"{CHAT}.api_router", "create_chat_completion",
           "isinstance(generator, ErrorResponse)"),
    ),
    # -- diagnostics (only with VLLM_SAMPLING_MASK_DEBUG_STATE=1) ---------------------------
    # The state route: `build_app`, the app's engine client, its output processor and
    # engine-core client, the utility call by name, and the per-request containers it
    # counts in the engine core and the workers.
    "debug_state": (
        _f("{app}", "build_app", "args", "supported_tasks", "model_config"),
        _f("vllm.v1.engine.core_client", "AsyncMPClient.call_utility_async", "self",
           "method", "args"),
        _s("{app_state}", "init_app_state", "state.engine_client = engine_client"),
        _s(ALLM, "AsyncLLM.__init__", "self.output_processor = ", "self.engine_core = "),
        _s(OP, "OutputProcessor.__init__", "self.request_states", "self.parent_requests"),
    ),
    # Request errors as people read them: the API server's validation handler, whose
    # answer the patch rewrites, and the serving modules whose loggers it filters.
    "validation_messages": (
        _f("{validation_handler}", "validation_exception_handler", "req", "exc"),
        _s(API_SERVER, "build_app",
           "app.exception_handler(RequestValidationError)(validation_exception_handler)",
           until=R28),
        _s("vllm.entrypoints.serve.utils.server_utils", "validation_exception_handler",
           "JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)",
           until=R28),
        # 0.28: the handler has its own module, registered by init_exception_handler
        _s(EXC_REGISTER, "init_exception_handler",
           "app.exception_handler(RequestValidationError)(validation_exception_handler)",
           since=R28),
        _s(f"{EXC_HANDLERS}.validation", "validation_exception_handler",
           "message = f\"{count} validation {label}:\\n\"",
           "JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)",
           since=R28),
    ),
    "refusal_log": (
        _s("vllm.entrypoints.openai.completion.serving",
           "OpenAIServingCompletion.completion_stream_generator",
           'logger.exception("Error in completion stream generator.")'),
        _s("vllm.entrypoints.openai.chat_completion.serving",
           "OpenAIServingChat.chat_completion_stream_generator",
           'logger.exception("Error in chat completion stream generator.")', until=R33),
        _s("vllm.entrypoints.openai.chat_completion.serving",
           "OpenAIServingChat.chat_completion_stream_generator_raw",
           'logger.exception("Error in chat completion stream generator.")', since=R33),
        _s(TITO, "ServingTokens.serve_tokens_stream_generator",
           'logger.exception("Error in token generation stream.")'),
        _n("vllm.exceptions", "VLLMValidationError", until=R27),
        _n("vllm.exceptions", "VLLMClientError", since=R27),
    ),
    "models_dtype": (
        _f("vllm.entrypoints.openai.models.serving",
           "OpenAIServingModels.show_available_models", "self"),
        _s("vllm.entrypoints.openai.models.serving", "OpenAIServingModels.__init__",
           "self.model_config = ", "self.base_model_paths = base_model_paths"),
    ),
    # 0.24's serve_http: the uvicorn server it builds, the loop handlers it registers
    # before that server runs, and the shutdown task those handlers start
    "server_signals": (
        _s("vllm.entrypoints.launcher", "serve_http", "server = uvicorn.Server(config)",
           "loop.add_signal_handler(signal.SIGTERM, signal_handler)",
           "partial(engine_client.shutdown, timeout=timeout)", "server_task.cancel()"),
        _f("uvicorn", "Server.capture_signals", "self"),
    ),
    "shutdown_log": (
        _f("vllm.v1.engine.async_llm", "AsyncLLM.shutdown", "self", "timeout"),
        _s("vllm.v1.engine.async_llm", "AsyncLLM._run_output_handler",
           'logger.exception("AsyncLLM output_handler failed.")'),
    ),
    "debug_state_core": (
        _f("vllm.v1.engine.core", "EngineCore.collective_rpc", "self", "method",
           "timeout", "args", "kwargs"),
        _n("vllm.v1.engine.core", "EngineCore"),
        _s("vllm.v1.engine.core", "EngineCoreProc._handle_client_request",
           "getattr(self, method_name)"),
        _s(SCHED, "Scheduler.__init__", "self.requests:", "self.waiting =",
           "self.running:", "self.finished_req_ids:", "self.kv_cache_manager = "),
        _s(SCHED, "Scheduler.__init__", "self.skipped_waiting =", until=R31),
        _s(SCHED, "Scheduler.__init__", "self.kv_holding_waiting =", "self.deferred_waiting",
           since=R31),
        _s("vllm.v1.core.kv_cache_manager", "KVCacheManager.__init__",
           "self.coordinator = ", "self.block_pool = "),
        _s("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.__init__",
           "self.single_type_managers = "),
        _s("vllm.v1.core.single_type_kv_cache_manager",
           "SingleTypeKVCacheManager.__init__", "self.req_to_blocks:",
           "self.num_cached_block:"),
        _s("vllm.v1.core.block_pool", "BlockPool.__init__", "self.num_gpu_blocks = ",
           "self.null_block = "),
        _s("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks",
           "free_block_queue"),
        _s("vllm.v1.worker.cpu_worker", "CPUWorker.init_device", "self.model_runner"),
        _s("vllm.v1.worker.gpu_worker", "Worker.init_device", "self.model_runner",
           until=R32),
        _s("vllm.v1.worker.gpu_worker", "Worker._init_workspace_and_model_runner",
           "self.model_runner", since=R32),
        _s(V1, "GPUModelRunner.__init__", "self.requests:", "self.input_batch = ",
           until=R34),
        _s(f"{GPU}.model_runner", "GPUModelRunner.__init__", "self.req_states = "),
    ),
}
