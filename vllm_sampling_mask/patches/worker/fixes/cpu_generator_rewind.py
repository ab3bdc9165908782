"""Rewind CPU generators of seeded requests whose sampled token is discarded.

What it wraps, in `vllm/v1/worker/gpu_model_runner.py` (the V1 runner CPU hosts run):

- `GPUModelRunner._sample`: saves and restores the state of each CPU generator of a row
  whose sample is discarded (a partial prefill chunk);
- `GPUModelRunner._bookkeeping_sync`: hides exactly those generators from upstream's
  rewind.

Why: upstream rewinds with `Generator.set_offset`, which CPU generators lack: a seeded
request with a chunked prompt took the engine down.
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.patches._wrap import wraps
from vllm_sampling_mask.releases import Release


def _discarded_cpu_generators(runner) -> dict[int, object]:
    num_reqs = runner.input_batch.num_reqs
    rows = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    generators = runner.input_batch.generators
    return {int(i): generators[int(i)] for i in rows
            if int(i) in generators and generators[int(i)].device.type == "cpu"}


def apply(module, release: Release) -> None:
    @wraps(module, "GPUModelRunner._sample")
    def _sample(wrapped, self, args, kwargs):
        # the same rewind as CUDA's Philox offset: the seeded stream does not see the
        # discarded draw
        saved = {i: g.get_state() for i, g in _discarded_cpu_generators(self).items()}
        try:
            return wrapped(*args, **kwargs)
        finally:
            for i, state in saved.items():
                self.input_batch.generators[i].set_state(state)

    @wraps(module, "GPUModelRunner._bookkeeping_sync")
    def _bookkeeping_sync(wrapped, self, args, kwargs):
        hidden = _discarded_cpu_generators(self)   # "CPU Generator does not use offset"

        generators = self.input_batch.generators
        for i in hidden:
            del generators[i]
        try:
            return wrapped(*args, **kwargs)
        finally:
            generators.update(hidden)
