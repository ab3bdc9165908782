"""`ModelRunnerOutput.sampling_mask_step`: the runner-to-scheduler hop.

What: in `vllm/v1/outputs.py`, adds the dataclass field
    `ModelRunnerOutput.sampling_mask_step: StepMasks | StepWithoutMasks | None =
    None` (in every process that imports it: the worker fills it in
    `async_output` or `runner_v1`, `transport.NO_MASKS` for a step in which no
    row wanted a mask; the scheduler reads it).
Why: a declared field pickles with the output and reads back as None only
    when the producer really wrote nothing, which the scheduler then refuses.
Remove when: upstream's `ModelRunnerOutput` mask (vLLM #49577, since 0.28, Model
    Runner V2 only, lists) carries the V1 runner's, the support logprobs and the
    packed block; from 0.28 this field replaces upstream's on the hop.
"""

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.transport import StepMasks, StepWithoutMasks


def apply(module, release: Release) -> None:
    add_field(module.ModelRunnerOutput, "sampling_mask_step",
              StepMasks | StepWithoutMasks | None, None)
