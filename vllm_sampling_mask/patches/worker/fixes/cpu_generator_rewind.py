"""Rewind CPU generators of seeded requests whose sampled token is discarded.

What: wraps, in `vllm/v1/worker/gpu_model_runner.py` (the V1 runner, which CPU
    hosts run), `GPUModelRunner._sample` to save the state of each CPU
    `torch.Generator` of a row whose sample will be discarded (a partial
    prefill chunk) and restore it afterwards, and
    `GPUModelRunner._bookkeeping_sync` to hide exactly those generators from
    upstream's own rewind, which calls `Generator.set_offset`.
Why: upstream rewinds a discarded row's generator by its Philox offset, which
    CUDA generators have and CPU generators do not: on a CPU host every seeded
    request whose prompt is chunked raised "CPU Generator does not use offset"
    in the worker and took the engine down. Restoring the saved state is the
    same rewind for a CPU generator: the seeded stream does not see the
    discarded draw, exactly as on CUDA.
Upstream: no issue or PR known; would file "V1 runner on CPU: seeded request with
    a chunked prompt raises 'CPU Generator does not use offset' in
    _bookkeeping_sync".
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
        saved = {i: g.get_state() for i, g in _discarded_cpu_generators(self).items()}
        try:
            return wrapped(*args, **kwargs)
        finally:
            for i, state in saved.items():
                self.input_batch.generators[i].set_state(state)

    @wraps(module, "GPUModelRunner._bookkeeping_sync")
    def _bookkeeping_sync(wrapped, self, args, kwargs):
        hidden = _discarded_cpu_generators(self)
        generators = self.input_batch.generators
        for i in hidden:
            del generators[i]
        try:
            return wrapped(*args, **kwargs)
        finally:
            generators.update(hidden)
