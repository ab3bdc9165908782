"""The V1 model runner's adapter to the mask state (CPU hosts natively; MoE on CUDA).

What it wraps, in `vllm/v1/worker/gpu_model_runner.py` (the CPU runner inherits
them), beside declaring `GPUModelRunner.sampling_mask`:

- `GPUModelRunner.__init__`: builds the runner's `SamplingMaskState` and hands it to
  its sampler;
- `GPUModelRunner._may_reorder_batch`: applies the persistent batch's pending update
  to the state's per-row "wants a mask";
- `GPUModelRunner.sample_tokens`: plans the step, opens it around the call, then
  decodes the mask or starts its copy;
- `AsyncGPUModelRunnerOutput.get_output`: decodes the started copy;
- `GPUModelRunner._dummy_sampler_run`: the profiling run extracts at the widest
  (`_runner`).

Why: the V1 runner is what CPU hosts run natively and what most MoE models get on
CUDA; its sampler applies custom logits processors before the support is taken, so
the mask includes them.
"""

from __future__ import annotations

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.patches.worker._runner import (mask_state_for, profile_with_masks,
                                                       wraps_with_state)
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.transport import NO_MASKS, MaskCopy, StepWithoutMasks
from vllm_sampling_mask.worker.coverage import cover
from vllm_sampling_mask.worker.state import SamplingMaskState


def _lengths(sampled_token_ids) -> list[int]:
    return [len(t) for t in sampled_token_ids]


def _pending_batch_update(input_batch, swap) -> tuple | None:
    """(added, removed, moved) the batch will hand its logits processors next,
    with `moved` as (from, to, is a swap: `d == swap`); None when nothing
    changed (most steps)."""
    builder = input_batch.batch_update_builder
    if not (builder.added or builder.removed or builder.moved):
        return None
    moved = [(a, b, d == swap) for a, b, d in builder.moved]
    return builder.added, builder.removed, moved


def apply(module, release: Release) -> None:
    import torch
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.sample.logits_processor.interface import MoveDirectionality

    Runner = module.GPUModelRunner
    AsyncOutput = module.AsyncGPUModelRunnerOutput
    Runner.sampling_mask: SamplingMaskState | None = None
    cover(Runner)
    AsyncOutput.sampling_mask_copy: MaskCopy | StepWithoutMasks | None = None

    @wraps(module, "GPUModelRunner.__init__")
    def __init__(wrapped, self, args, kwargs):
        wrapped(*args, **kwargs)
        # per persistent-batch row (`max_num_reqs`); None off the output rank: under
        # tensor parallelism the other ranks' outputs are dropped
        self.sampling_mask = mask_state_for(self)
        if self.sampling_mask is not None:
            self.sampler.sampling_mask = self.sampling_mask

    @wraps(module, "GPUModelRunner._may_reorder_batch")
    def _may_reorder_batch(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)
        # The last change `_update_states` makes to the persistent batch before
        # `refresh_metadata` hands it to the logits processors: rows added with their
        # sampling parameters, removed, moved by `condense`, swapped by the reorder. A
        # step then reads "wants a mask" with one slice, no loop over rows.
        if self.sampling_mask is not None:
            update = _pending_batch_update(self.input_batch, MoveDirectionality.SWAP)
            if update is not None:
                self.sampling_mask.requests.apply_batch_update(*update)
        return result

    @wraps_with_state(module, "GPUModelRunner.sample_tokens")
    def sample_tokens(wrapped, self, state, args, kwargs):
        # Planned from host arrays (no device sync): the rows whose request wants a mask,
        # their top-k, and the rows whose token upstream discards (partial prefill
        # chunks, `discard_request_mask`, filled by `_prepare_inputs` for this step:
        # not extracted, they decode as empty). The sampler (`sampler_v1`, reached
        # through `_sample`) extracts into the step.
        rows = self.input_batch.num_reqs
        plan = state.plan(slice(0, rows), self.input_batch.top_k_cpu[:rows],
                          self.discard_request_mask.np[:rows])
        if plan.masks_nothing:
            # no request of the batch wants a mask: the sampler runs as upstream's
            # (no step is open) and the step carries NO_MASKS
            out = wrapped(*args, **kwargs)
            if out is not None:
                state.steps_without_masks += 1
            if isinstance(out, ModelRunnerOutput):
                out.sampling_mask_step = NO_MASKS
            elif isinstance(out, AsyncOutput):
                out.sampling_mask_copy = NO_MASKS
            return out
        with state.step(plan) as step:
            out = wrapped(*args, **kwargs)
        if step.mask is None:   # nothing sampled; a step with tokens but no mask
            return out          # is refused by the scheduler
        mask = step.mask
        on_cuda = mask.block.is_cuda
        pool = state.pool if on_cuda else None
        if isinstance(out, ModelRunnerOutput):   # synchronous: decode it now
            copy = MaskCopy(mask, pool, record_event=on_cuda)
            out.sampling_mask_step = copy.result(_lengths(out.sampled_token_ids))
        elif isinstance(out, AsyncOutput):
            # CUDA's default: the copy runs on the output copy stream after the main
            # stream, with its own event, holding the device block until `get_output`
            if on_cuda:
                stream, main = self.async_output_copy_stream, torch.cuda.current_stream()
                with torch.cuda.stream(stream):
                    stream.wait_stream(main)
                    out.sampling_mask_copy = MaskCopy(mask, pool, record_event=True)
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
        # after the copy's event: host work only
        copy, self.sampling_mask_copy = self.sampling_mask_copy, None
        if copy is not None:
            output.sampling_mask_step = copy.result(_lengths(output.sampled_token_ids))
        return output

    profile_with_masks(module)
