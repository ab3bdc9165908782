"""A CPU host's engine takes new weights through `model.load_weights` after it loaded.

What: on a CPU host, wraps `Worker.load_model` (vllm/v1/worker/gpu_worker.py; the CPU
    worker inherits it) so that the loaded model's own `load_weights`, called again
    later by a trainer that holds the engine in its process (TRL's colocate mode calls
    `llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(
    [(name, tensor)])` once per parameter), runs as vLLM's layerwise reload: the first
    such call starts it (`initialize_layerwise_reload`: each layer back to its
    checkpoint-format parameters, with their weight loaders), every call loads its
    tensors (a layer is processed for its CPU kernel as soon as all its weights are
    in), and `Worker.execute_model` (also wrapped) finishes it before the next forward
    pass (`finalize_layerwise_reload`, then the tied LM head's GEMM rebuilt as
    `cpu_reload_tied_lm_head` does after `reload_weights`). Calls made inside a reload
    that is already under way (`reload_weights` itself) go straight through. Applies
    with the mask flag on or off; CUDA is left alone.
Why: after loading, the CPU linear method replaces each linear layer's `weight` by an
    empty `Parameter` (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`: the
    values live on in a oneDNN handle or an SGL packed copy), so the stacked loaders
    fail with `AttributeError: 'Parameter' object has no attribute 'weight_loader'`,
    the others with `AssertionError: Attempted to load weight (torch.Size([128, 384]))
    into parameter (torch.Size([0]))` (demo model, 0.31 and 0.32), and a weight
    written into the layer would not reach its kernel anyway. vLLM's own
    `reload_weights` goes through the layerwise reload, which restores and repacks;
    a direct `load_weights` does not.
Upstream: none known; would file "CPU: model.load_weights after load fails with
    'Parameter' object has no attribute 'weight_loader' (the CPU GEMM dispatch removes
    the weight); colocated trainers (TRL) cannot sync weights".
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release

_PENDING = "_sampling_mask_pending_reload"


def install(worker) -> None:
    """Route later `load_weights` calls on `worker`'s model through the layerwise reload."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import (
        get_layerwise_info,
        initialize_layerwise_reload,
    )

    model = worker.model_runner.get_model()
    original = model.load_weights

    def load_weights(weights, *args, **kwargs):
        with set_current_vllm_config(worker.vllm_config):
            if not get_layerwise_info(model).can_load():   # no reload under way: start one
                initialize_layerwise_reload(model)
                setattr(model, _PENDING, True)
            return original(weights, *args, **kwargs)

    load_weights.__wrapped__ = original
    model.load_weights = load_weights


def finish(worker) -> None:
    """Finish a reload that `load_weights` calls started (before the next forward)."""
    model = worker.model_runner.get_model()
    if not getattr(model, _PENDING, False):
        return
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    from vllm_sampling_mask.patches.worker.fixes.cpu_reload_tied_lm_head import (
        tied_embedding_layers,
    )

    with set_current_vllm_config(worker.vllm_config):
        finalize_layerwise_reload(model, worker.vllm_config.model_config)
        for layer in tied_embedding_layers(model, UnquantizedEmbeddingMethod):
            layer.quant_method.process_weights_after_loading(layer)
    setattr(model, _PENDING, False)


def apply(module, release: Release) -> None:
    @wraps(module, "Worker.load_model")
    def load_model(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            install(self)
        return result

    @wraps(module, "Worker.execute_model")
    def execute_model(wrapped, self, args, kwargs):
        finish(self)
        return wrapped(*args, **kwargs)
