"""The records of the patches that patch the HTTP server (`vllm serve`'s routes, protocol and
app).

`patches.REGISTRY` lists them with every other hop's, in its order; `patches.schema`
says what each field means.
"""

from __future__ import annotations

from vllm_sampling_mask.patches.schema import (Kind, Patch, Process, fields_entry,
                                               function_entry, name_entry, source_entry)
from vllm_sampling_mask.patches.upstream import (ASYNC_LLM, MASK_PR, NONE_KNOWN, OPENAI_CHAT,
                                                 OPENAI_COMPLETION, OUTPUT_PROCESSOR)

# the OpenAI routes' two pairs (completions and chat): protocol, serving
PROTOCOL_GONE = ("upstream declares these fields (vLLM #49577, in 0.28, declares the mask "
                 "on the generate route's choices only).")

PROTOCOL_CHANGE = ("the same fields for `/v1/completions`, `/v1/chat/completions` (the "
                   "field reaches `extra_args` in `to_sampling_params`); the subclass "
                   "checks the body first (no JSON object, a misplaced mask field, and "
                   "on 0.24 a logprobs field that is no number: "
                   "`Release.logprobs_compared_raw`), a 400 naming the field")


def protocol_seams(package: str, request: str, choice: str, response: str) -> tuple:
    """An OpenAI route's protocol seams: where its request's body field reaches
    `extra_args` (`to_sampling_params`), and the full response's choice and response
    classes the subclasses replace."""
    protocol = f"{package}.protocol"
    return (function_entry(protocol, f"{request}.to_sampling_params", "self", "max_tokens",
                           "default_sampling_params"),
            name_entry(protocol, choice),
            name_entry(protocol, response))


SERVING_GONE = ("upstream returns the mask from this endpoint (vLLM #49577, in 0.28, "
                "returns it from /inference/v1/generate only).")

SERVING_CHANGE = "masks per choice and per stream chunk; mask errors as 400s"

# the module `vllm serve` builds its app in (0.32 moved it: `vllm.entrypoints.openai.
# api_server` is a deprecated re-export there that `vllm serve` never imports)
SERVE_APP = "{app}"

OPENAI_API_SERVER = "vllm.entrypoints.openai.api_server"

EXCEPTION_REGISTER = "vllm.entrypoints.serve.exception_handling.register"

EXCEPTION_HANDLERS = "vllm.entrypoints.serve.exception_handling.handlers"

# the generate route's modules (`serve.disagg` on 0.24, `scale_out.token_in_token_out`
# from 0.27)
GENERATE_PROTOCOL = "{generate_protocol}"

GENERATE_SERVING = "{generate_serving}"

GENERATE_ROUTER = "{generate_router}"

# vLLM's dev-mode RL routes (`serve.dev.rlhf` up to 0.31, `rl.online` from 0.32)
RL_ROUTER = "{rl_router}"


RECORDS = (
    # -- fixes of upstream bugs -------------------------------------------------------------
    Patch("server_signals", ("vllm.entrypoints.launcher",), Process.API_SERVER, Kind.FIX,
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
              source_entry("vllm.entrypoints.launcher", "serve_http",
                           "server = uvicorn.Server(config)",
                           "loop.add_signal_handler(signal.SIGTERM, signal_handler)",
                           "partial(engine_client.shutdown, timeout=timeout)",
                           "server_task.cancel()"),
              function_entry("uvicorn", "Server.capture_signals", "self"),
          )),
    Patch("validation_messages", ("{validation_handler}",), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "schema 400s carry Python reprs of pydantic's errors and a "
          "character offset as `param` for malformed JSON "
          "(serve/utils/server_utils.validation_exception_handler)",
          "upstream words schema errors per field and keeps `param` a field name",
          change=("schema 400s in one sentence naming the parameter "
                  "(`error_sentences.describe`), malformed JSON as `param: body`"),
          seams=(
              # Request errors as people read them: the API server's validation handler, whose
              # answer the patch rewrites, and the serving modules whose loggers it filters.
              function_entry("{validation_handler}", "validation_exception_handler", "req", "exc"),
              source_entry(OPENAI_API_SERVER, "build_app",
                           "app.exception_handler(RequestValidationError)(validation_exception_handler)",
                           until="0.28.0"),
              source_entry("vllm.entrypoints.serve.utils.server_utils",
                           "validation_exception_handler",
                           "JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)",
                           until="0.28.0"),
              # 0.28: the handler has its own module, registered by init_exception_handler
              source_entry(EXCEPTION_REGISTER, "init_exception_handler",
                           "app.exception_handler(RequestValidationError)(validation_exception_handler)",
                           since="0.28.0"),
              source_entry(f"{EXCEPTION_HANDLERS}.validation", "validation_exception_handler",
                           "message = f\"{count} validation {label}:\\n\"",
                           "JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)",
                           since="0.28.0"),
          )),
    Patch("refusal_log", (SERVE_APP,), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "a refused streamed request logs a 29-line traceback "
          "('Error in completion stream generator') for a clean HTTP 400",
          "upstream's stream generators log client errors without a traceback",
          change=("a refused streamed request (a client error) logs one line, not a "
                  "traceback (non-streamed refusals log theirs from the route "
                  "patches, `_refusals.refusing` / `answered`)"),
          seams=(
              source_entry("vllm.entrypoints.openai.completion.serving",
                           "OpenAIServingCompletion.completion_stream_generator",
                           'logger.exception("Error in completion stream generator.")'),
              source_entry("vllm.entrypoints.openai.chat_completion.serving",
                           "OpenAIServingChat.chat_completion_stream_generator",
                           'logger.exception("Error in chat completion stream generator.")',
                           until="0.33.0"),
              source_entry("vllm.entrypoints.openai.chat_completion.serving",
                           "OpenAIServingChat.chat_completion_stream_generator_raw",
                           'logger.exception("Error in chat completion stream generator.")',
                           since="0.33.0"),
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           'logger.exception("Error in token generation stream.")'),
              name_entry("vllm.exceptions", "VLLMValidationError", until="0.27.1"),
              name_entry("vllm.exceptions", "VLLMClientError", since="0.27.1"),
          )),
    Patch("rpc_route_body", ("vllm.entrypoints.serve.dev.rpc.api_router",), Process.API_SERVER,
          Kind.FIX,
          NONE_KNOWN + "/collective_rpc answers a JSON body that is not an object with "
          "500 ('list' object has no attribute 'get'); 0.32.0's route checks it",
          "0.31 is dropped (fixed upstream in 0.32.0)", until="0.32.0",
          change=("`/collective_rpc` with a JSON body that is not an object is a 400 "
                  "(upstream's route called `.get` on it: a 500; 0.32 checks it)"),
          seams=(
              name_entry("vllm.entrypoints.serve.dev.rpc.api_router", "router", until="0.32.0"),
              source_entry("vllm.entrypoints.serve.dev.rpc.api_router", "collective_rpc",
                           'method = body.get("method")', "await raw_request.json()",
                           until="0.32.0"),
              source_entry("vllm.entrypoints.serve.dev.rpc.api_router", "attach_router",
                           "app.include_router(router)", until="0.32.0"),
          )),
    Patch("rl_route_bodies", ("{rl_router}",), Process.API_SERVER, Kind.FIX,
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
              name_entry(RL_ROUTER, "router"),
              # the endpoints it puts its checks before, by name (`raw_request`), and the
              # body fields each reads (`rl_route_bodies.ROUTE_FIELDS`)
              function_entry(RL_ROUTER, "init_weight_transfer_engine", "raw_request",
                             until="0.32.0"),
              source_entry(RL_ROUTER, "init_weight_transfer_engine", 'body.get("init_info")',
                           until="0.32.0"),
              function_entry(RL_ROUTER, "init_weight_transfer_engine", "raw_request", "init_info",
                             since="0.32.0"),
              function_entry(RL_ROUTER, "start_weight_update", "raw_request"),
              source_entry(RL_ROUTER, "start_weight_update",
                           'body.get("is_checkpoint_format", True)', until="0.27.1"),
              function_entry(RL_ROUTER, "start_draft_weight_update", "raw_request",
                             since="0.27.1"),
              function_entry(RL_ROUTER, "update_weights", "raw_request", until="0.32.0"),
              source_entry(RL_ROUTER, "update_weights", 'body.get("update_info")', until="0.32.0"),
              function_entry(RL_ROUTER, "update_weights", "raw_request", "update_info",
                             since="0.32.0"),
              function_entry(RL_ROUTER, "finish_weight_update", "raw_request", until="0.27.1"),
              function_entry(RL_ROUTER, "finish_weight_update", "raw_request", "weight_version",
                             since="0.27.1"),
              function_entry(RL_ROUTER, "abort_requests", "raw_request", since="0.27.1"),
              source_entry(RL_ROUTER, "abort_requests", 'request_ids = body.get("request_ids")',
                           "await engine.abort(request_ids)", since="0.27.1"),
              # no backend: the worker raises (an HTTP 500); the config says so before
              fields_entry("vllm.config.vllm", "VllmConfig", "weight_transfer_config"),
              source_entry("vllm.v1.worker.gpu_worker", "Worker._check_weight_transfer_engine",
                           "self.weight_transfer_engine is None"),
          )),
    Patch("abort_request_ids", ("{generate_router}",), Process.API_SERVER, Kind.FIX,
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
              function_entry(GENERATE_ROUTER, "attach_router", "app"),
              source_entry(GENERATE_ROUTER, "attach_router", 'body.get("request_ids")',
                           "app.include_router(router)", until="0.32.0"),
              name_entry(GENERATE_ROUTER, "router", since="0.32.0"),
              name_entry(GENERATE_ROUTER, "abort_router", since="0.32.0"),
              function_entry(GENERATE_ROUTER, "abort_requests", "raw_request", since="0.32.0"),
              # 0.34 validates the body with a model of its own (`AbortRequestsRequest`)
              source_entry(GENERATE_ROUTER, "abort_requests",
                           'request_ids = body.get("request_ids")',
                           ".abort(request_ids)", since="0.32.0", until="0.34.0"),
          )),
    Patch("rl_routes_auth", ("{auth}",), Process.API_SERVER, Kind.FIX,
          NONE_KNOWN + "--api-key guards only the /v1, /v2, /inference (/cohere) "
          "prefixes: the dev-mode RL routes (/pause, /resume, /collective_rpc, weight "
          "updates, cache resets) run for any caller",
          "upstream's authentication middleware guards the dev-mode and RL routes",
          change=("with a key, the pause/resume/state routes, cache resets, "
                  "weight-update and weight-version routes and `/collective_rpc` need "
                  "it too (upstream guarded only `/v1`, `/v2`, `/inference`)"),
          seams=(
              function_entry("{auth}", "AuthenticationMiddleware.__call__", "self", "scope",
                             "receive", "send"),
              function_entry("{auth}", "AuthenticationMiddleware.verify_token", "self", "headers"),
              source_entry("{auth}", "AuthenticationMiddleware.__call__",
                           "url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers)",
                           'JSONResponse(content={"error": "Unauthorized"}, status_code=401)'),
          )),
    # -- the feature ------------------------------------------------------------------------
    Patch("generate_protocol", ("{generate_protocol}",), Process.API_SERVER, Kind.FEATURE, MASK_PR,
          ("upstream declares a per-request switch, the packed format and the support "
           "logprobs."),
          change=("the `return_sampling_mask` body field; `sampling_mask` (and "
                  "`sampling_mask_reason`) on response choices; a misspelled or "
                  "misplaced mask field, or a top-level `top_k`, a 400 naming the "
                  "right field and place"),
          seams=(
              name_entry(GENERATE_PROTOCOL, "GenerateRequest"),
              *(name_entry(GENERATE_PROTOCOL, name, until="0.32.0") for name in (
                  "GenerateResponseChoice", "GenerateResponse")),
              # 0.32: one response and choice class per output mode, streamed or not
              *(fields_entry(GENERATE_PROTOCOL, f"Generate{mode}{kind}Choice", "index",
                             "token_ids", "sampling_mask",
                             since="0.32.0")
                for mode in ("Tokens", "Text") for kind in ("", "Stream")),
              *(fields_entry(GENERATE_PROTOCOL, f"Generate{mode}{kind}Response", "choices",
                             since="0.32.0")
                for mode in ("Tokens", "Text") for kind in ("", "Stream")),
              name_entry(GENERATE_PROTOCOL, "GenerateResponseBase", since="0.32.0"),
          )),
    Patch("generate_endpoint", ("{generate_serving}",),
          Process.API_SERVER, Kind.FEATURE,
          MASK_PR + "; n > 1 on /inference/v1/generate: " + NONE_KNOWN
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
              function_entry(GENERATE_SERVING, "ServingTokens.serve_tokens", "self", "request",
                             "raw_request"),
              function_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_full_generator",
                             "self", "request",
                             "result_generator", "request_id", "model_name", "request_metadata",
                             until="0.33.0"),
              function_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_full_generator",
                             "self", "request",
                             "result_generator", "request_id", "model_name", "request_metadata",
                             "derender_request", since="0.33.0"),
              function_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                             "self", "request",
                             "result_generator", "request_id", "model_name", "request_metadata",
                             until="0.34.0"),
              function_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                             "self", "request",
                             "result_generator", "request_id", "model_name", "request_metadata",
                             "processors",
                             since="0.34.0"),
              # the routes: error responses, and the error events `open_stream` turns into them
              name_entry(GENERATE_PROTOCOL, "GenerateResponse", until="0.32.0"),
              name_entry(GENERATE_PROTOCOL, "GenerateResponseBase", since="0.32.0"),
              name_entry(GENERATE_SERVING, "ServingTokens.create_error_response"),
              name_entry("vllm.sampling_params", "RequestOutputKind.FINAL_ONLY"),
              name_entry("{error_response}", "ErrorResponse"),
              # the release's class of client errors (`Release.client_error`)
              name_entry("vllm.exceptions", "VLLMValidationError", until="0.27.1"),
              name_entry("vllm.exceptions", "VLLMClientError", since="0.27.1"),
              # `StreamMasks`: each result's outputs are iterated once, no chunk is built from a
              # result before them (chat's role chunk aside: `openai_chat`), each chunk is built
              # from the output being iterated and sent as a `data: {json}` event; the choices of
              # full responses are numbered as the patches read them; error responses are
              # what the routes return as HTTP errors.
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           "async for res in result_generator", "for output in res.outputs",
                           "i = output.index"),
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           'yield f"data: {chunk.model_dump_json()}\\n\\n"', until="0.30.0"),
              # 0.30: chunks leave out absent fields
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           'yield f"data: {chunk.model_dump_json(exclude=exclude)}\\n\\n"',
                           since="0.30.0"),
              # sized from the first result: `every_choice_first` hands it every choice ...
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           "num_generated_tokens = [0] * len(res.outputs)", until="0.32.0"),
              # ... until 0.32 sizes them by n (fixed upstream)
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_stream_generator",
                           "num_generated_tokens = [0] * sampling_params.n", since="0.32.0"),
              # 0.29: unstreamed requests run FINAL_ONLY (fixed upstream)
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens",
                           "RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY",
                           since="0.29.0"),
              source_entry(GENERATE_SERVING, "ServingTokens.serve_tokens_full_generator",
                           "index=output.index"),
              source_entry(GENERATE_ROUTER, "generate", "isinstance(generator, ErrorResponse)"),
          )),
    Patch("generate_route", ("vllm.entrypoints.scale_out.factories",), Process.API_SERVER,
          Kind.FEATURE,
          "none: vLLM 0.30 on serves the route only with --enable-scale-out",
          "upstream serves /inference/v1/generate with its sampling-mask flag",
          since="0.30.0",
          change="a server with `--return-sampling-mask` serves `/inference/v1/generate` "
          "(and its abort route) without `--enable-scale-out`, in place of any stubs",
          seams=(
              function_entry("vllm.entrypoints.scale_out.factories",
                             "register_scale_out_api_routers",
                             "app", "supported_tasks"),
              source_entry("vllm.entrypoints.scale_out.factories",
                           "register_scale_out_api_routers",
                           'getattr(args, "enable_scale_out", False)',
                           'getattr(args, "tokens_only", False)'),
              # 0.32: without the option, 403 stubs the patch replaces (0.30-0.31: no route)
              source_entry("vllm.entrypoints.scale_out.factories",
                           "register_scale_out_api_routers",
                           "disabled_scale_out", since="0.32.0"),
              name_entry(GENERATE_ROUTER, "router"),
          )),
    Patch("completion_protocol", ("vllm.entrypoints.openai.completion.protocol",),
          Process.API_SERVER, Kind.FEATURE, MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE,
          seams=protocol_seams(OPENAI_COMPLETION, "CompletionRequest", "CompletionResponseChoice",
                               "CompletionResponse")),
    Patch("openai_completions", ("vllm.entrypoints.openai.completion.serving",),
          Process.API_SERVER, Kind.FEATURE, MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE,
          seams=(
              function_entry(f"{OPENAI_COMPLETION}.serving",
                             "OpenAIServingCompletion.create_completion", "self",
                             "request", "raw_request"),
              function_entry(f"{OPENAI_COMPLETION}.serving",
                             "OpenAIServingCompletion.request_output_to_completion_response",
                             "self", "final_res_batch", "request", "request_id", "created_time",
                             "model_name", "tokenizer", "request_metadata"),
              function_entry(f"{OPENAI_COMPLETION}.serving",
                             "OpenAIServingCompletion.completion_stream_generator",
                             "self", "request", "engine_inputs", "result_generator", "request_id",
                             "created_time", "model_name", "num_prompts", "tokenizer",
                             "request_metadata"),
              name_entry(f"{OPENAI_COMPLETION}.serving",
                         "OpenAIServingCompletion.create_error_response"),
              # the error event a stream generator writes for an exception (0.24 defines it
              # on `openai.engine.serving.OpenAIServing`, 0.27 on
              # `generate.base.serving.GenerateBaseServing`)
              name_entry(f"{OPENAI_COMPLETION}.serving",
                         "OpenAIServingCompletion.create_streaming_error_response"),
              source_entry(f"{OPENAI_COMPLETION}.serving",
                           "OpenAIServingCompletion.completion_stream_generator",
                           "async for prompt_idx, res in result_generator",
                           "for output in res.outputs",
                           "i = output.index + prompt_idx * num_choices",
                           'yield f"data: {response_json}'),
              source_entry(f"{OPENAI_COMPLETION}.serving",
                           "OpenAIServingCompletion.request_output_to_completion_response",
                           "for final_res in final_res_batch", "for output in final_res.outputs",
                           "index=len(choices)"),
              source_entry(f"{OPENAI_COMPLETION}.api_router", "create_completion",
                           "isinstance(generator, ErrorResponse)"),
          )),
    Patch("chat_protocol", ("vllm.entrypoints.openai.chat_completion.protocol",),
          Process.API_SERVER, Kind.FEATURE, MASK_PR,
          PROTOCOL_GONE,
          change=PROTOCOL_CHANGE,
          seams=protocol_seams(OPENAI_CHAT, "ChatCompletionRequest", "ChatCompletionResponseChoice",
                               "ChatCompletionResponse")),
    Patch("openai_chat", ("vllm.entrypoints.openai.chat_completion.serving",), Process.API_SERVER,
          Kind.FEATURE, MASK_PR,
          SERVING_GONE, change=SERVING_CHANGE,
          seams=(
              function_entry(f"{OPENAI_CHAT}.serving", "OpenAIServingChat.create_chat_completion",
                             "self",
                             "request", "raw_request"),
              function_entry(f"{OPENAI_CHAT}.serving",
                             "OpenAIServingChat.chat_completion_full_generator", "self",
                             "request", "result_generator", "request_id", "model_name",
                             "conversation",
                             "tokenizer", "request_metadata", "parser", "mm_token_counts"),
              function_entry(f"{OPENAI_CHAT}.serving",
                             "OpenAIServingChat.chat_completion_stream_generator", "self",
                             "request", "result_generator", "request_id", "model_name",
                             "conversation",
                             "tokenizer", "request_metadata", "chat_template_kwargs",
                             "mm_token_counts"),
              name_entry(f"{OPENAI_CHAT}.serving", "ChatCompletionResponse"),
              name_entry(f"{OPENAI_CHAT}.serving", "OpenAIServingChat.create_error_response"),
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_stream_generator",
                           "async for res in result_generator", "for output in res.outputs",
                           "i = output.index", 'yield f"data: {data}', until="0.33.0"),
              # 0.33: the generator (the one wrapped) serialises the chunks of `..._raw`, which
              # reads the results
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_stream_generator",
                           "self.chat_completion_stream_generator_raw(", "result_generator",
                           'yield f"data: {data}', since="0.33.0"),
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_stream_generator_raw",
                           "async for res in result_generator", "for output in res.outputs",
                           "i = output.index", since="0.33.0"),
              # chunks built from a result before its outputs are read: the role chunk (and
              # echo's), from the first result only (`StreamMasks`' `ahead`)
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_stream_generator",
                           "if first_iteration:", "first_iteration = False", until="0.33.0"),
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_stream_generator_raw",
                           "if first_iteration:", "first_iteration = False", since="0.33.0"),
              source_entry(f"{OPENAI_CHAT}.serving",
                           "OpenAIServingChat.chat_completion_full_generator",
                           "index=output.index"),
              source_entry(f"{OPENAI_CHAT}.api_router", "create_chat_completion",
                           "isinstance(generator, ErrorResponse)"),
          )),
    # the three routes' full responses: lists masks written from their arrays as the
    # body is rendered (FastAPI's JSONResponse is Starlette's)
    Patch("json_response", ("starlette.responses",), Process.API_SERVER, Kind.FEATURE,
          "none: an overlay field (vLLM #49577 writes its engine-wide lists through "
          "pydantic and json.dumps)",
          "upstream writes the mask's field from its arrays",
          change=("a full response's lists masks (`MaskLists`) written from their "
                  "arrays as the body is rendered: the bytes pydantic and "
                  "`json.dumps` would write"),
          seams=(
              function_entry("starlette.responses", "JSONResponse.render", "self", "content"),
              # every route returns a full response as the JSON of its bare `model_dump()`
              source_entry(f"{OPENAI_COMPLETION}.api_router", "create_completion",
                           "JSONResponse(\n            content=generator.model_dump(),\n"),
              source_entry(f"{OPENAI_CHAT}.api_router", "create_chat_completion",
                           "JSONResponse(\n            content=generator.model_dump(),\n"),
              source_entry(GENERATE_ROUTER, "generate",
                           "return JSONResponse(content=generator.model_dump())"),
          )),
    # `/v1/models` says the served dtype, so replay_check can explain a bfloat16 spread
    Patch("models_dtype", ("vllm.entrypoints.openai.models.serving",), Process.API_SERVER,
          Kind.FEATURE,
          "none: vLLM exposes the served dtype on no public route",
          "upstream reports the served dtype on a public route",
          change=("`/v1/models` cards carry the served `dtype` (replay_check explains "
                  "a bfloat16 spread)"),
          seams=(
              function_entry("vllm.entrypoints.openai.models.serving",
                             "OpenAIServingModels.show_available_models", "self"),
              source_entry("vllm.entrypoints.openai.models.serving",
                           "OpenAIServingModels.__init__",
                           "self.model_config = ", "self.base_model_paths = base_model_paths"),
          )),
    # -- diagnostics ------------------------------------------------------------------------
    Patch("debug_state", (SERVE_APP,), Process.API_SERVER, Kind.DIAGNOSTIC,
          "none: a test aid (upstream has no per-request state endpoint)", "keep",
          change=("`GET /debug/sampling_mask/state`, per-request state counts in "
                  "every process (soak and fuzz checks)"),
          seams=(
              # The state route: `build_app`, the app's engine client, its output processor and
              # engine-core client, the utility call by name, and the per-request containers it
              # counts in the engine core and the workers.
              function_entry("{app}", "build_app", "args", "supported_tasks", "model_config"),
              function_entry("vllm.v1.engine.core_client", "AsyncMPClient.call_utility_async",
                             "self",
                             "method", "args"),
              source_entry("{app_state}", "init_app_state", "state.engine_client = engine_client"),
              source_entry(ASYNC_LLM, "AsyncLLM.__init__", "self.output_processor = ",
                           "self.engine_core = "),
              source_entry(OUTPUT_PROCESSOR, "OutputProcessor.__init__", "self.request_states",
                           "self.parent_requests"),
          )),
)
