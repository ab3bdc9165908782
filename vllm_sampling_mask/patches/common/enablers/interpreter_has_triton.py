"""Report Triton as usable when Triton's interpreter is switched on.

What it sets, only under TRITON_INTERPRET=1, before any vLLM module copies the flag:

- `vllm.triton_utils.importing.HAS_TRITON = True`.

Why: Model Runner V2 (whose sampler carries the mask) needs Triton, which vLLM counts
only with a GPU driver; the interpreter runs every `@triton.jit` kernel on the CPU, how
CI runs the real MRv2 path here.
"""

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if triton_interpreter_on():
        module.HAS_TRITON = True
