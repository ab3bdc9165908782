"""Extract the sampling mask in the V1 model runner's sampler.

What: in `vllm/v1/sample/sampler.py`, declares `Sampler.sampling_mask` (the
    runner's `state.SamplingMaskState`; `runner_v1` sets it where upstream
    builds the sampler; None with the flag off) and wraps `Sampler.sample` and
    `Sampler.forward`. With a state, `sample` compacts, for the rows that want
    a mask (`state.wants`, per persistent-batch row) less the rows whose draw
    the runner discards (partial prefill chunks: `state.take_discarded`, which
    the runner staged from its `discard_request_mask`; they are not extracted
    and decode as sampled nothing), the support of the
    processed logprobs it returns (`log_softmax` of the logits it sampled from,
    after every logits processor, custom ones included, penalties,
    temperature, min-p and top-k/top-p: the same -inf set), laid out from the
    batch's host-side top-k the runner staged (`state.take_top_k`); in the
    memory-profiling run (`state.profiling()`) every row at the widest.
    `forward` puts it on the declared field `SamplerOutput.sampling_mask`
    (`state.mask.take`). For the rows that asked for support logprobs
    (`state.asked`), `sample` also wraps its call in a capture: the wrapped
    static `Sampler.apply_temperature` (it divides the logits in place; the
    argmax-invariant processors, min-p among them, and top-k/top-p then edit
    them in place) hands its result to `state.capture_scaled`, which keeps only
    the asked rows' largest scaled logprob ([A] floats, not the logits); the
    extraction then gathers the support logprobs from the processed logprobs.
    A batch where no row asked captures nothing.
Why: the sampler is the only place where the exact support exists. Processed
    logprobs are always materialised in `processed_logprobs` mode (which the
    flag requires), and in that mode upstream never picks the FlashInfer
    sampler, so the mask costs no change of sampling kernel.
Remove when: upstream's V1 sampler returns the support (vLLM #49577 did it for
    Model Runner V2 only).
"""

from __future__ import annotations

import numpy as np

from vllm_sampling_mask.errors import MissingSamplingMaskError
from vllm_sampling_mask.extraction import no_rows
from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release
from vllm_sampling_mask.state import SamplingMaskState, capturing_state


def apply(module, release: Release) -> None:
    module.Sampler.sampling_mask: SamplingMaskState | None = None

    @wraps(module, "Sampler.apply_temperature")
    def apply_temperature(wrapped, instance, args, kwargs):
        scaled = wrapped(*args, **kwargs)
        state = capturing_state()
        if state is not None:
            state.capture_scaled(scaled)
        return scaled

    @wraps(module, "Sampler.sample")
    def sample(wrapped, self, args, kwargs):
        state = self.sampling_mask
        if state is None:
            return wrapped(*args, **kwargs)
        rows = argument(wrapped, args, kwargs, "logits").shape[0]
        if state.worst_case:   # the profiling run: every row, at the widest
            top_k, wanted = np.zeros(rows, np.int64), np.ones(rows, bool)
            asked, discarded = np.ones(rows, bool), None
        else:
            top_k = state.take_top_k("V1 Sampler.sample", rows)
            discarded = state.take_discarded("V1 Sampler.sample", rows)
            wanted = state.wants[:rows]
            asked = state.asked[:rows] & ~discarded   # a discarded row records nothing
        with state.capturing(asked):
            sampled, processed_logprobs = wrapped(*args, **kwargs)
        if processed_logprobs is None:   # an all-greedy batch
            if wanted.any():
                raise MissingSamplingMaskError(
                    "V1 Sampler.sample", "no processed logprobs were computed for a "
                    "batch in which some request wants a mask")
            state.mask.put(no_rows(rows, sampled.device))
        else:
            state.mask.put(state.extract(processed_logprobs, top_k, wanted, asked,
                                         discarded=discarded))
        return sampled, processed_logprobs

    @wraps(module, "Sampler.forward")
    def forward(wrapped, self, args, kwargs):
        output = wrapped(*args, **kwargs)
        if self.sampling_mask is not None:
            output.sampling_mask = self.sampling_mask.mask.take("V1 Sampler.forward")
        return output
