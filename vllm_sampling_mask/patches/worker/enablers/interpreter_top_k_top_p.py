"""Run vLLM's Triton top-k/top-p kernel under Triton's interpreter.

What it wraps, under TRITON_INTERPRET=1:

- `triton.runtime.interpreter._patch_lang_core`: inside every interpreted kernel,
  `tl.range` yields scalar Triton integer tensors, as compiled Triton does;
- `apply_top_k_top_p` (vllm/v1/sample/ops/topk_topp_sampler.py), unless
  VLLM_SAMPLING_MASK_TRITON_TOPK=1: CPU tensors go to upstream's PyTorch path.

Why: interpreted, `_topk_topp_kernel` failed ("'int' object has no attribute 'to'");
this makes it run, so a test can check masks against what the GPU kernel keeps.
"""

from __future__ import annotations

import operator

from vllm_sampling_mask.config import interpreted_triton_top_k, triton_interpreter_on
from vllm_sampling_mask.releases import Release

_applied = False  # wrapped once per process, whatever calls apply()


def _loop_type(bounds, tl, semantic):
    """The dtype compiled Triton gives a loop variable over these bounds."""
    # start, end and step promoted together (int32 for int32 bounds)
    ty = None
    for bound in bounds:
        if isinstance(bound, tl.constexpr):
            bound = bound.value
        # (`to_tensor`: Triton 3.6, torch 2.11's, has no `to_tensor_type`)
        bty = bound.dtype if isinstance(bound, tl.tensor) else semantic.to_tensor(bound).dtype
        ty = bty if ty is None else semantic.integer_promote_impl(ty, bty)
    return ty


def _make_tensor_range(interpreter):
    import numpy as np
    import triton.language as tl

    semantic = interpreter.interpreter_semantic
    handle = interpreter.TensorHandle

    # The values are those of Python's `range`, as tensors, so integer arithmetic wraps
    # as on a GPU. `tl.static_range` and the builtin `range` keep yielding ints
    # (compiled Triton makes a `static_range` variable a constexpr).
    def tensor_range(arg1, arg2=None, step=None, **_options):
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        step = 1 if step is None else step
        ty = _loop_type((start, end, step), tl, semantic)
        np_dtype = interpreter._get_np_dtype(ty)
        for value in range(operator.index(start), operator.index(end), operator.index(step)):
            yield tl.tensor(handle(np.array([value], dtype=np_dtype), ty), ty)

    return tensor_range


def apply(module, release: Release) -> None:
    global _applied
    if _applied or not triton_interpreter_on():
        return
    import triton.runtime.interpreter as interpreter

    from vllm_sampling_mask.patches._wrap import argument, wraps

    # HAS_TRITON (interpreter_has_triton) would otherwise pick the Triton kernel for every
    # batch size on a CPU host: the other CPU tests keep the host's own top-k/top-p (host
    # syncs allowed); with the variable set, the kernel runs interpreted
    # (tests/llm/test_engine_mrv2_topk_kernel.py).
    if not interpreted_triton_top_k():
        @wraps(module, "apply_top_k_top_p")
        def apply_top_k_top_p(wrapped, instance, args, kwargs):
            logits, k, p = (argument(wrapped, args, kwargs, name)
                            for name in ("logits", "k", "p"))
            if logits.device.type == "cpu" and (k is not None or p is not None):
                return module.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)
            return wrapped(*args, **kwargs)

    tensor_range = _make_tensor_range(interpreter)

    # The interpreter turns `tl.range` into Python's `range`, and `_topk_topp_kernel`
    # (vllm.v1.sample.ops.topk_topp_triton) calls `row_id.to(tl.int64)` on its variable.
    # Every interpreted kernel gets this, not only that one (Triton 3.9; 3.6 on vLLM 0.24).
    @wraps(interpreter, "_patch_lang_core")
    def _patch_lang_core(original, instance, args, kwargs):

        result = original(*args, **kwargs)
        lang, scope = (argument(original, args, kwargs, name) for name in ("lang", "scope"))
        scope.set_attr(lang, "range", tensor_range)  # restored with the launch's scope
        return result

    _applied = True
