"""`ModelRunnerOutput.sampling_masks`: the runner-to-scheduler hop's declared field.

What: adds the dataclass field `sampling_masks: StepMasks | None = None` to
    `ModelRunnerOutput` (vllm/v1/outputs.py), in every process that imports it
    (the worker fills it in `async_output`, the scheduler reads it).
Why: a declared field pickles with the output and reads back as None only
    when the producer really wrote nothing, which the scheduler then refuses.
Remove when: upstream carries the mask in `ModelRunnerOutput` (vLLM #49577).
"""

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.transport import StepMasks


def apply(module) -> None:
    add_field(module.ModelRunnerOutput, "sampling_masks", StepMasks | None, None)
