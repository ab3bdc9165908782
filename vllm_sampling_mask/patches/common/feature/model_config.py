"""`ModelConfig.sampling_mask_settings`: the engine's mask settings, None with the flag off.

What it declares:

- the class-level default `ModelConfig.sampling_mask_settings = None`; `engine_args`
  stores a `validation.EngineMaskSettings` on each instance of an engine started with
  `--return-sampling-mask`, and it travels with the pickled config to every process.

Why: `ModelConfig` forbids unknown fields, and this only needs to be read
(`config.mask_settings` / `config.mask_enabled`, on every release).
"""

from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    # A class attribute, not a field: it stays out of `compute_hash` (it changes no
    # compiled graph). 0.32's own `return_sampling_mask` field switches on upstream's
    # machinery: `engine_args` keeps that one False and the overlay's setting here.
    if "sampling_mask_settings" not in module.ModelConfig.__dict__:

        module.ModelConfig.sampling_mask_settings = None
