"""Copy the mask device-to-host with Model Runner V2's asynchronous output.

What: wraps `AsyncOutput.__init__` and `AsyncOutput.get_output` in
    `vllm/v1/worker/gpu/async_utils.py`. `__init__` starts the copy of the
    sampler output's compacted mask on the output copy stream *before* the
    upstream copies, so the copy event upstream records covers it too (on
    CUDA through reusable pinned buffers, one per copy in flight), and drops
    the sampler output's reference to the device mask. `get_output`, after
    that event, puts the host rows on the `ModelRunnerOutput` as
    `.sampling_masks` (`transport.StepMasks`, one row per `req_ids` entry;
    rows that sampled no token this step are empty).
Why: this is the runner's existing asynchronous device-to-host path, so the
    mask adds no host synchronisation to the sampler's hot path.
Remove when: upstream carries the mask in `ModelRunnerOutput`.
"""

from __future__ import annotations

import functools

from vllm_sampling_mask.transport import MaskCopy, PinnedPool


def apply(module) -> None:
    AsyncOutput = module.AsyncOutput
    original_init = AsyncOutput.__init__
    original_get_output = AsyncOutput.get_output
    pool = PinnedPool()

    @functools.wraps(original_init)
    def __init__(self, model_runner_output, sampler_output, num_sampled_tokens,
                 main_stream, copy_stream, *args, **kwargs):
        mask = getattr(sampler_output, "sampling_mask", None)
        self._mask_copy = None
        if mask is not None:
            with module.stream(copy_stream, main_stream):
                copy_stream.wait_stream(main_stream)
                on_cuda = mask.ids.device.type == "cuda"
                self._mask_copy = MaskCopy(mask, pool if on_cuda else None)
            sampler_output.sampling_mask = None  # MaskCopy holds what it needs
        original_init(self, model_runner_output, sampler_output, num_sampled_tokens,
                      main_stream, copy_stream, *args, **kwargs)

    @functools.wraps(original_get_output)
    def get_output(self):
        output = original_get_output(self)
        if self._mask_copy is not None:
            output.sampling_masks = self._mask_copy.result(self.num_sampled_tokens_np)
            self._mask_copy = None
        return output

    AsyncOutput.__init__ = __init__
    AsyncOutput.get_output = get_output
