"""A CPU host's LM head follows a weight reload when it is tied to the embedding.

What it wraps: `Worker.reload_weights` (vllm/v1/worker/gpu_worker.py; the CPU worker
inherits it), on a CPU host, with the mask flag on or off:

- after upstream's reload, re-runs `process_weights_after_loading` on every unquantized
  embedding layer whose weight is shared (a tied LM head), rebuilding its CPU GEMM.

Why: a tied LM head's prepacked GEMM stayed on the old weights after a reload, so every
later token (and its mask) was sampled from the old embedding.
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

        # The unquantized embedding method prepacks the LM head's weight when the model
        # loads (`dispatch_cpu_unquantized_gemm`: a oneDNN handle or an SGL packed copy,
        # outside the parameter). A tied head loads no weight of its own in a reload, so
        # the layerwise reload puts its tensor back unprocessed: the parameter holds the
        # new values, the GEMM the old (found by tests/server/test_weight_update.py).
        # CUDA's LM head multiplies by `layer.weight` itself, so it follows.
        if current_platform.is_cpu():
            for layer in tied_embedding_layers(self.model_runner.get_model(),

                                               UnquantizedEmbeddingMethod):
                layer.quant_method.process_weights_after_loading(layer)
        return result
