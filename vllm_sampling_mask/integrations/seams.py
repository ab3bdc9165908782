"""What the integrations rely on in the frameworks they integrate, as data.

The same entry kinds as `vllm_sampling_mask.seams` (`Function`: parameter names in
order; `Name`: a dotted name resolves; `SourceUses`: the function's source still holds
these strings), keyed by the part of the integration that relies on them.
`tests/test_trl_seams.py` checks every entry against the installed framework, so a
release that moves one fails a named test, not a training run. No framework import.
"""

from __future__ import annotations

from vllm_sampling_mask.seams import Entry, Function, Name, SourceUses

__all__ = ["TRL_SEAMS", "TRL_TESTED"]

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
            "self.vllm_generation = VLLMGeneration(", "add_fused_lm_head(",
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
