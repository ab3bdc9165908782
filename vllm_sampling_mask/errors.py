"""Every exception the overlay raises, in one module.

Importing this module imports nothing of vLLM: `MissingSamplingMaskError`,
`MaskStepOrderError` and `UpstreamVersionError` are plain classes (the vLLM-free state and the version
guard raise them). The client errors derive from vLLM's exception classes (so
vLLM's server answers them with HTTP 400), and are built on first access:
`errors.SamplingMaskRequestError`, `errors.RequestInputError`,
`errors.SamplingMaskGenerationError`.
"""

from __future__ import annotations


class UpstreamVersionError(ImportError):
    """The installed vLLM is not a release this overlay was written for."""


class MissingSamplingMaskError(RuntimeError):
    """With the engine flag on, a hop of the mask's path found no mask.

    Raised, never papered over with `sampling_mask=None`: it means a producer
    upstream of `hop` stopped writing its declared field (an upstream change
    the seam contract tests should also catch).
    """

    def __init__(self, hop: str, detail: str) -> None:
        super().__init__(
            f"sampling mask missing at {hop}: {detail}. The engine was started with "
            "return_sampling_mask, so every hop must carry a mask; this is a bug in "
            "vllm_sampling_mask or an upstream change it does not know about.")
        self.hop = hop


class MaskStepOrderError(RuntimeError):
    """A hop of the mask's path set a stage of one sampler step that was already set
    (`worker.step.MaskStep`: each stage is set once, by the hop that owns it)."""

    def __init__(self, hop: str, detail: str) -> None:
        super().__init__(
            f"sampling mask step out of order at {hop}: {detail}. Each stage of a step "
            "(plan, capture, parts, mask, copy) is set once per sampler call; this is a "
            "bug in vllm_sampling_mask or an upstream change that calls a hop twice in "
            "one step.")
        self.hop = hop


class WeightsRefusedError(ValueError):
    """`reload_weights` refused its arguments before touching the engine's weights
    (`weights_check`): one line naming the parameter (`weights_path`, ...), the cause
    and the fix. The API server answers it with HTTP 400 (`collective_rpc_refusals`)."""

    PREFIX = "reload_weights refused ("
    MARK = PREFIX + "weights_path): "

    def __init__(self, reason: str, parameter: str = "weights_path") -> None:
        super().__init__(f"{self.PREFIX}{parameter}): {' '.join(reason.split())}")
        self.parameter = parameter


class WeightsRestoredError(RuntimeError):
    """`reload_weights` failed while loading a checkpoint that passed the checks; the
    engine's weights were put back as they were (`reload_weights_recovery`)."""

    MARK = "reload_weights failed while loading, the previous weights are restored: "

    def __init__(self, cause: BaseException) -> None:
        text = " ".join(str(cause).split()) or "no message"
        super().__init__(f"{self.MARK}{type(cause).__name__}: {text[:500]}")


class ReplayCheckError(Exception):
    """`replay_check`: a bad argument or an unreachable model/server, said as the fix."""


def _client_errors() -> dict[str, type]:
    import vllm
    import vllm.exceptions
    from vllm.exceptions import VLLMValidationError

    from vllm_sampling_mask.releases import by_version

    # the release's class of client errors (`Release.client_error`: `VLLMClientError`
    # from 0.27, answered 400 without a parameter; 0.24 has only `VLLMValidationError`).
    # The release is read from `releases`, not `patches.apply` (which imports this module);
    # an unlisted one never gets here with the overlay on: `patches.apply` refuses it first.
    release = by_version(vllm.__version__)
    if release is None:
        raise UpstreamVersionError(f"vLLM {vllm.__version__} is not a supported release")
    ClientError = getattr(vllm.exceptions, release.client_error)

    class SamplingMaskRequestError(VLLMValidationError, ValueError):
        """A sampling-mask request the engine cannot serve: a 400 at the HTTP
        server naming the parameter; a ValueError from `LLM.generate`."""

    class RequestInputError(VLLMValidationError, ValueError):
        """A request the input processor refuses (a token id outside the model,
        an integer beyond 64 bits, ...): HTTP 400; a ValueError for `LLM`."""

    class SamplingMaskGenerationError(ClientError):
        """A completion whose mask could not be taken (`sampling_mask_error`): the
        client gets its message with HTTP 400 (no parameter), or as an error event
        in a stream."""

    classes = {c.__name__: c for c in (SamplingMaskRequestError, RequestInputError,
                                       SamplingMaskGenerationError)}
    for c in classes.values():
        c.__module__ = __name__
        c.__qualname__ = c.__name__
    return classes


_CLIENT_ERRORS = ("SamplingMaskRequestError", "RequestInputError",
                  "SamplingMaskGenerationError")


def __getattr__(name: str):
    if name in _CLIENT_ERRORS:
        globals().update(_client_errors())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
