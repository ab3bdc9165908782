"""Carry the mask through the V1 model runner (CPU hosts natively; MoE on CUDA).

What: wraps, in `vllm/v1/worker/gpu_model_runner.py` (the CPU runner inherits
    these):
    - `GPUModelRunner.__init__`, which builds `self.sampler`: with
      `model_config.return_sampling_mask` it sets the sampler's declared
      `return_sampling_mask`;
    - `GPUModelRunner._sample`: hands the sampler the batch's per-row top-k from
      the host-side input batch (no device sync) and which rows want a mask
      (each request's `validation.wants_mask`), and keeps the
      `SamplerOutput.sampling_mask` for `sample_tokens` (declared
      `GPUModelRunner.pending_sampling_mask`);
    - `GPUModelRunner.sample_tokens`: on the synchronous path decodes the mask
      into the declared field `ModelRunnerOutput.sampling_masks`; on the
      asynchronous path (CUDA's default) starts a `transport.MaskCopy` on the
      runner's output copy stream, with its own event, kept on the declared
      `AsyncGPUModelRunnerOutput.sampling_mask_copy`; the copy holds the device
      block until read;
    - `AsyncGPUModelRunnerOutput.get_output`: decodes it (after its event, host
      work only) into `ModelRunnerOutput.sampling_masks`;
    - `GPUModelRunner._dummy_sampler_run`: the memory-profiling run extracts
      with the worst-case layout, so the KV cache is sized with it included.
    Rows that sampled nothing (partial prefills) decode as empty.
Why: the V1 runner is what CPU hosts run natively and what most MoE models get
    on CUDA; its sampler applies custom logits processors before the support is
    taken, so the mask includes them.
Remove when: upstream carries the mask through the V1 runner (vLLM #49577 did
    it for Model Runner V2 only).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import run_worst_case, wraps
from vllm_sampling_mask.transport import MaskCopy, PinnedPool
from vllm_sampling_mask.validation import wants_mask

POOL = PinnedPool()


def _lengths(sampled_token_ids) -> list[int]:
    return [len(t) for t in sampled_token_ids]


def apply(module) -> None:
    import torch
    from vllm.v1.outputs import ModelRunnerOutput

    Runner = module.GPUModelRunner
    AsyncOutput = module.AsyncGPUModelRunnerOutput
    Runner.pending_sampling_mask = None
    AsyncOutput.sampling_mask_copy = None

    @wraps(module, "GPUModelRunner.__init__")
    def __init__(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        if mask_enabled(self.vllm_config):
            self.sampler.return_sampling_mask = True
            self.sampler.sampling_mask_max_size = self.model_config.max_sampling_mask_size

    @wraps(module, "GPUModelRunner._sample")
    def _sample(wrapped, self, args, kwargs):
        if not self.sampler.return_sampling_mask:
            return wrapped(*args, **kwargs)
        batch = self.input_batch
        n = batch.num_reqs
        self.sampler.sampling_mask_top_k = batch.top_k_cpu[:n]
        self.sampler.sampling_mask_wanted = np.fromiter(
            (wants_mask(self.requests[req_id].sampling_params)
             for req_id in batch.req_ids[:n]), dtype=bool, count=n)
        output = wrapped(*args, **kwargs)
        self.pending_sampling_mask = output.sampling_mask
        return output

    @wraps(module, "GPUModelRunner.sample_tokens")
    def sample_tokens(wrapped, self, args, kwargs):
        out = wrapped(*args, **kwargs)
        mask, self.pending_sampling_mask = self.pending_sampling_mask, None
        if mask is None:  # nothing sampled; a step with tokens but no mask is
            return out    # refused by the scheduler
        on_cuda = mask.block.device.type == "cuda"
        if isinstance(out, ModelRunnerOutput):
            copy = MaskCopy(mask, POOL if on_cuda else None, record_event=on_cuda)
            out.sampling_masks = copy.result(_lengths(out.sampled_token_ids))
        elif isinstance(out, AsyncOutput):
            if on_cuda:
                stream = self.async_output_copy_stream
                with torch.cuda.stream(stream):
                    stream.wait_stream(torch.cuda.current_stream())
                    out.sampling_mask_copy = MaskCopy(mask, POOL, record_event=True)
            else:
                out.sampling_mask_copy = MaskCopy(mask, None)
        else:
            raise MissingSamplingMaskError(
                "V1 GPUModelRunner.sample_tokens",
                f"a mask was extracted but the step returned {type(out).__name__}")
        return out

    @wraps(module, "AsyncGPUModelRunnerOutput.get_output")
    def get_output(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        copy, self.sampling_mask_copy = self.sampling_mask_copy, None
        if copy is not None:
            output.sampling_masks = copy.result(_lengths(output.sampled_token_ids))
        return output

    @wraps(module, "GPUModelRunner._dummy_sampler_run")
    def _dummy_sampler_run(wrapped, self, args, kwargs):
        return run_worst_case(self.sampler, wrapped, args, kwargs)
