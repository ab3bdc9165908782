"""Decode the mask copied with Model Runner V2's asynchronous output.

What it wraps, in `vllm/v1/worker/gpu/async_utils.py`, beside declaring
`AsyncOutput.sampling_mask_copy` (the step's `transport.MaskCopy`, handed over by the
`runner` patch; None for a runner without masks):

- `AsyncOutput.get_output`: after upstream waited for the copy event, decodes the copy
  on the host into `ModelRunnerOutput.sampling_mask_step`.

Why: the runner's existing asynchronous device-to-host path: the mask adds no host
synchronisation to the sampler's hot path.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import MaskCopy, StepWithoutMasks


def apply(module, release: Release) -> None:
    module.AsyncOutput.sampling_mask_copy: MaskCopy | StepWithoutMasks | None = None

    @wraps(module, "AsyncOutput.get_output")
    def get_output(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)  # waits for the copy event
        copy, self.sampling_mask_copy = self.sampling_mask_copy, None
        # The copy was started on the output copy stream before upstream recorded this
        # output's copy event. One row per `req_ids` entry (empty where no token was
        # sampled); no device work. A runner with masks whose output has none is
        # refused by the `scheduler` patch.
        if copy is not None:
            output.sampling_mask_step = copy.result(self.num_sampled_tokens_np)

        return output
