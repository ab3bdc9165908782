"""`POST /collective_rpc`: the caller's mistakes are HTTP 400s with one line.

What it wraps: `AsyncLLM.collective_rpc` (vllm/v1/engine/async_llm.py; the route and
`AsyncLLM` callers; `collective_rpc_refusals_sync` does the same for `LLM`):

- before the call, a call by name that cannot run is refused with the release's
  validation error naming the parameter (HTTP 400), and never reaches the workers;
- after it, a worker's reload refusal (`WeightsRefusedError`) is an HTTP 400 with its own
  line, a reload undone part-way (`WeightsRestoredError`) that error's line alone.

Why: upstream checks only that the body has a `method`; the rest failed in the workers
and came back as HTTP 500 with the worker's wrapped text.
"""

from __future__ import annotations

from vllm_sampling_mask.errors import WeightsRefusedError, WeightsRestoredError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.http.rpc_check import rpc_problem
from vllm_sampling_mask.worker.weights_check import failure_in, refusal_in, refused_parameter

_CLASSES = "_sampling_mask_worker_classes"


def worker_classes(engine) -> tuple | None:
    """Where a call by name finds its method, in the order the worker wrapper
    looks (its own attributes, then the worker's); None when they cannot be
    imported here (the call is then checked by type only)."""
    found = getattr(engine, _CLASSES, False)
    if found is not False:
        return found
    try:
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        parallel = engine.vllm_config.parallel_config
        classes = [WorkerWrapperBase]
        for name in (parallel.worker_extension_cls, parallel.worker_cls):
            if isinstance(name, str) and name and name != "auto":
                classes.append(resolve_obj_by_qualname(name))
            elif isinstance(name, type):
                classes.append(name)
        found = tuple(classes) if len(classes) > 1 else None
    except Exception:   # an unusual worker: checked by type only
        found = None
    setattr(engine, _CLASSES, found)
    return found


def has_weight_transfer(engine) -> bool:
    """False only where the engine's config says no weight-transfer backend is set
    (a release without the option: True, nothing to check)."""
    config = getattr(engine, "vllm_config", None)
    return config is None or getattr(config, "weight_transfer_config", 0) is not None


def refused(engine, args, kwargs, wrapped):
    """The validation error for a call that cannot run, or None."""
    # `rpc_check.rpc_problem`: a method that is no string, private (upstream re-ran the
    # wrapper's constructor for "__init__"), or not the worker's; `args`, `kwargs` or
    # `timeout` of the wrong type; arguments that do not bind; a weight-transfer method
    # on an engine without `--weight-transfer-config`
    problem = rpc_problem(argument(wrapped, args, kwargs, "method"),
                          argument(wrapped, args, kwargs, "args"),
                          argument(wrapped, args, kwargs, "kwargs"),
                          argument(wrapped, args, kwargs, "timeout"),
                          worker_classes(engine), has_weight_transfer(engine))
    if problem is None:
        return None
    from vllm.exceptions import VLLMValidationError
    parameter, message = problem
    return VLLMValidationError(f"collective_rpc refused ({parameter}): {message}",
                               parameter=parameter)


def translated(exc: Exception, client: bool) -> Exception | None:
    """The overlay's reload error that `exc` carries (as itself or as text), as the
    API raises it: a validation error for the HTTP app (`client`), the overlay's
    own class for `LLM`; None when it carries none."""
    # it reaches this process as text in a plain `Exception("Call to collective_rpc
    # method failed: ...")`; every other failure is left as it was
    text = str(exc)

    refusal = refusal_in(text)
    if refusal is not None:
        parameter = refused_parameter(refusal)
        if client:
            from vllm.exceptions import VLLMValidationError
            return VLLMValidationError(refusal, parameter=parameter)
        if isinstance(exc, WeightsRefusedError):
            return exc
        reason = refusal[len(WeightsRefusedError.PREFIX) + len(parameter) + 3:]
        return WeightsRefusedError(reason, parameter=parameter)
    failure = failure_in(text)
    if failure is not None:
        if isinstance(exc, WeightsRestoredError):
            return exc
        restored = WeightsRestoredError(RuntimeError())
        restored.args = (failure,)
        return restored
    return None


def apply(module, release: Release) -> None:
    @wraps(module, "AsyncLLM.collective_rpc")
    async def collective_rpc(wrapped, self, args, kwargs):
        refusal = refused(self, args, kwargs, wrapped)
        if refusal is not None:
            raise refusal
        try:
            return await wrapped(*args, **kwargs)
        except Exception as exc:
            known = translated(exc, client=True)
            if known is None or known is exc:
                raise
            raise known from None
