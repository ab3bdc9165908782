"""Seeded rows draw from their own generators on a CPU host, whatever the batch holds.

What: wraps `TopKTopPSampler.forward_cpu` (vllm/v1/sample/ops/topk_topp_sampler.py,
    the V1 runner's sampler on x86/ARM CPU hosts). When some, but not all, rows of
    the batch carry a per-request generator (and `use_fp64_gumbel` is off), the
    wrapper samples the batch itself: top-k/top-p through the module's
    `apply_top_k_top_p` (so `top_p_one_rows` and `interpreter_top_k_top_p`, which
    wrap the functions it calls, still apply), the processed logits/logprobs
    upstream would return, then exponential noise drawn for every row from the
    global generator and overwritten, row by row, for the seeded rows from their
    own generators, and upstream's `sample_with_exponential_noise`. That is the
    draw upstream already makes when every row is seeded, so a seeded row draws
    exactly as it does alone. Batches with no seeded row or only seeded rows (and
    the fp64 path) go to upstream unchanged. Unseeded rows (greedy ones included,
    whose draw the sampler discards) keep the global generator. Applies with the
    mask flag on or off.
Why: upstream's `forward_cpu` takes its compiled all-global path whenever
    `len(generators) != logits.shape[0]`, ignoring every seed in a batch that also
    holds a greedy or unseeded request: a seeded request's tokens (and so its
    masks) changed with its neighbours, which breaks replaying a rollout by its
    seed (measured on the V1 runner on a CPU host: a seeded request's tokens changed
    in 3 of 3 trials with greedy neighbours). CUDA
    (`forward_native`/`random_sample`) and Model Runner V2 (per-row seeds in its
    Gumbel kernel) honour seeds in mixed batches already.
Upstream issue: none known; would file "V1 CPU sampler ignores per-request seeds
    when the batch mixes seeded and unseeded/greedy rows
    (TopKTopPSampler.forward_cpu, `len(generators) != logits.shape[0]`)".
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
        if not generators or len(generators) == rows or self.use_fp64_gumbel:
            return wrapped(*args, **kwargs)
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
        return module.sample_with_exponential_noise(probs, noise), returned
