"""Seeded rows draw from their own generators on a CPU host, whatever the batch holds.

What it wraps: `TopKTopPSampler.forward_cpu` (vllm/v1/sample/ops/topk_topp_sampler.py,
the V1 runner's sampler on CPU hosts):

- a batch where some, not all, rows carry a generator is sampled here, each seeded row
  drawing its noise from its own generator; every other batch is upstream's.

With the mask flag on or off.
Why: upstream ignored every seed in a batch that also holds an unseeded or greedy row,
which breaks replaying a rollout by its seed.
"""

from __future__ import annotations

from vllm_sampling_mask.patches._wrap import argument, wraps
from vllm_sampling_mask.releases import Release


def apply(module, release: Release) -> None:
    import torch

    @wraps(module, "TopKTopPSampler.forward_cpu")
    def forward_cpu(wrapped, self, args, kwargs):
        logits, generators, k, p = (argument(wrapped, args, kwargs, name)
                                    for name in ("logits", "generators", "k", "p"))
        rows = logits.shape[0]
        # Upstream takes its compiled all-global path whenever len(generators) !=
        # logits.shape[0] (measured: a seeded request's tokens changed in 3 of 3 trials
        # with greedy neighbours). CUDA (`random_sample`) and Model Runner V2 (per-row
        # seeds in its Gumbel kernel) honour seeds in mixed batches already.
        if not generators or len(generators) == rows or self.use_fp64_gumbel:
            return wrapped(*args, **kwargs)
        # through the module's function, so `top_p_one_rows` and
        # `interpreter_top_k_top_p`, which wrap what it calls, still apply
        logits = module.apply_top_k_top_p(logits, k, p)
        if self.logprobs_mode == "processed_logits":
            returned = logits
        elif self.logprobs_mode == "processed_logprobs":
            returned = logits.log_softmax(dim=-1, dtype=torch.float32)
        else:
            returned = None
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        noise = module.empty_exponential_noise_like(probs, False)
        noise.exponential_()                        # the global generator, every row
        for row, generator in generators.items():   # then each seeded row its own
            noise[row].exponential_(generator=generator)
        # the draw upstream makes when every row is seeded: a seeded row draws exactly as
        # it does alone; unseeded rows (greedy ones too, whose draw is discarded) keep
        # the global generator

        return module.sample_with_exponential_noise(probs, noise), returned
