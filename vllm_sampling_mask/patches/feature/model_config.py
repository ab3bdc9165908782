"""`ModelConfig.return_sampling_mask` (False) and `.max_sampling_mask_size` (4096).

What: sets class-level defaults `ModelConfig.return_sampling_mask = False` and
    `ModelConfig.max_sampling_mask_size = 4096`; `engine_args` stores the
    engine's values on each instance it builds. The
    attribute travels with the pickled config to the engine-core and worker
    processes.
Why: `ModelConfig` is a pydantic dataclass that forbids unknown fields; a
    new field would mean rebuilding the class, while these only need to be
    read. It does not enter `compute_hash`: it changes no compiled graph.
Remove when: upstream has the field.
"""


from vllm_sampling_mask.validation import DEFAULT_MAX_SIZE


def apply(module) -> None:
    if "return_sampling_mask" not in module.ModelConfig.__dict__:
        module.ModelConfig.return_sampling_mask = False
        module.ModelConfig.max_sampling_mask_size = DEFAULT_MAX_SIZE
