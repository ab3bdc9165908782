"""The engine's mask settings on `ModelConfig`: `overlay_sampling_mask` (False) and
`max_sampling_mask_size` (4096); on vLLM 0.27.1 also `return_sampling_mask` (False).

What: sets class-level defaults; `engine_args` stores the engine's values on each
    instance it builds. The attributes travel with the pickled config to the
    engine-core and worker processes. `config.mask_enabled` reads
    `overlay_sampling_mask`, on every release.
Why: `ModelConfig` is a pydantic dataclass that forbids unknown fields; a new
    field would mean rebuilding the class, while these only need to be read. They
    do not enter `compute_hash`: they change no compiled graph. vLLM 0.32 has a
    `return_sampling_mask` field of its own that switches on its own mask
    machinery (Model Runner V2 only, top_k required); the overlay keeps that one
    False and carries its flag in `overlay_sampling_mask` (see `engine_args`).
Remove when: upstream has a per-request mask with a size limit (then its fields).
"""


from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE


def apply(module) -> None:
    cls = module.ModelConfig
    if "overlay_sampling_mask" not in cls.__dict__:
        cls.overlay_sampling_mask = False
        cls.max_sampling_mask_size = DEFAULT_MAX_SIZE
    if not hasattr(cls, "return_sampling_mask"):   # 0.27.1: no field of upstream's
        cls.return_sampling_mask = False
