"""`GET /v1/models` says each base model's dtype (`"dtype": "float32"`).

What it wraps, in vllm/entrypoints/openai/models/serving.py:

- `OpenAIServingModels.show_available_models`: every base model's card (not a LoRA
  adapter's) gets an extra field `dtype`, the engine's dtype without `torch.`.

Why: the masked importance ratio spreads with the engine's dtype; `replay_check
--server` reads this to say so, and no other route outside dev mode exposes it.
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
            if card.id in base:   # `ModelCard` allows extra fields: other clients ignore it
                card.dtype = dtype_name(self.model_config.dtype)

        return models
