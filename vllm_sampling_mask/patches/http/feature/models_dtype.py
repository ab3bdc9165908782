"""`GET /v1/models` says each base model's dtype (`"dtype": "float32"`).

What: wraps `OpenAIServingModels.show_available_models`
    (vllm/entrypoints/openai/models/serving.py) to add, to every card of a base
    model (not a LoRA adapter), an extra field `dtype`: the engine's
    `model_config.dtype` without the `torch.` prefix. `ModelCard` is an
    `OpenAIBaseModel`, which allows extra fields, so clients that do not know it
    ignore it.
Why: the masked importance ratio spreads with the engine's dtype (bfloat16 gives
    p1/p99 about 0.95/1.05 where float32 gives 1.000/1.000); `replay_check
    --server` reads this to say so instead of leaving the spread unexplained,
    and vLLM 0.27.1 exposes the dtype on no route outside dev mode.
Upstream: `OpenAIServingModels.show_available_models`, `ModelCard` (extra="allow").
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def apply(module, release: Release) -> None:
    @wraps(module, "OpenAIServingModels.show_available_models")
    async def show_available_models(wrapped, self, args, kwargs):
        models = await wrapped(*args, **kwargs)
        base = {path.name for path in self.base_model_paths}
        for card in models.data:
            if card.id in base:
                card.dtype = dtype_name(self.model_config.dtype)
        return models
