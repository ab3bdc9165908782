"""Skip the integer-overflow checks that Triton's interpreter computes and then drops.

What it sets, only under TRITON_INTERPRET=1 and without Triton's debug mode:

- `triton.runtime.interpreter.interpreter_builder.options.sanitize_overflow`: False.

Why: with `sanitize_overflow` on, every 32-bit integer add, sub and mul also computes
its int64 result and range test for a `device_assert`, which returns at once without
`debug` (compiled kernels drop the check as dead code). The interpreter ran that work
in numpy: a third of an interpreted sampling step (MRv2's Gumbel hash).
"""

from __future__ import annotations

import dataclasses

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if not triton_interpreter_on():
        return
    builder = module.interpreter_builder
    # with `debug` the checks' asserts are live: leave them
    if not builder.options.debug and builder.options.sanitize_overflow:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
