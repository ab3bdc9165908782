"""Which model runners the overlay extracts masks from, and the start-up refusal of
any other (an engine started with the flag on a runner no adapter wraps would
return tokens without masks).

The runner adapters (`patches/worker/feature/runner`, `runner_v1`) `cover` the class
they wrap when they are applied; the worker checks its runner with
`refuse_uncovered` before it loads the model (`patches/worker/feature/runner_coverage`).
"""

from __future__ import annotations

_COVERED: list[type] = []


def cover(runner_class: type) -> None:
    """Record that an adapter extracts masks from `runner_class` and its subclasses."""
    if runner_class not in _COVERED:
        _COVERED.append(runner_class)


def covered(runner) -> bool:
    return isinstance(runner, tuple(_COVERED))


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def refuse_uncovered(runner) -> None:
    """Raise a ValueError naming `runner`'s class and the fix, unless an adapter
    covers it."""
    if covered(runner):
        return
    known = ", ".join(_name(c) for c in _COVERED) or "none imported in this worker"
    raise ValueError(
        f"--return-sampling-mask (return_sampling_mask=True): this worker runs "
        f"{_name(type(runner))}, which vllm_sampling_mask extracts no mask from (it "
        f"extracts from the model runners it wraps: {known}). Run where vLLM uses "
        "one of those (on a CPU host: x86_64 with Triton, where vLLM runs its "
        "Triton-based CPU runner), or start the engine without --return-sampling-mask.")
