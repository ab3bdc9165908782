"""Keep MRv2's memory-profiling sampler run finite under Triton's interpreter.

What it wraps, in vllm/v1/worker/gpu/model_runner.py, only under TRITON_INTERPRET=1:

- `GPUModelRunner._dummy_sampler_run`: non-finite values of the dummy hidden states
  become zeros before upstream computes logits and samples.

Why: the profiling run feeds uninitialised buffers, and the interpreter's
`tl.max(..., return_indices=True)` raises "All-NaN slice encountered" (a GPU passes the
NaN logits harmlessly): engine start-up failed at random on CPU hosts.
"""

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.patches._wrap import with_argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if not triton_interpreter_on():
        return
    import torch

    @wraps(module, "GPUModelRunner._dummy_sampler_run")
    def _dummy_sampler_run(wrapped, self, args, kwargs):
        args, kwargs = with_argument(
            wrapped, args, kwargs, "hidden_states",
            lambda hidden: torch.nan_to_num(hidden, nan=0.0, posinf=0.0, neginf=0.0))
        return wrapped(*args, **kwargs)
