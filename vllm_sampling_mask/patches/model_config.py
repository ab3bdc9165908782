"""`ModelConfig.return_sampling_mask`, defaulting to False.

What: sets a class-level default `ModelConfig.return_sampling_mask = False`;
    `engine_args` stores the engine's value on each instance it builds. The
    attribute travels with the pickled config to the engine-core and worker
    processes.
Why: `ModelConfig` is a pydantic dataclass that forbids unknown fields; a
    new field would mean rebuilding the class, while the flag only needs to
    be read. It does not enter `compute_hash`: it changes no compiled graph.
Remove when: upstream has the field.
"""


def apply(module) -> None:
    if "return_sampling_mask" not in module.ModelConfig.__dict__:
        module.ModelConfig.return_sampling_mask = False
