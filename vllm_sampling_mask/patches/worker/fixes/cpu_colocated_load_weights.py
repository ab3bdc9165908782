"""A CPU host's engine takes new weights through `model.load_weights` after it loaded.

What it wraps, in vllm/v1/worker/gpu_worker.py (the CPU worker inherits it), on a CPU
host only, with the mask flag on or off:

- `Worker.load_model`: the loaded model's own `load_weights`, called later by a trainer
  that holds the engine in its process (TRL's colocate mode), runs as vLLM's layerwise
  reload;
- `Worker.execute_model`: finishes that reload before the next forward pass.

Why: the CPU linear method empties each layer's `weight` after loading, so a direct
`load_weights` failed (and would not have reached the layer's kernel anyway).
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

    # TRL calls `...driver_worker.model_runner.model.load_weights([(name, tensor)])` once
    # per parameter. The first call starts the reload (each layer back to its
    # checkpoint-format parameters, with their weight loaders); each call loads its
    # tensors (a layer is processed for its CPU kernel once all its weights are in);
    # calls inside a reload already under way (`reload_weights` itself) go straight on.
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

    # then the tied LM head's GEMM rebuilt, as `cpu_reload_tied_lm_head` does after
    # `reload_weights`
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

        # `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)` leaves an empty
        # `Parameter` (the values live in a oneDNN handle or an SGL packed copy): the
        # stacked loaders failed with "no attribute 'weight_loader'", the others with
        # "Attempted to load weight ... into parameter (torch.Size([0]))". vLLM's own
        # `reload_weights` goes through the layerwise reload, which restores and repacks.
        if current_platform.is_cpu():   # CUDA is left alone
            install(self)

        return result

    @wraps(module, "Worker.execute_model")
    def execute_model(wrapped, self, args, kwargs):
        finish(self)
        return wrapped(*args, **kwargs)
