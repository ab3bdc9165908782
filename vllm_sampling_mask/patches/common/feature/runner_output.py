"""`ModelRunnerOutput.sampling_mask_step`: the runner-to-scheduler hop.

What it adds, in `vllm/v1/outputs.py`, in every process that imports it:

- the dataclass field `ModelRunnerOutput.sampling_mask_step` (None by default): the
  worker fills it (`async_output`, `runner_v1`; `transport.NO_MASKS` for a step in
  which no row wanted a mask), the scheduler reads it.

Why: a declared field pickles with the output and reads back as None only when the
producer really wrote nothing, which the scheduler then refuses.
"""

from vllm_sampling_mask.patches._dataclass import add_field
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import StepMasks, StepWithoutMasks


def apply(module, release: Release) -> None:
    add_field(module.ModelRunnerOutput, "sampling_mask_step",
              StepMasks | StepWithoutMasks | None, None)
