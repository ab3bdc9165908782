"""Decode engine-core outputs with their mask fields in the client process.

What it replaces, in `vllm/v1/engine/core_client.py`:

- the name `EngineCoreOutputs`, with `engine.outputs.MaskedEngineCoreOutputs`, the type
  the client's msgpack decoder is built for.

Why: `EngineCoreOutput` is an `array_like` msgspec Struct: a decoder built for the base
type silently drops the trailing mask fields.
"""

from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.engine.outputs import MaskedEngineCoreOutputs


def apply(module, release: Release) -> None:
    module.EngineCoreOutputs = MaskedEngineCoreOutputs
