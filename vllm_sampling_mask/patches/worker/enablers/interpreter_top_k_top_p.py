"""Run vLLM's Triton top-k/top-p kernel under Triton's interpreter.

What: under TRITON_INTERPRET=1, wraps `triton.runtime.interpreter._patch_lang_core`
    (Triton 3.9; 3.6 on vLLM 0.24) so that, inside every interpreted kernel (not only this
    one), `tl.range` yields scalar Triton integer tensors instead of Python
    ints, as compiled Triton does (so its integer arithmetic wraps as on a GPU). Their dtype is the one
    compiled Triton gives the loop variable: start, end and step promoted
    together (int32 for int32 bounds). The values are those of Python's
    `range`. `tl.static_range` and the builtin `range` keep yielding ints
    (compiled Triton makes a `static_range` variable a constexpr). The patch
    goes away with the launch's language patch, as the interpreter's own does.
    Second seam: unless VLLM_SAMPLING_MASK_TRITON_TOPK=1, wraps
    `apply_top_k_top_p` (vllm/v1/sample/ops/topk_topp_sampler.py) so that CPU
    tensors with a top-k or top-p go to upstream's PyTorch path
    (`apply_top_k_top_p_pytorch`, host syncs allowed) instead of the Triton
    kernel, which HAS_TRITON (interpreter_has_triton) would otherwise pick for
    every batch size on a CPU host; with the variable set, the kernel runs
    interpreted (tests/llm/test_engine_mrv2_topk_kernel.py).
Why: compiled Triton makes a `tl.range` loop variable a tensor, but the
    interpreter turns `tl.range` into Python's `range`. `_topk_topp_kernel` in
    `vllm.v1.sample.ops.topk_topp_triton` calls `row_id.to(tl.int64)` on its
    `tl.range` variable, so interpreted it failed with "'int' object has no
    attribute 'to'". With HAS_TRITON true (interpreter_has_triton), vLLM's CPU
    path would use that kernel for every batch size. This patch makes it run,
    so a test can check masks against what the GPU kernel keeps, while the
    other CPU tests keep the CPU host's own top-k/top-p.
"""

from __future__ import annotations

import operator

from vllm_sampling_mask.config import interpreted_triton_top_k, triton_interpreter_on
from vllm_sampling_mask.releases import Release

_applied = False  # wrapped once per process, whatever calls apply()


def _loop_type(bounds, tl, semantic):
    """The dtype compiled Triton gives a loop variable over these bounds."""
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

    if not interpreted_triton_top_k():
        @wraps(module, "apply_top_k_top_p")
        def apply_top_k_top_p(wrapped, instance, args, kwargs):
            logits, k, p = (argument(wrapped, args, kwargs, name)
                            for name in ("logits", "k", "p"))
            if logits.device.type == "cpu" and (k is not None or p is not None):
                return module.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)
            return wrapped(*args, **kwargs)

    tensor_range = _make_tensor_range(interpreter)

    @wraps(interpreter, "_patch_lang_core")
    def _patch_lang_core(original, instance, args, kwargs):
        result = original(*args, **kwargs)
        lang, scope = (argument(original, args, kwargs, name) for name in ("lang", "scope"))
        scope.set_attr(lang, "range", tensor_range)  # restored with the launch's scope
        return result

    _applied = True
