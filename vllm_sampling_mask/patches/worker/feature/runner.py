"""Model Runner V2's adapter to the mask state: build it, profile with it,
start the mask's copy with the step's output copy.

What: wraps, in `vllm/v1/worker/gpu/model_runner.py` (the CPU runner inherits
    these), and declares `GPUModelRunner.sampling_mask` (None with the flag off):
    - `load_model`, which builds `self.sampler`: with
      `model_config.sampling_mask_settings` it builds one `worker.state.SamplingMaskState`
      (per request slot, `max_num_reqs`; --max-sampling-mask-size) and hands it
      to the runner and its sampler (`Sampler.sampling_mask`) on the output rank
      only (`_runner.mask_state_for`: under tensor parallelism the other ranks'
      outputs are dropped, so they extract and copy nothing), and turns the
      sampler's FlashInfer path off on every rank (it never materialises the
      processed logits, and the ranks must sample alike). A sampler that is not vLLM's `Sampler` (a model state's
      `custom_sampler`) is refused;
    - `_remove_request`: the freed request slot no longer wants a mask (the
      sampler's `add_request` sets it for the next request there);
    - `_dummy_sampler_run`: the memory-profiling run extracts inside
      `state.profiling()` (widest rows, one wide-row slot per row), so the KV
      cache is sized with the mask's largest per-step device memory included;
    - `sample_tokens`: opens the step's `MaskStep` around the call and, once
      it returned, hands the step's started copy to the step's `AsyncOutput`
      (the declared `AsyncOutput.sampling_mask_copy`, which `async_output`
      decodes);
    - `sample`, called inside it with the step's input batch: before it
      samples, plans the step, the one place a Model Runner V2 step is planned
      (`SamplingMaskState.plan`: the batch's slots, their host-side top-k, and
      the rows that sample nothing this step, a partial prefill chunk: the host
      mirror of upstream's own rule in `get_num_sampled_and_rejected`, seq_len
      < prefill_len, from `InputBatch.seq_lens_cpu_upper_bound` against the
      sampler's `req_states.prefill_len.np` of the batch's slots,
      `discarded_rows`; host arrays only, no device sync). The sampler
      (`sampler`) or, for a verify step, the rejection sampler
      (`rejection_sampler`) takes that plan and extracts into the step. Once
      it did, `sample` starts its `transport.MaskCopy` on the output copy
      stream (after the main stream, into the state's pinned pool on CUDA)
      into the step. Upstream's
      copy event, recorded on that stream by the `AsyncOutput` built next,
      covers it; the copy holds the device block until it is read. A step
      whose plan masks nothing (`StepPlan.masks_nothing`) starts no copy: it
      hands on `transport.NO_MASKS`, which the scheduler passes to upstream.
Why: the flag is configuration; passing it explicitly where the sampler is
    built (instead of the sampler reading ambient config) means a sampler that
    never got it cannot silently return no mask, and one state object per
    runner replaces attributes and class-level flags on upstream classes.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.patches.worker._runner import mask_state_for, profile_with_masks
from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import NO_MASKS, MaskCopy
from vllm_sampling_mask.worker.state import SamplingMaskState

HOP = "GPUModelRunner.sample"


def apply(module, release: Release) -> None:
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    module.GPUModelRunner.sampling_mask: SamplingMaskState | None = None

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
            # only the output rank extracts: the others' outputs are dropped.
            self.sampler.use_flashinfer = False
            self.sampling_mask = mask_state_for(self)
            self.sampler.sampling_mask = self.sampling_mask
        return result

    @wraps(module, "GPUModelRunner._remove_request")
    def _remove_request(wrapped, self, args, kwargs):
        if self.sampling_mask is None:
            return wrapped(*args, **kwargs)
        slot = self.req_states.req_id_to_index.get(argument(wrapped, args, kwargs, "req_id"))
        removed = wrapped(*args, **kwargs)
        if removed and slot is not None:
            self.sampling_mask.requests.remove(slot)
        return removed

    profile_with_masks(module)

    @wraps(module, "GPUModelRunner.sample")
    def sample(wrapped, self, args, kwargs):
        state = self.sampling_mask
        step = None if state is None else state.open
        if step is not None:
            input_batch = argument(wrapped, args, kwargs, "input_batch")
            slots = input_batch.idx_mapping_np
            step.set_plan(HOP, state.plan(
                slots, self.sampler.sampling_states.top_k.np[slots],
                discarded_rows(self.sampler, input_batch), normalise=True))
        result = wrapped(*args, **kwargs)
        if step is not None:
            mask = step.result(HOP)
            if step.plan.masks_nothing:   # no row wanted a mask: nothing to copy
                step.set_copy(HOP, NO_MASKS)
                self.sampling_mask.steps_without_masks += 1
                return result
            main, copy_stream = self.main_stream, self.output_copy_stream
            with async_utils.stream(copy_stream, main):
                copy_stream.wait_stream(main)
                on_cuda = mask.block.device.type == "cuda"
                step.set_copy(HOP, MaskCopy(mask, self.sampling_mask.pool if on_cuda
                                            else None))
        return result

    @wraps(module, "GPUModelRunner.sample_tokens")
    def sample_tokens(wrapped, self, args, kwargs):
        state = self.sampling_mask
        if state is None:
            return wrapped(*args, **kwargs)
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
        out.sampling_mask_copy = step.copy
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
