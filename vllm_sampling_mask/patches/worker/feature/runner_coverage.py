"""Refuses, at engine start, a model runner that no adapter extracts masks from.

What it wraps, in `vllm/v1/worker/gpu_worker.py` (the CPU worker inherits it):

- `Worker.load_model`: with the flag on, `worker.coverage.refuse_uncovered` checks the
  runner `init_device` built, before the model is loaded.

Why: on 0.34 a CPU host without Triton (non-x86) runs `StandaloneCPUModelRunner` with
its own `CPUSampler`, which no patch wraps; its tokens would come back without masks.
"""

from __future__ import annotations

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.worker.coverage import refuse_uncovered


def apply(module, release: Release) -> None:
    @wraps(module, "Worker.load_model")
    def load_model(wrapped, self, args, kwargs):
        if mask_enabled(self.vllm_config):
            refuse_uncovered(self.model_runner)
        return wrapped(*args, **kwargs)
