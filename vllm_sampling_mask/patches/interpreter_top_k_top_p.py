"""Use vLLM's PyTorch top-k/top-p on a CPU host under Triton's interpreter.

What: wraps `vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p` so that,
    with TRITON_INTERPRET=1 on a CPU tensor, it calls upstream's own
    `apply_top_k_top_p_pytorch(..., allow_cpu_sync=True)`, the path vLLM takes
    on CPU when it has no Triton.
Why: with Triton reported present (see interpreter_has_triton) the CPU path
    picks the Triton top-k/top-p kernel, which fails in the interpreter
    (`row_id.to(...)` on a plain int). Both keep every logit tied with the k-th.
Remove when: interpreter_has_triton goes, or the kernel runs interpreted.
"""

import functools

from vllm_sampling_mask.interpreter import triton_interpreter_on


def apply(module) -> None:
    if not triton_interpreter_on():
        return
    original = module.apply_top_k_top_p

    @functools.wraps(original)
    def apply_top_k_top_p(logits, k, p):
        if logits.device.type == "cpu" and (k is not None or p is not None):
            return module.apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)
        return original(logits, k, p)

    module.apply_top_k_top_p = apply_top_k_top_p
