"""Hand the engine flag to Model Runner V2's sampler where upstream builds it.

What: wraps `GPUModelRunner.load_model` (vllm/v1/worker/gpu/model_runner.py;
    the CPU runner inherits it), which builds `self.sampler`: with
    `model_config.return_sampling_mask` it sets the sampler's declared
    `return_sampling_mask`, `sampling_mask_max_size` and per-slot
    `sampling_mask_rows`, turns its FlashInfer sampler off, and declares
    that this process's `AsyncOutput`s must carry a mask. A sampler that is
    not vLLM's `Sampler` (a model state's `custom_sampler`) is refused.
    Wraps `_dummy_sampler_run` so the memory-profiling run extracts with the
    worst-case layout (widest rows, one wide-row slot per row): the KV cache
    is then sized with the mask's largest per-step device memory included.
Why: the flag is configuration; passing it explicitly where the sampler is
    built (instead of the sampler reading ambient config) means a sampler that
    never got it cannot silently return no mask.
Remove when: upstream's `Sampler` takes the flag (vLLM #49577).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.config import mask_enabled
from vllm_sampling_mask.patches._wrap import run_worst_case, wraps


def apply(module) -> None:
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    @wraps(module, "GPUModelRunner.load_model")
    def load_model(wrapped, self, args, kwargs):
        result = wrapped(*args, **kwargs)
        if mask_enabled(self.vllm_config) and self.sampler is not None:
            if type(self.sampler) is not Sampler:
                raise ValueError(
                    "--return-sampling-mask (return_sampling_mask=True) supports "
                    f"vLLM's own Sampler, but this model uses {type(self.sampler)!r}: "
                    "drop the flag for this model.")
            self.sampler.return_sampling_mask = True
            self.sampler.sampling_mask_max_size = self.model_config.max_sampling_mask_size
            self.sampler.sampling_mask_rows = np.zeros(self.max_num_reqs, dtype=bool)
            self.sampler.use_flashinfer = False
            async_utils.AsyncOutput.return_sampling_mask = True
        return result

    @wraps(module, "GPUModelRunner._dummy_sampler_run")
    def _dummy_sampler_run(wrapped, self, args, kwargs):
        return run_worst_case(self.sampler, wrapped, args, kwargs)
