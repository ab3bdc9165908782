"""Report Triton as usable when Triton's interpreter is switched on.

What: sets `vllm.triton_utils.importing.HAS_TRITON = True` when
    TRITON_INTERPRET=1, before any vLLM module copies the flag.
Why: Model Runner V2 (whose sampler carries the sampling mask) needs Triton,
    and vLLM only counts Triton as present when a GPU driver is active. Under
    TRITON_INTERPRET=1 Triton runs every `@triton.jit` kernel on the CPU
    through its interpreter, which is how CI runs the real MRv2 path here.
    Without TRITON_INTERPRET=1 nothing changes.
"""

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if triton_interpreter_on():
        module.HAS_TRITON = True
