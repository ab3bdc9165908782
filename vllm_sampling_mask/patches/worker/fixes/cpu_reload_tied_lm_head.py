"""A CPU host's LM head follows a weight reload when it is tied to the embedding.

What: wraps `Worker.reload_weights` (vllm/v1/worker/gpu_worker.py; the CPU worker
    inherits it; both runners reach it through `collective_rpc("reload_weights")`):
    after upstream's reload, on a CPU host, every layer of the model whose
    quantization method is the unquantized embedding method and whose weight is
    the same tensor as another layer's (an LM head tied to the input embedding)
    gets that method's `process_weights_after_loading` again, which rebuilds its
    CPU GEMM (`layer.cpu_linear`) from the reloaded weight. Applies with the mask
    flag on or off.
Why: on a CPU host the unquantized embedding method prepacks the LM head's weight
    for its GEMM when the model loads (`dispatch_cpu_unquantized_gemm`: a oneDNN
    handle or an SGL packed copy, outside the parameter). A tied LM head loads no
    weight of its own in `reload_weights` (the checkpoint has none), so the
    layerwise reload puts its kernel tensor back without processing it: the tied
    parameter holds the new values, but its GEMM goes on multiplying by the old
    ones. Every token after a reload was sampled from logits of the new model's
    body times the old embedding (its mask too: the mask is the sampler's), not
    from the new weights (found by tests/server/test_weight_update.py on the demo model,
    whose `tie_word_embeddings` is true). CUDA's LM head multiplies by
    `layer.weight` itself, so it follows.
Upstream: none known; would file "CPU: reload_weights leaves a tied LM head's
    prepacked GEMM on the old weights (dispatch_cpu_unquantized_gemm is not re-run
    for a layer that loads no weight)".
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release


def tied_embedding_layers(model, method_type) -> list:
    """The layers of `model` whose quantization method is a `method_type` and whose
    `weight` is the same tensor as another layer's (a tied LM head, its embedding)."""
    holders: dict[int, list] = {}
    for layer in model.modules():
        weight = layer._parameters.get("weight")
        if weight is not None:
            holders.setdefault(id(weight), []).append(layer)
    return [layer for layers in holders.values() if len(layers) > 1 for layer in layers
            if isinstance(getattr(layer, "quant_method", None), method_type)]


def apply(module, release: Release) -> None:
    @wraps(module, "Worker.reload_weights")
    def reload_weights(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            for layer in tied_embedding_layers(self.model_runner.get_model(),
                                               UnquantizedEmbeddingMethod):
                layer.quant_method.process_weights_after_loading(layer)
        return result
