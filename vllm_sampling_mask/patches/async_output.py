"""Copy the mask device-to-host with Model Runner V2's asynchronous output.

What: in `vllm/v1/worker/gpu/async_utils.py`, declares
    `AsyncOutput.return_sampling_mask` (False; the `runner` patch sets it in a
    process whose runner returns masks) and wraps `AsyncOutput.__init__` and
    `AsyncOutput.get_output`. `__init__` starts a `transport.MaskCopy` of
    `SamplerOutput.sampling_mask` on the output copy stream *before* the
    upstream copies, so the copy event upstream records covers it (on CUDA
    into a pooled pinned buffer, one per copy in flight). The `MaskCopy` holds
    the device block until it is read. `get_output`, after that event, decodes
    it on the host (no device work) into the declared field
    `ModelRunnerOutput.sampling_masks` (`transport.StepMasks`, one row per
    `req_ids` entry; rows that sampled no token this step are empty).
Why: the runner's existing asynchronous device-to-host path: the mask adds
    no host synchronisation to the sampler's hot path.
Remove when: upstream carries the mask in `ModelRunnerOutput` (vLLM #49577).
"""

from __future__ import annotations

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.transport import MaskCopy, PinnedPool

POOL = PinnedPool()


def apply(module) -> None:
    AsyncOutput = module.AsyncOutput
    AsyncOutput.return_sampling_mask = False
    AsyncOutput.sampling_mask_copy = None

    @wraps(module, "AsyncOutput.__init__")
    def __init__(wrapped, self, args, kwargs):
        if self.return_sampling_mask:
            sampler_output = _arg(args, kwargs, 1, "sampler_output")
            main_stream = _arg(args, kwargs, 3, "main_stream")
            copy_stream = _arg(args, kwargs, 4, "copy_stream")
            mask = sampler_output.sampling_mask
            if mask is None:
                raise MissingSamplingMaskError(
                    "AsyncOutput.__init__", "SamplerOutput.sampling_mask is None")
            with module.stream(copy_stream, main_stream):
                copy_stream.wait_stream(main_stream)
                on_cuda = mask.block.device.type == "cuda"
                self.sampling_mask_copy = MaskCopy(mask, POOL if on_cuda else None)
        wrapped(*args, **kwargs)

    @wraps(module, "AsyncOutput.get_output")
    def get_output(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)  # waits for the copy event
        if self.return_sampling_mask:
            copy, self.sampling_mask_copy = self.sampling_mask_copy, None
            if copy is None:
                raise MissingSamplingMaskError(
                    "AsyncOutput.get_output", "no mask copy was started for this step "
                    "(or it was already read)")
            output.sampling_masks = copy.result(self.num_sampled_tokens_np)
        return output


def _arg(args, kwargs, index: int, name: str):
    """Argument `name` of `AsyncOutput.__init__(model_runner_output, sampler_output,
    num_sampled_tokens, main_stream, copy_stream, ...)`."""
    return kwargs[name] if name in kwargs else args[index]
