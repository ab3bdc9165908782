"""`ModelConfig.sampling_mask_settings`: the engine's mask settings, None with the flag off.

What: declares the class-level default `ModelConfig.sampling_mask_settings = None`;
    `engine_args` stores a `validation.EngineMaskSettings` (the size limit) on each
    instance it builds for an engine started with `--return-sampling-mask`. It
    travels with the pickled config to the engine-core and worker processes;
    `config.mask_settings` / `config.mask_enabled` read it, on every release.
Why: `ModelConfig` is a pydantic dataclass that forbids unknown fields; a new
    field would mean rebuilding the class, while this only needs to be read. It
    does not enter `compute_hash`: it changes no compiled graph. vLLM 0.32 has a
    `return_sampling_mask` field of its own that switches on its own mask
    machinery (Model Runner V2 only, top_k required); `engine_args` keeps that
    one False and the overlay's setting here.
"""

from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    if "sampling_mask_settings" not in module.ModelConfig.__dict__:
        module.ModelConfig.sampling_mask_settings = None
