"""Masked loads and stores take an integer mask under Triton's interpreter.

What it wraps, in triton/runtime/interpreter.py, only under TRITON_INTERPRET=1:

- `InterpreterBuilder.create_masked_load` and `create_masked_store`: a mask that is not
  boolean (an integer 0/1 array) is handed on as its boolean (nonzero).

Why: the interpreter refused Model Runner V2's n-gram speculator's slot mask, so
speculative decoding on Model Runner V2 could not run on a CPU host.
"""

from __future__ import annotations

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.patches._wrap import argument, with_argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if not triton_interpreter_on():
        return
    import numpy as np
    import triton.language as tl

    def boolean(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return module.TensorHandle(mask.data != 0, tl.int1)

    # The interpreter types `(vector < n) & scalar_flag & (vector < K)` as int64 where
    # compiled Triton keeps int1, then refuses it ("mask has unsupported dtype"):
    # `_ngram_finalize_kernel` builds its slot mask that way.
    def masked(original, instance, args, kwargs):

        if argument(original, args, kwargs, "mask").data.dtype != np.bool_:
            args, kwargs = with_argument(original, args, kwargs, "mask", boolean)
        return original(*args, **kwargs)

    wraps(module, "InterpreterBuilder.create_masked_load")(masked)
    wraps(module, "InterpreterBuilder.create_masked_store")(masked)
