"""The engine flag: `EngineArgs.return_sampling_mask` and `--return-sampling-mask`.

What it adds and wraps, in `vllm/engine/arg_utils.py`:

- `EngineArgs` (and `AsyncEngineArgs`) fields `return_sampling_mask` (where upstream has
  none) and `max_sampling_mask_size`;
- `EngineArgs.add_cli_args`: the two flags, documented, in the ModelConfig group;
- `EngineArgs.create_model_config`: the values onto `ModelConfig.sampling_mask_settings`;
- `EngineArgs.create_engine_config`: refuses configurations the mask cannot be exact
  under, with one ValueError listing each reason and its fix.

Why: `LLM(...)` passes its keywords straight into `EngineArgs` before any plugin loads,
and `create_engine_config` is the one point `LLM` and `vllm serve` both pass with the
final config in hand.
"""

from __future__ import annotations

import argparse

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.config import return_mask_from_env
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.frontend.validation import DEFAULT_MAX_SIZE, EngineMaskSettings, startup_errors

# (`release.upstream_mask`: the release has a sampling mask of its own, vLLM #49577,
# 0.28 on: the `return_sampling_mask` field and option exist, and
# `ModelConfig.return_sampling_mask` switches on upstream's extraction, transport and
# checks.)
# 0.32's opt-in tensor-parallel sampling of batch slices (absent in 0.27.1): refused
# with the mask, as upstream refuses it beside its own
BATCH_SHARDED = "enable_batch_sharded_sampling"

SIZE_HELP = (
    "With --return-sampling-mask: the widest support, in ids, one step may return "
    f"(default {DEFAULT_MAX_SIZE}). A request with return_sampling_mask=true and a "
    "larger top_k is refused (HTTP 400); a step whose support is wider ends its "
    "request with an error naming this limit. Device memory per step is bounded by "
    "the batch size times this many ids.")
HELP = (
    "Return, for every generated token, the ids the sampler could draw it from "
    "(the support after logits processors, top-k, top-p and min-p) as "
    "`CompletionOutput.sampling_mask` and `choices[].sampling_mask` of "
    "/inference/v1/generate, /v1/completions and /v1/chat/completions. Requires "
    "--logprobs-mode processed_logprobs; works on the V1 model runner and on Model "
    "Runner V2. Per request, return_sampling_mask true/false/null (null: a mask "
    "when temperature > 0 and top_k, top_p or min_p truncates the distribution).")


def apply(module, release: Release) -> None:
    upstream_mask = release.upstream_mask
    EngineArgs = module.EngineArgs
    if not upstream_mask:
        add_field(EngineArgs, "return_sampling_mask", bool, False,
                  subclasses=(module.AsyncEngineArgs,))
    add_field(EngineArgs, "max_sampling_mask_size", int, DEFAULT_MAX_SIZE,
              subclasses=(module.AsyncEngineArgs,))

    @wraps(module, "EngineArgs.add_cli_args")
    def add_cli_args(wrapped, instance, args, kwargs):
        parser = wrapped(*args, **kwargs)
        group = next((g for g in parser._action_groups if g.title == "ModelConfig"),
                     parser)
        if upstream_mask:   # upstream's option, with what it now does
            for action in parser._actions:
                if "--return-sampling-mask" in action.option_strings:
                    action.help = HELP
        else:
            group.add_argument("--return-sampling-mask",
                               action=argparse.BooleanOptionalAction, default=False,
                               help=HELP)
        group.add_argument("--max-sampling-mask-size", type=int,
                           default=DEFAULT_MAX_SIZE, help=SIZE_HELP)
        return parser

    @wraps(module, "EngineArgs.create_model_config")
    def create_model_config(wrapped, self, args, kwargs):
        model_config = wrapped(*args, **kwargs)
        model_config.sampling_mask_settings = (
            EngineMaskSettings(max_size=int(self.max_sampling_mask_size))
            if self.return_sampling_mask else None)
        # on 0.32 upstream's own `return_sampling_mask` is set False here, so its
        # Model-Runner-V2-only machinery, config checks and request checks stay off
        if upstream_mask:   # upstream's own switch stays off: the overlay's runs
            model_config.return_sampling_mask = False
        return model_config

    from vllm import envs
    from vllm.logger import init_logger
    logger = init_logger("vllm.sampling_mask")

    def runs_v2(config=None) -> bool:
        """Model Runner V2: the only runner from 0.34 (`Release.v1_runner`), else the
        engine's choice (VLLM_USE_V2_MODEL_RUNNER before the config is built)."""
        if not release.v1_runner:
            return True
        if config is None:
            return envs.VLLM_USE_V2_MODEL_RUNNER is True
        return bool(config.use_v2_model_runner)

    @wraps(module, "EngineArgs.create_engine_config")
    def create_engine_config(wrapped, self, args, kwargs):
        # the way in for a framework that builds `LLM(...)` itself with fixed arguments
        # (TRL's colocate mode)
        if not self.return_sampling_mask and return_mask_from_env():
            self.return_sampling_mask = True    # VLLM_SAMPLING_MASK_RETURN=1

        if self.return_sampling_mask:
            # What the arguments already say is checked first, so these errors
            # come before any upstream complaint about the same settings.
            if self.max_sampling_mask_size < 1:
                _raise([f"--max-sampling-mask-size must be at least 1 (got "
                        f"{self.max_sampling_mask_size}): it is the widest support, in "
                        "ids, a step may return."])
            _raise(startup_errors(
                logprobs_mode=self.logprobs_mode,
                use_v2_model_runner=runs_v2(),
                speculative=self.speculative_config,
                logits_processors=self.logits_processors, runner_type="generate",
                is_diffusion=False,
                batch_sharded_sampling=bool(getattr(self, BATCH_SHARDED, False)),
                v1_runner=release.v1_runner))
        config = wrapped(*args, **kwargs)
        if self.return_sampling_mask:
            mc = config.model_config
            _raise(startup_errors(
                logprobs_mode=mc.logprobs_mode,
                use_v2_model_runner=runs_v2(config),
                speculative=config.speculative_config,
                logits_processors=mc.logits_processors,
                runner_type=mc.runner_type,
                is_diffusion=bool(mc.is_diffusion),
                batch_sharded_sampling=bool(getattr(config.parallel_config, BATCH_SHARDED,
                                                    False)),
                v1_runner=release.v1_runner))
            logger.info("Sampling masks on: every generated token returns its support "
                        "(%s).", "Model Runner V2" if runs_v2(config)
                        else "V1 model runner")
        return config


def _raise(errors: list[str]) -> None:
    if errors:
        error = ValueError(" ".join(errors))
        _one_line_if_uncaught(error)
        raise error


def _one_line_if_uncaught(error: BaseException) -> None:
    """In the `vllm` command (`vllm serve ...`), a start-up error that nothing
    catches ends the process with one line, `vllm serve: error: <message>`, and exit
    code 1, not a traceback through vLLM's start-up; `LLM(...)` and every other
    program get the ValueError as it is."""
    import os
    import sys

    if os.path.basename(sys.argv[0] or "") != "vllm":
        return
    previous = sys.excepthook
    command = " ".join(["vllm", *sys.argv[1:2]])

    def hook(kind, value, tb):
        if value is error:
            print(f"{command}: error: {value}", file=sys.stderr, flush=True)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook
