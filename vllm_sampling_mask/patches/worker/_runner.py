"""What the two runner adapters (`feature/runner`, `feature/runner_v1`) share.

`wraps_with_state(module, name)` wraps a runner method whose wrapper acts only with the
runner's state: without it (the flag off, or a rank that is not the output rank) the
upstream method runs as it is.

`profile_with_masks(module)` makes the memory-profiling run (`_dummy_sampler_run`)
extract inside the state's `profiling()`, so the KV cache is sized with the mask's
widest step included.

`mask_state_for(runner)` builds the runner's `SamplingMaskState` where the mask
is wanted: the engine flag is on and this worker's `ModelRunnerOutput` is the one
the executor returns. Under tensor (and prefill-context) parallelism every rank
samples the same tokens, but vLLM's executors return only the first rank of the
last pipeline stage (`MultiprocExecutor._get_output_rank`); the other ranks get
no state, so they extract and copy nothing. Under the `external_launcher` backend
(torchrun, one engine per rank) every rank schedules from its own output, so every
rank gets a state.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.worker.state import SamplingMaskState


def is_output_rank() -> bool:
    """This worker is the first tensor/context-parallel rank of the last stage."""
    from vllm.distributed import parallel_state as ps

    return (ps.get_pp_group().is_last_rank and ps.get_tp_group().is_first_rank
            and ps.get_pcp_group().is_first_rank)


def mask_state_for(runner) -> SamplingMaskState | None:
    config = runner.vllm_config
    if not mask_enabled(config):
        return None
    # torchrun-style SPMD (`external_launcher`, colocated RL trainers): every rank
    # runs its own scheduler on its own runner output, so every rank needs masks.
    every_rank = config.parallel_config.distributed_executor_backend == "external_launcher"
    if not every_rank and not is_output_rank():
        return None
    return SamplingMaskState(runner.max_num_reqs, runner.model_config.sampling_mask_settings.max_size)


def wraps_with_state(module, name: str):
    """`wraps` for a runner method: the wrapper is called as `(wrapped, self, state,
    args, kwargs)` with the runner's `SamplingMaskState`, and not at all on a runner
    without one (the upstream method is called instead)."""
    def decorate(wrapper):
        @wraps(module, name)
        @functools.wraps(wrapper)
        def with_state(wrapped, self, args, kwargs):
            state = self.sampling_mask
            if state is None:
                return wrapped(*args, **kwargs)
            return wrapper(wrapped, self, state, args, kwargs)
        return wrapper
    return decorate


def profile_with_masks(module) -> None:
    """Wrap `module.GPUModelRunner._dummy_sampler_run` (either runner): with the
    runner's state, the run's sampler calls extract inside `state.profiling()`."""

    @wraps_with_state(module, "GPUModelRunner._dummy_sampler_run")
    def _dummy_sampler_run(wrapped, self, state, args, kwargs):
        with state.profiling():
            return wrapped(*args, **kwargs)
