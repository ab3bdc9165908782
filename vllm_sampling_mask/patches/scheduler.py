"""Slice each step's masks per request into the engine-core outputs.

What: in `vllm/v1/core/sched/scheduler.py`, makes the scheduler build
    `wire.MaskedEngineCoreOutput` (a subclass with two trailing mask fields)
    and wraps `Scheduler.update_from_output`: after upstream has cut each
    request's new tokens (stop tokens, max_tokens, preemption, aborts), each
    output gets the supports of exactly the tokens it kept, in order.
Why: the scheduler is where per-step runner rows become per-request outputs;
    slicing after upstream keeps the mask aligned with `new_token_ids` by
    construction.
Remove when: upstream carries the mask in `EngineCoreOutput`.
"""

from __future__ import annotations

import functools

import numpy as np

from vllm_sampling_mask.wire import MaskedEngineCoreOutput


def apply(module) -> None:
    module.EngineCoreOutput = MaskedEngineCoreOutput
    Scheduler = module.Scheduler
    original = Scheduler.update_from_output

    @functools.wraps(original)
    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = original(self, scheduler_output, model_runner_output)
        masks = getattr(model_runner_output, "sampling_masks", None)
        if masks is None:
            return outputs
        index = model_runner_output.req_id_to_index
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                n = len(out.new_token_ids)
                if n == 0 or not isinstance(out, MaskedEngineCoreOutput):
                    continue
                if n != 1:
                    raise RuntimeError(
                        f"sampling mask: request {out.request_id} got {n} tokens in "
                        "one step; only one is possible without speculative decoding")
                row = masks.row(index[out.request_id])
                out.sampling_mask_ids = np.ascontiguousarray(row, dtype=np.int32)
                out.sampling_mask_counts = np.array([len(row)], dtype=np.int32)
        return outputs

    Scheduler.update_from_output = update_from_output
