"""Patch `triton.language` once per interpreted kernel launch, not once per call.

What it wraps, only under TRITON_INTERPRET=1:

- `triton.runtime.interpreter._patch_lang` (Triton 3.9): a nested `@triton.jit` call
  whose language modules the running launch already patched skips re-patching; the
  launch's own scope is unchanged and still restored on exit.

Why: re-patching on each nested call made interpreted sampling about 10x slower than
the work itself.
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

    # Re-patching walks every member of `triton.language` with `inspect.getmembers`, and
    # MRv2's Gumbel sampler calls nested device functions (`tl.rand`, Philox,
    # `gumbel_block_argmax`) per program.
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
