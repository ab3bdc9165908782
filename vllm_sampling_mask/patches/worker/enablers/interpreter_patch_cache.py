"""Patch `triton.language` once per interpreted kernel launch, not once per call.

What: wraps `triton.runtime.interpreter._patch_lang` (Triton 3.9): while a
    kernel launch has the language patched, a nested `@triton.jit` device
    function whose language modules are already patched skips re-patching
    (which walks every member of `triton.language` with `inspect.getmembers`).
    The launch's own patch scope is unchanged and still restored on exit.
    Only under TRITON_INTERPRET=1.
Why: MRv2's Gumbel sampler calls nested device functions (`tl.rand`, Philox,
    `gumbel_block_argmax`) per program; re-patching on each call made
    interpreted sampling about 10x slower than the work itself, which is the
    difference between a usable and an unusable CPU test suite.
"""

from __future__ import annotations

import inspect

from vllm_sampling_mask.config import triton_interpreter_on
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


class _NoScope:
    @staticmethod
    def restore() -> None:
        pass


def apply(module, release: Release) -> None:
    if not triton_interpreter_on():
        return
    import triton.language as tl

    state = {"patched": None}  # the language modules patched by the running launch

    def langs_of(fn):
        return {id(v) for v in fn.__globals__.values()
                if inspect.ismodule(v) and v in (tl, tl.core)}

    @wraps(module, "_patch_lang")
    def _patch_lang(original, instance, args, kwargs):
        fn = argument(original, args, kwargs, "fn")
        patched = state["patched"]
        langs = langs_of(fn)
        if patched is not None and langs and langs <= patched:
            return _NoScope()
        scope = original(*args, **kwargs)
        if patched is not None:          # a nested call that added a module
            patched |= langs
            return scope
        state["patched"] = set(langs)
        restore = scope.restore

        def restore_and_forget():
            state["patched"] = None
            restore()

        scope.restore = restore_and_forget
        return scope
