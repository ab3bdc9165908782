"""Give the Gumbel sampling kernel a `log1p` that Triton's interpreter runs.

What it replaces, in `vllm.v1.worker.gpu.sample.gumbel`, only under TRITON_INTERPRET=1:

- the name `tldevice`, with a namespace whose `log1p` is a small `@triton.jit` function
  (`worker.triton_shims`).

Why: the interpreter patches `triton.language` but not libdevice, whose Python stubs
return None: `_gumbel_sample_kernel` failed interpreted.
"""

import types

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if not triton_interpreter_on():
        return
    from vllm_sampling_mask.worker import triton_shims

    module.tldevice = types.SimpleNamespace(log1p=triton_shims.log1p)
