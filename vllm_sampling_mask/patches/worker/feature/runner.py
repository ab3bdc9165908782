"""Model Runner V2's adapter to the mask state: build it, plan each step, start the
mask's copy with the step's output copy.

What it wraps, in `vllm/v1/worker/gpu/model_runner.py` (the CPU runner inherits
them), beside declaring `GPUModelRunner.sampling_mask`:

- `load_model`: builds the runner's `SamplingMaskState` and hands it to its sampler;
- `_remove_request`: a freed request slot no longer wants a mask;
- `_dummy_sampler_run`: the profiling run extracts at the widest (`_runner`);
- `sample`: plans the step before it samples, starts the mask's copy after;
- `sample_tokens`: opens the step around the call, hands its copy to the output.

Why: the flag is handed to the sampler where it is built, so a sampler that never
got it cannot silently return no mask; one state object per runner replaces flags
on upstream classes.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.patches.worker._runner import (mask_state_for, profile_with_masks,
                                                       wraps_with_state)
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import NO_MASKS, MaskCopy
from vllm_sampling_mask.worker.coverage import cover
from vllm_sampling_mask.worker.state import SamplingMaskState
from vllm_sampling_mask.worker.step import step_of

HOP = "GPUModelRunner.sample"


def apply(module, release: Release) -> None:
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    module.GPUModelRunner.sampling_mask: SamplingMaskState | None = None
    cover(module.GPUModelRunner)

    @wraps(module, "GPUModelRunner.load_model")
    def load_model(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)
        if mask_enabled(self.vllm_config) and self.sampler is not None:
            if type(self.sampler) is not Sampler:
                raise ValueError(
                    "--return-sampling-mask (return_sampling_mask=True) supports "
                    f"vLLM's own Sampler, but this model uses {type(self.sampler)!r}: "
                    "drop the flag for this model.")
            # Every rank samples the same way (the ranks' tokens must agree), but
            # only the output rank extracts: the others' outputs are dropped. FlashInfer
            # never materialises the processed logits the mask is read from.
            self.sampler.use_flashinfer = False
            # per request slot (`max_num_reqs`), --max-sampling-mask-size; None off
            # the output rank
            self.sampling_mask = mask_state_for(self)
            self.sampler.sampling_mask = self.sampling_mask
        return result

    @wraps_with_state(module, "GPUModelRunner._remove_request")
    def _remove_request(wrapped, self, state, args, kwargs):
        slot = self.req_states.req_id_to_index.get(argument(wrapped, args, kwargs, "req_id"))
        removed = wrapped(*args, **kwargs)
        if removed and slot is not None:   # the sampler's `add_request` sets the next one
            state.requests.remove(slot)
        return removed

    profile_with_masks(module)

    @wraps(module, "GPUModelRunner.sample")
    def sample(wrapped, self, args, kwargs):
        state = self.sampling_mask
        step = step_of(state)
        if step is not None:
            # The one place a Model Runner V2 step is planned, from host arrays only (no
            # device sync): the batch's slots, their top-k, and the rows that sample
            # nothing this step (`discarded_rows`). The sampler (or, for a verify step,
            # the rejection sampler) extracts into the step with this plan.
            input_batch = argument(wrapped, args, kwargs, "input_batch")
            slots = input_batch.idx_mapping_np
            step.set_plan(HOP, state.plan(
                slots, self.sampler.sampling_states.top_k.np[slots],
                discarded_rows(self.sampler, input_batch), normalise=True))
        result = wrapped(*args, **kwargs)
        if step is not None:
            mask = step.result(HOP)
            if step.plan.masks_nothing:   # no row wanted a mask: nothing to copy
                step.set_copy(HOP, NO_MASKS)   # the scheduler passes it to upstream
                self.sampling_mask.steps_without_masks += 1
                return result
            # The copy runs on the output copy stream after the main stream, into the
            # state's pinned pool on CUDA; upstream's copy event, recorded on that
            # stream by the `AsyncOutput` built next, covers it. It holds the device
            # block until it is read.
            main, copy_stream = self.main_stream, self.output_copy_stream
            with async_utils.stream(copy_stream, main):
                copy_stream.wait_stream(main)
                on_cuda = mask.block.device.type == "cuda"
                step.set_copy(HOP, MaskCopy(mask, self.sampling_mask.pool if on_cuda
                                            else None))
        return result

    @wraps_with_state(module, "GPUModelRunner.sample_tokens")
    def sample_tokens(wrapped, self, state, args, kwargs):
        with state.step() as step:
            out = wrapped(*args, **kwargs)
        if step.copy is None:
            if step.mask is not None:
                raise MissingSamplingMaskError(
                    "GPUModelRunner.sample_tokens",
                    "the sampler extracted a mask but no copy of it was started")
            return out   # nothing sampled (a step with tokens but no mask is refused
                         # by the scheduler)
        if not isinstance(out, async_utils.AsyncOutput):
            raise MissingSamplingMaskError(
                "GPUModelRunner.sample_tokens",
                f"a mask was extracted but the step returned {type(out).__name__}")
        out.sampling_mask_copy = step.copy   # declared on AsyncOutput; `async_output` decodes it
        return out


def discarded_rows(sampler, input_batch) -> np.ndarray:
    """The requests of the batch whose sampled token upstream discards this step
    (a partial prefill chunk), from host arrays only: upstream's rule (seq_len <
    prefill_len of the request's slot, `get_num_sampled_and_rejected`) on the
    step's host-side sequence lengths (`seq_lens_cpu_upper_bound`) and the
    slots' host-side prefill lengths, the ones the device rule reads. The upper
    bound is exact for every request the rule can discard: under speculative
    decoding it also counts drafts, which only a request past its prefill has.
    Vectorised; no device sync."""
    slots = input_batch.idx_mapping_np
    seq_lens = input_batch.seq_lens_cpu_upper_bound.numpy()[: len(slots)]
    return seq_lens < sampler.req_states.prefill_len.np[slots]
