"""verl's plugin entry point (`verl.plugins`, pyproject.toml): imported by `import verl`.

Installs `vllm_sampling_mask.integrations.verl` (its `install()`): the vLLM version
verl reads, and the hooks that carry sampling masks from verl's vLLM server to its
trainer. verl swallows a plugin's import error at debug level, so a failure here is
also logged as a warning.
"""

from vllm_sampling_mask.integrations.verl import install

install()
