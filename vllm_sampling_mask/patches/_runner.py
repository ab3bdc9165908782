"""What the two runner adapters (`feature/runner`, `feature/runner_v1`) share.

`mask_state_for(runner)` builds the runner's `SamplingMaskState` where the mask
is wanted: the engine flag is on and this worker's `ModelRunnerOutput` is the one
the executor returns. Under tensor (and prefill-context) parallelism every rank
samples the same tokens, but vLLM's executors return only the first rank of the
last pipeline stage (`MultiprocExecutor._get_output_rank`); the other ranks get
no state, so they extract and copy nothing.
"""

from __future__ import annotations

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.state import SamplingMaskState


def is_output_rank() -> bool:
    """This worker is the first tensor/context-parallel rank of the last stage."""
    from vllm.distributed import parallel_state as ps

    return (ps.get_pp_group().is_last_rank and ps.get_tp_group().is_first_rank
            and ps.get_pcp_group().is_first_rank)


def mask_state_for(runner) -> SamplingMaskState | None:
    if not mask_enabled(runner.vllm_config) or not is_output_rank():
        return None
    return SamplingMaskState(runner.max_num_reqs, runner.model_config.max_sampling_mask_size)
