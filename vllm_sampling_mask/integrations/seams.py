"""What the integrations rely on in the frameworks they integrate, as data.

The same entry kinds as `vllm_sampling_mask.patches.seams` (`Function`: parameter names in
order; `Name`: a dotted name resolves; `SourceUses`: the function's source still holds
these strings), keyed by the part of the integration that relies on them.
`tests/integrations/test_framework_seams.py` checks every entry against the installed framework, so a
release that moves one fails a named test, not a training run. No framework import.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.seams import Entry, Fields, Function, Name, SourceUses

__all__ = ["TRL_SEAMS", "TRL_TESTED", "SKYRL_SEAMS", "SKYRL_TESTED", "VERL_SEAMS", "VERL_TESTED",
           "OPENRLHF_SEAMS", "OPENRLHF_TESTED"]

# the TRL releases `integrations.trl` was run against (pyproject's `trl` extra)
TRL_TESTED = ">=1.16,<1.17"

GRPO = "trl.trainer.grpo_trainer"
GEN = "trl.generation.vllm_generation"
CLIENT = "trl.generation.vllm_client"
UTILS = "trl.trainer.utils"

TRL_SEAMS: dict[str, tuple[Entry, ...]] = {
    # MaskedGRPOTrainer.__init__: TRL's backend built as MaskedVLLMGeneration (the
    # module's `VLLMGeneration` name, replaced while GRPOTrainer.__init__ runs), and
    # the attributes it checks after
    "trainer.init": (
        Name(GRPO, "VLLMGeneration"),
        SourceUses(GRPO, "GRPOTrainer.__init__", (
            "self.vllm_generation = VLLMGeneration(", "mode=args.vllm_mode,",
            "tensor_parallel_size=args.vllm_tensor_parallel_size,", "add_fused_lm_head(",
            "self._entropy_bonus_enabled = ", "self.tools = ", "self.environment_factories",
            "self.rollout_func = ", "self.temperature = ", "self.ref_model")),
    ),
    # the rollout: masks picked up after TRL's `_generate`, and carried in the batch
    "trainer.rollout": (
        Function(GRPO, "GRPOTrainer._generate", ("self", "prompts")),
        SourceUses(GRPO, "GRPOTrainer._generate", (
            "self._generate_single_turn(",
            "return prompt_ids, completion_ids, tool_mask, completions, logprobs, "
            "extra_fields, images, tool_images")),
        Function(GRPO, "GRPOTrainer._generate_and_score_completions", ("self", "inputs")),
        SourceUses(GRPO, "GRPOTrainer._generate_and_score_completions", (
            "= self._generate(prompts)",
            "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(",
            "(old_per_token_logps - sampling_per_token_logps) * mask",
            "ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")),
        # a list in the batch is shuffled and split with the tensors
        SourceUses(GRPO, "GRPOTrainer._prepare_inputs", (
            "shuffle_sequence_dict(generation_batch)",
            "split_tensor_dict(generation_batch, self.args.steps_per_generation)")),
        SourceUses(UTILS, "shuffle_sequence_dict", ("return [v[i] for i in permutation]",)),
        SourceUses(UTILS, "split_tensor_dict", ("isinstance(tensor, list)",)),
    ),
    # the loss: the hook, replaced for batches with masks, and who calls it
    "trainer.loss": (
        Function(GRPO, "GRPOTrainer._compute_loss", ("self", "model", "inputs")),
        SourceUses(GRPO, "GRPOTrainer._compute_loss", (
            "self._get_per_token_logps_and_entropies(", "compute_entropy=True")),
        Function(GRPO, "GRPOTrainer._get_per_token_logps_and_entropies", (
            "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
            "compute_entropy", "compute_aux_loss", "pixel_values", "image_grid_thw",
            "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
            "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")),
        SourceUses(UTILS, "add_fused_lm_head", (
            "model.forward = types.MethodType(_fused_forward, model)",
            "getattr(self, backbone_attr)", "self.get_output_embeddings()",
            "final_logit_softcapping", "logit_scale")),
    ),
    # the generation backend: server client, colocated engine, weight sync
    "generation": (
        Function(GEN, "VLLMGeneration.__init__", (
            "self", "model", "accelerator", "processing_class", "mode",
            "structured_outputs_regex", "server_base_url", "server_host", "server_port",
            "server_timeout", "group_port", "tensor_parallel_size",
            "gpu_memory_utilization", "max_model_length", "max_num_seqs",
            "enable_sleep_mode", "model_impl", "trust_remote_code", "repetition_penalty",
            "temperature", "top_p", "top_k", "min_p", "max_completion_length", "logprobs",
            "generation_kwargs")),
        Function(GEN, "VLLMGeneration._init_vllm", ("self",)),
        SourceUses(GEN, "VLLMGeneration._init_vllm", (
            "self.llm = LLM(", "self.vllm_client = VLLMClient(",
            'logprobs_mode="processed_logprobs"')),
        Name(GEN, "LLM"),
        Function(GEN, "VLLMGeneration.generate",
                 ("self", "prompts", "images", "num_generations", "profiler")),
        SourceUses(GEN, "VLLMGeneration.generate", (
            "self.llm.generate(vllm_prompts", "generation_kwargs.update(self.generation_kwargs)",
            '"generation_kwargs": self.generation_kwargs',
            "for outputs in all_outputs for output in outputs.outputs",
            "accelerator.process_index * len(prompts)")),
        Function(GEN, "VLLMGeneration.sync_weights", ("self",)),
        Function(GEN, "VLLMGeneration._iter_named_params", ("self",)),
        Function(CLIENT, "VLLMClient.__init__", (
            "self", "base_url", "host", "server_port", "group_port", "connection_timeout")),
        Function(CLIENT, "VLLMClient._get", ("self", "url", "kwargs")),
        Function(CLIENT, "VLLMClient._post", ("self", "url", "kwargs")),
        SourceUses(CLIENT, "VLLMClient.generate", (
            'self._post(f"{self.base_url}/v1/completions"',
            "sampling_params.update(generation_kwargs or {})")),
        Function(CLIENT, "VLLMClient.reset_prefix_cache", ("self",)),
        Function(CLIENT, "VLLMClient.init_communicator", ("self", "device")),
    ),
}


# -- SkyRL (`integrations.skyrl`), checked by tests/integrations/test_framework_seams.py --------

# the SkyRL releases `integrations.skyrl` was run against (requirements/skyrl-0.4.0-cpu.txt)
SKYRL_TESTED = ">=0.4.0,<0.5"

SK_ACTOR = "skyrl.backends.skyrl_train.inference_servers.vllm_server_actor"
SK_WIRE = "skyrl.backends.skyrl_train.inference_servers.generate_wire"
SK_CLIENT = "skyrl.backends.skyrl_train.inference_servers.remote_inference_client"
SK_ARGS = "skyrl.backends.skyrl_train.inference_servers.utils"
SK_SUPPORT = "skyrl.backends.skyrl_train.utils.sample_support"
SK_PREP = "skyrl.train.dataset.preprocess"
SK_REPLAY = "skyrl.backends.skyrl_train.utils.sample_support_replay"
SK_CONFIG = "skyrl.train.config.config"
SK_WRAPPER = "skyrl.backends.skyrl_train.workers.model_wrapper"
SK_WORKER = "skyrl.backends.skyrl_train.workers.worker"
SK_WORKER_UTILS = "skyrl.backends.skyrl_train.workers.worker_utils"
SK_FSDP = "skyrl.backends.skyrl_train.distributed.fsdp_strategy"

SKYRL_SEAMS: dict[str, tuple[Entry, ...]] = {
    # turned on by SkyRL's configuration: engine_init_kwargs become the server's
    # arguments (vLLM's `middleware` and the overlay's `return_sampling_mask` among
    # them), and capture sets processed logprobs, which the mask needs
    "config": (
        Function(SK_ARGS, "build_vllm_cli_args", ("cfg",)),
        SourceUses(SK_ARGS, "build_vllm_cli_args", (
            "get_config_as_dict(ie_cfg.engine_init_kwargs)", "setattr(args, key, value)",
            'overrides["logprobs_mode"] = "processed_logprobs"')),
        SourceUses(SK_CONFIG, "SkyRLTrainConfig.__post_init__", (
            "sampling_params.top_k <= 1",)),
        SourceUses("vllm.entrypoints.serve.middleware.register",
                   "init_entrypoints_middleware", (
                       "for middleware in args.middleware:",
                       "app.add_middleware(imported)")),
    ),
    # the route taken over: SkyRL's /skyrl/v1/generate in the app its server builds,
    # the request body it reads, and the app state the replacement reads
    "server.route": (
        Function(SK_ACTOR, "VLLMServerActor._add_custom_endpoints",
                 ("app", "engine", "cli_args")),
        SourceUses(SK_ACTOR, "VLLMServerActor._add_custom_endpoints", (
            '@app.post("/skyrl/v1/generate")', 'body["token_ids"]',
            'body.get("sampling_params", {})', 'body.get("cache_salt")',
            'body.get("return_sample_support", False)', 'body.get("model")',
            "models.lora_requests", "models.is_base_model(model_name)",
            "PackedField.ROLLOUT_SAMPLE_SUPPORT.value: sample_support")),
        SourceUses(SK_ACTOR, "_build_and_serve_vllm_server", (
            "app = build_app(cli_args)",
            "VLLMServerActor._add_custom_endpoints(app, engine, cli_args)",
            "await init_app_state(engine, app.state, cli_args)",
            "uvicorn.Config(")),
        SourceUses("vllm.entrypoints.launchers.api_server.app_state", "init_app_state", (
            "state.engine_client = engine_client", "state.args = args")),
        Function(SK_ACTOR, "VLLMServerActor.__init__", (
            "self", "vllm_cli_args", "start_port", "server_idx", "bundle_indices",
            "dp_size", "dp_master_address", "dp_rpc_port", "enable_pd",
            "nixl_side_channel_base", "mooncake_bootstrap_base_port", "colocated_training",
            "distributed_executor_backend", "mp_cuda_visible_devices",
            "enable_ray_prometheus_stats")),
    ),
    # the payload written: SkyRL's own wire helpers and layout
    "server.payload": (
        Function(SK_WIRE, "build_logprobs_content", ("token_ids", "resp_logprobs")),
        Function(SK_WIRE, "pack_sample_support", ("sample_support",)),
        Function(SK_WIRE, "pack_routed_experts", ("routed_experts",)),
        Name(SK_WIRE, "PackedField.ROUTED_EXPERTS"),
        Name(SK_WIRE, "PackedField.ROLLOUT_SAMPLE_SUPPORT"),
        Name(SK_SUPPORT, "SAMPLE_SUPPORT_PADDING"),
        Name(SK_SUPPORT, "SAMPLE_SUPPORT_DTYPE"),
    ),
    # the client that reads it, unchanged
    "client": (
        Function(SK_CLIENT, "RemoteGenerateClient.generate", (
            "self", "prompt_token_ids", "sampling_params", "session_id", "model",
            "return_routed_experts", "routed_experts_prompt_start", "return_sample_support",
            "mm_features", "cache_salt")),
        SourceUses(SK_CLIENT, "RemoteGenerateClient.generate", (
            '"/skyrl/v1/generate" if packed_side_channels', 'payload["return_sample_support"] = True',
            "choice.get(PackedField.ROLLOUT_SAMPLE_SUPPORT)",
            "decode_packed_sample_support(packed_sample_support)")),
    ),
    # the trainer: one width for every sample of a batch, rows read as sets
    "trainer": (
        Function(SK_PREP, "build_sample_support", ("rollout_sample_support", "response_lens")),
        SourceUses(SK_PREP, "build_sample_support", ("entries must share top_k",)),
        Function(SK_REPLAY, "score_aligned_sample_support", (
            "aligned_source", "aligned_sampled_ids", "aligned_row_ids", "aligned_loss_mask",
            "sample_support", "vocab_start_index", "vocab_end_index", "tp_group",
            "compute_entropy", "entropy_requires_grad", "lm_head_weight", "temperature",
            "chunk_size")),
    ),
    # the coverage metric: the FSDP forward's replay call (by its module name, on the
    # temperature-scaled logits), and the micro-batch status the worker reduces
    "trainer.metrics": (
        Name(SK_WRAPPER, "score_aligned_sample_support"),
        SourceUses(SK_WRAPPER, "HFModelWrapper.forward", (
            "logits_BSV.div_(temperature)", "support_scores = score_aligned_sample_support(",
            "logits_BSV,", "support_channels.row_ids,", "support_channels.loss_mask,",
            "sample_support,")),
        Function(SK_WORKER, "PolicyWorkerBase._forward_backward_micro", (
            "self", "experience", "microbatch_weight", "loss_fn", "loss_fn_config",
            "return_per_token_outputs")),
        SourceUses(SK_WORKER, "PolicyWorkerBase._forward_backward_micro", (
            "self.cfg.algorithm.enable_sample_support_replay", "return status")),
        SourceUses(SK_WORKER, "PolicyWorkerBase.forward_backward", (
            "metrics = self._forward_backward_micro(",
            "result = reduce_metrics(all_metrics, sum_loss_metrics=True)")),
        SourceUses(SK_WORKER_UTILS, "reduce_metrics", ("Default reduction is mean.",)),
    ),
    # the tied LM head: the FSDP2 init moves the model to meta (which unties it), then
    # calls the module's apply_fsdp2, then loads the full state dict
    "trainer.tied_head": (
        Name(SK_FSDP, "apply_fsdp2"),
        SourceUses(SK_FSDP, "FSDPStrategy._fsdp_init_model", (
            'module.to(torch.device("meta"))',
            "apply_fsdp2(module, fsdp_kwargs, self.fsdp_config)",
            "fsdp2_load_full_state_dict(module, full_state, cpu_offload)")),
    ),
}


# -- verl (`integrations.verl`), checked by tests/integrations/test_framework_seams.py ----------

# the verl releases `integrations.verl` was run against (requirements/verl-0.9.1-cpu.txt)
VERL_TESTED = ">=0.9.1,<0.10"

V_VLLM = "verl.third_party.vllm"
V_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
V_REPLICA = "verl.workers.rollout.replica"
V_LOOP = "verl.experimental.agent_loop.agent_loop"
V_SINGLE = "verl.experimental.agent_loop.single_turn_agent_loop"
V_TOOL = "verl.experimental.agent_loop.tool_agent_loop"
V_CT = "verl.utils.tokenizer.continuous_token"
V_TQ = "verl.trainer.ppo.v1.agent_loop_tq"
V_TRAINER = "verl.trainer.ppo.v1.trainer_base"
V_ENGINE = "verl.workers.engine.fsdp.transformer_impl"
V_ENGINE_UTILS = "verl.workers.engine.utils"
V_TD = "verl.utils.tensordict_utils"
V_PAD = "verl.workers.utils.padding"
V_CORR = "verl.trainer.ppo.rollout_corr_helper"
V_METRIC = "verl.utils.metric.utils"
V_WORKERS = "verl.workers.engine_workers"

VERL_SEAMS: dict[str, tuple[Entry, ...]] = {
    # the plugin: verl's vLLM version read (made right by the metadata alias first);
    # the entry-point loop itself is checked on `verl`'s module source by the test
    "plugin": (
        Function(V_VLLM, "get_version", ("pkg",)),
        Name(V_VLLM, "vllm_version"),
    ),
    # the server: the engine flag through engine_kwargs, generate's request and result
    "server": (
        Function(V_SERVER, "vLLMHttpServer.generate", (
            "self", "prompt_ids", "sampling_params", "request_id", "image_data",
            "video_data", "audio_data", "mm_processor_kwargs", "priority",
            "kv_transfer_params")),
        SourceUses(V_SERVER, "vLLMHttpServer.generate", (
            "sampling_params = SamplingParams(max_tokens=max_tokens, **sampling_params)",
            "generator = self.engine.generate(", "request_id=request_id,",
            "async for output in generator:", "final_res.outputs[0].token_ids",
            "extra_fields=extra_fields")),
        SourceUses(V_SERVER, "vLLMHttpServer.launch_server", (
            'self.config.get("engine_kwargs", {}).get(self._get_engine_kwargs_key(), {})',
            "**engine_kwargs", "build_cli_args_from_config(args)")),
        SourceUses(V_SERVER, "vLLMHttpServer.run_server", (
            "self.engine = engine_client",)),
        Name(V_REPLICA, "TokenOutput"),
        Fields(V_REPLICA, "TokenOutput", ("token_ids", "log_probs", "extra_fields")),
    ),
    # extra_fields to the trainer: per sample, through the agent loop into TransferQueue
    "rollout": (
        SourceUses(V_SINGLE, "SingleTurnAgentLoop.run", ("extra_fields=output.extra_fields",)),
        SourceUses(V_LOOP, "AgentLoopOutput.as_dict", (
            'output.setdefault("extra_fields", self.extra_fields.copy())',)),
        SourceUses(V_TQ, "AgentLoopWorkerTQ._agent_loop_postprocess", (
            "field = output.as_dict()", "list_of_dict_to_tensordict(fields)")),
        Function(V_TD, "list_of_dict_to_tensordict", ("list_of_dicts",)),
        Function(V_ENGINE_UTILS, "prepare_micro_batches", (
            "data", "dp_group", "num_batches_divided_by", "same_micro_num_in_dp",
            "min_num_micro_batch", "use_dynamic_bsz_balance")),
    ),
    # the trainer: log_probs over the support, read by the old log-probs, the rollout
    # correction and the loss
    "trainer": (
        Function(V_ENGINE, "FSDPEngineWithLMHead.prepare_model_outputs", (
            "self", "output", "output_args", "micro_batch", "logits_processor_func")),
        SourceUses(V_ENGINE, "FSDPEngineWithLMHead.prepare_model_outputs", (
            'output_args["input_ids_rmpad_rolled"]', 'output_args["temperature_rmpad"]',
            "logits_rmpad = output.logits.squeeze(0)", 'output_args["temperature"]',
            "input_ids.offsets()", 'model_output["log_probs"] = log_probs',
            "torch.nested.nested_tensor_from_jagged(log_probs, cu_seqlens)")),
        Function(V_ENGINE, "FSDPEngineWithLMHead.prepare_model_inputs", ("self", "micro_batch")),
        SourceUses(V_ENGINE, "FSDPEngineWithLMHead.forward_step", (
            "self.prepare_model_outputs(",)),
        Function(V_TD, "get_non_tensor_data", ("data", "key", "default")),
        Function(V_PAD, "response_from_nested", ("tensor", "response_mask")),
        SourceUses(V_PAD, "response_from_nested", ("values[seq_offset - resp_len - 1 : seq_offset - 1]",)),
        SourceUses(V_TRAINER, "PPOTrainer._compute_old_log_prob", (
            "self.actor_rollout_wg.compute_log_prob(batch)",
            'response_from_nested(data.pop("log_probs"), data["response_mask"])',
            'data["old_log_probs"] = data.pop("rollout_log_probs")')),
        SourceUses(V_TRAINER, "PPOTrainer._compute_advantage", (
            "compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)",)),
        Function(V_CORR, "compute_rollout_correction_and_add_to_batch", (
            "batch", "rollout_corr_config")),
    ),
    # the coverage metric: forward_step's metrics dict, one per micro-batch, gathered by
    # forward_backward_batch, Metric("sum") aggregated over micro-batches (mean over dp)
    "metrics": (
        Function(V_ENGINE, "FSDPEngineWithLMHead.forward_step", (
            "self", "micro_batch", "loss_function", "forward_only")),
        SourceUses(V_ENGINE, "FSDPEngineWithLMHead.forward_step", (
            '"metrics": metrics,', "return loss, output")),
        Function(V_ENGINE, "FSDPEngine.forward_backward_batch", (
            "self", "data", "loss_function", "forward_only")),
        SourceUses(V_ENGINE, "FSDPEngine.forward_backward_batch", (
            "self.forward_step(micro_batch, loss_function=loss_function, "
            "forward_only=forward_only)",
            "postprocess_batch_func(output_lst=output_lst, indices=indices, data=data)")),
        SourceUses(V_ENGINE_UTILS, "postprocess_batch_func", (
            'append_to_dict(aggregated_metrics, metrics)',)),
        Function(V_METRIC, "Metric.__init__", ("self", "aggregation", "value")),
        Name(V_METRIC, "AggregationType.SUM"),
        SourceUses(V_METRIC, "Metric.aggregate_dp", ("np.mean(value_arrays, axis=0)",)),
        SourceUses(V_WORKERS, "TrainingWorker.train_mini_batch", (
            "Metric.aggregate_dp(val)",)),
    ),
    # multi-turn: each turn's mask placed on the response through verl's Continuous
    # Token merges (the edits align_response_metadata makes to response_mask)
    "tool_loop": (
        Function(V_TOOL, "ToolAgentLoop.run", ("self", "sampling_params", "priority", "kwargs")),
        SourceUses(V_TOOL, "ToolAgentLoop.run", (
            "await self._handle_generating_state(agent_data, sampling_params)",
            "await self._handle_processing_tools_state(agent_data)",
            "response_ids=response_ids[: self.response_length]",
            "extra_fields=agent_data.extra_fields")),
        Function(V_TOOL, "ToolAgentLoop._handle_generating_state", (
            "self", "agent_data", "sampling_params", "ignore_termination")),
        SourceUses(V_TOOL, "ToolAgentLoop._handle_generating_state", (
            "await self.server_manager.generate(", "await self.ct_merge_assistant_token(",
            "agent_data.response_mask = response_mask")),
        Function(V_TOOL, "ToolAgentLoop._handle_processing_tools_state", ("self", "agent_data")),
        SourceUses(V_TOOL, "ToolAgentLoop._handle_processing_tools_state", (
            "await self.ct_merge_context_msg(", "agent_data.response_mask = response_mask")),
        SourceUses(V_LOOP, "AgentLoopBase.ct_merge_assistant_token", (
            "return merge_result, aligned_response_mask, aligned_response_logprobs",)),
        SourceUses(V_LOOP, "AgentLoopBase.ct_merge_context_msg", (
            "return merge_result, aligned_response_mask, aligned_response_logprobs",)),
        Fields(V_CT, "MergeResult", (
            "token_ids", "appended_token_count", "kind", "inserted_token_ids",
            "removed_prefix_token_count")),
        SourceUses(V_CT, "ContinuousTokenBuilder.align_response_metadata", (
            "aligned_mask[: -merge_result.removed_prefix_token_count]",
            "aligned_mask += [0] * inserted_token_count",
            "aligned_mask += [1] * merge_result.appended_token_count",
            "aligned_mask += [0] * merge_result.appended_token_count")),
    ),
}


# -- OpenRLHF (`integrations.openrlhf`), checked by
# tests/integrations/test_framework_seams.py ---------------------------------------------

# the OpenRLHF releases `integrations.openrlhf` was run against
# (requirements/openrlhf-0.11.2-cpu.txt)
OPENRLHF_TESTED = ">=0.11.2,<0.12"

O_CLI = "openrlhf.cli.train_ppo_ray"
O_ENGINE = "openrlhf.trainer.ray.vllm_engine"
O_AGENT = "openrlhf.utils.agent"
O_EXP = "openrlhf.trainer.ppo_utils.experience"
O_SAMPLES = "openrlhf.trainer.ppo_utils.samples_generator"
O_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
O_LAUNCHER = "openrlhf.trainer.ray.launcher"
O_PPO_ACTOR = "openrlhf.trainer.ray.ppo_actor"
O_ACTOR = "openrlhf.models.actor"
O_LOSS = "openrlhf.models.loss"

# A method of a Ray actor class (`@ray.remote`: RolloutRayActor, PolicyModelActor,
# ReferenceModelActor) resolves as a bound method: its parameters without `self`.
OPENRLHF_SEAMS: dict[str, tuple[Entry, ...]] = {
    # the launcher: Ray started first keeps its runtime environment (OpenRLHF starts
    # it only when not connected); the engines are Ray workers of that job; vLLM's
    # processed logprobs are asked for with the correction on
    "config": (
        SourceUses(O_CLI, "train", ("if not ray.is_initialized():",)),
        SourceUses(O_ENGINE, "create_vllm_engines", (
            "RolloutRayActor.options(", 'actor_kwargs["logprobs_mode"] = logprobs_mode')),
        SourceUses(O_SAMPLES, "SamplesGenerator._dispatch_prompts_to_vllm", (
            'logprobs=1 if self.args.algo.advantage.is_correction_level != "off" else None',
            "llm_engine.generate_responses.remote(")),
    ),
    # the rollout: the executor gets the actor as its engine and calls its generate,
    # once per action range, and returns the observation tokens and ranges
    "rollout": (
        Function(O_ENGINE, "RolloutRayActor.generate_responses", (
            "prompt", "label", "sampling_params", "max_length", "hf_tokenizer",
            "num_samples", "images")),
        SourceUses(O_ENGINE, "RolloutRayActor.generate_responses", (
            "self.executor.execute(", "llm_engine=self,")),
        # the class Ray instantiates (the adapter patches its methods)
        SourceUses(O_ENGINE, "RolloutRayActor.__ray_metadata__.modified_class.__init__", (
            "self.executor = ", "self.llm = vllm.AsyncLLMEngine.from_engine_args(")),
        Function(O_ENGINE, "RolloutRayActor.generate", (
            "prompt_token_ids", "sampling_params", "multi_modal_data")),
        Function(O_AGENT, "AgentExecutorBase.execute", (
            "self", "prompt", "label", "sampling_params", "max_length", "hf_tokenizer",
            "llm_engine", "images")),
        SourceUses(O_AGENT, "SingleTurnAgentExecutor.execute", (
            "await llm_engine.generate(", "action_ranges = [(len(prompt_token_ids), "
            "len(observation_token_ids))]", '"observation_tokens": observation_token_ids')),
        SourceUses(O_AGENT, "MultiTurnAgentExecutor.execute", (
            "await llm_engine.generate(", "action_ranges.append((action_start, action_end))")),
    ),
    # the Experience: a dataclass batched by its fields(), built from named keys
    "experience": (
        Fields(O_EXP, "Experience", (
            "sequences", "attention_mask", "action_mask", "rollout_log_probs", "prompts")),
        SourceUses(O_EXP, "Experience.concat_experiences", (
            "field_names = [f.name for f in fields(Experience)]", "return Experience(**result)")),
        SourceUses(O_EXP, "split_experience_batch", (
            "for f in fields(Experience):",
            "kwargs[f.name] = [value[i]] if len(value) == batch_size else value")),
        SourceUses(O_EXP, "make_experience_batch", (
            "for f in fields(Experience):", "itertools.chain.from_iterable(")),
        Function(O_SAMPLES, "SamplesGenerator._process_response_into_experience", (
            "self", "response", "generate_kwargs")),
        SourceUses(O_SAMPLES, "SamplesGenerator._process_response_into_experience", (
            'truncate_length = generate_kwargs.get("max_len", 2048)',
            "action_mask = action_mask[1:truncate_length]", "return Experience(")),
    ),
    # the old and reference log-probabilities: one forward per micro-batch item
    "old_logprobs": (
        Function(O_MAKER, "RemoteExperienceMaker.make_experience", ("self", "samples_list")),
        Function(O_MAKER, "RemoteExperienceMaker._dispatch_forward", (
            "self", "group", "sync_condition", "kwargs")),
        SourceUses(O_MAKER, "RemoteExperienceMaker.make_experience", (
            "sequences=sequences_list, action_mask=action_mask_list, "
            "attention_mask=attention_mask_list",
            "self.actor_model_group,", "self.initial_model_group,")),
        SourceUses(O_LAUNCHER, "RayActorGroup.async_run_method_batch", (
            "chunk_data = {key: value[start_idx:end_idx] for key, value in kwargs.items()}",)),
        SourceUses(O_LAUNCHER, "BaseModelActor.execute_batch", (
            "result = func(**sample_kwargs)",)),
        Function(O_PPO_ACTOR, "PolicyModelActor.forward", (
            "sequences", "action_mask", "attention_mask", "packed_seq_lens",
            "mm_train_inputs_list")),
        SourceUses(O_PPO_ACTOR, "PolicyModelActor.forward", ("action_log_probs = self.actor(",)),
        Function(O_LAUNCHER, "ReferenceModelActor.forward", (
            "sequences", "action_mask", "attention_mask", "return_output",
            "packed_seq_lens", "mm_train_inputs_list")),
        SourceUses(O_LAUNCHER, "ReferenceModelActor.forward", ("log_probs = self.model(",)),
    ),
    # the training step: pi_theta from Actor.forward, then PolicyLoss
    "train_step": (
        Function(O_PPO_ACTOR, "ActorPPOTrainer.training_step", (
            "self", "experience", "kl_ctl", "step", "loss_batch_info")),
        SourceUses(O_PPO_ACTOR, "ActorPPOTrainer.training_step", (
            "action_log_probs, output = self.actor(",
            "old_action_log_probs = experience.action_log_probs",
            "rollout_log_probs=experience.rollout_log_probs")),
        # the coverage metric: the status dict training_step returns, its entries
        # weighted "token" by ppo_train over micro-batches and ranks
        SourceUses(O_PPO_ACTOR, "ActorPPOTrainer.training_step", (
            '"metrics": metrics,', '"weights": weights,')),
        SourceUses(O_PPO_ACTOR, "ActorPPOTrainer.ppo_train", (
            "status = self.training_step(experience, kl_ctl, step, loss_batch_info)",
            'scale = n_tokens if weight == "token" else n_samples',
            "value.float().mean().item() * scale",
            "reduced_status = self.strategy.all_reduce(reduced_status)")),
    ),
    # Actor.forward: temperature-scaled float32 logits, column j predicts token j + 1;
    # PolicyLoss's correction compares old and rollout log-probabilities
    "actor_forward": (
        Function(O_ACTOR, "Actor.forward", (
            "self", "sequences", "action_mask", "attention_mask", "return_output",
            "allgather_logits", "return_logprobs", "ring_attn_group", "packed_seq_lens",
            "return_entropy", "mm_inputs")),
        SourceUses(O_ACTOR, "Actor.forward", (
            'output["logits"] = output["logits"].to(torch.float32)',
            'output["logits"].div_(self.temperature)', "if self.packing_samples:",
            # the packed layout: the attended tokens in row-major order, one row
            "= unpad_and_slice_tensor(",
            "log_probs = log_probs[:, :-1]",
            "action_log_probs = log_probs[:, -action_mask.shape[1] :] * action_mask.float()",
            "return (action_log_probs, output) if return_output else action_log_probs")),
        Function(O_LOSS, "PolicyLoss.forward", (
            "self", "log_probs", "old_log_probs", "advantages", "action_mask",
            "rollout_log_probs", "dp_size", "batch_num_tokens", "global_batch_size")),
        SourceUses(O_LOSS, "PolicyLoss.forward", (
            "is_log_ratio = (old_log_probs - rollout_log_probs).detach()",)),
    ),
}
