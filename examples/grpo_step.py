"""One GRPO-style update of the demo model on CPU, with sampling masks end to end.

    python examples/grpo_step.py

1. Rollout: vLLM (`vllm.LLM`, mask on, `logprobs_mode="processed_logprobs"`)
   samples a group of G completions per prompt with top-k / top-p, and returns
   per token the sampled id, the engine's log-probability of it (normalised
   over the support) and the support itself (`CompletionOutput.sampling_mask`).
2. Rewards from a toy rule (the demo model writes Python: a completion earns a
   point per distinct Python keyword it contains), advantages normalised
   within each prompt's group (GRPO).
3. Trainer: the same weights in `transformers` (float32).  Its log-probabilities
   of the sampled tokens come from `nucleus_logprobs` over the packed masks,
   so they are taken under the distribution the engine sampled from; the loss
   is PPO's clipped surrogate, averaged per sequence then over the batch; one
   AdamW step.
4. Ratio statistics (`ratio_statistics`) before the step, masked
   (`nucleus_logprobs`: ratio 1 up to float rounding, the trainer replays the
   sampler) against unmasked (`full_logprobs`: biased, the full softmax spreads
   probability over ids the sampler could not draw), and after the step (the
   new policy against the rollout policy).

The last line printed is a JSON object with the figures.  Runs offline on CPU:
about 25 s of CPU time, most of it vLLM's start-up; a minute or two of wall time
on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import keyword
import re
import time

PROMPTS = [
    "def main():\n    ",
    "class Parser:\n    def __init__(self",
    "    for i in range(",
    "if __name__ == '__main__':\n",
]
KEYWORDS = frozenset(keyword.kwlist)


def reward(text: str) -> float:
    """Toy reward: the number of distinct Python keywords in the completion."""
    return float(len(KEYWORDS.intersection(re.findall(r"[A-Za-z_]+", text))))


def rollout(args):
    """Sample G completions per prompt; returns (prompt_ids, completions) per prompt."""
    from vllm import LLM, SamplingParams

    from vllm_sampling_mask import DEMO_MODEL

    llm = LLM(DEMO_MODEL, return_sampling_mask=True, logprobs_mode="processed_logprobs",
              kv_cache_memory_bytes=1 << 30, dtype="float32", enforce_eager=True,
              max_model_len=512, seed=args.seed)
    params = SamplingParams(n=args.group, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, max_tokens=args.max_tokens, logprobs=0,
                            seed=args.seed)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    groups = [(list(o.prompt_token_ids), list(o.outputs)) for o in outs]
    del llm
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (G)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--clip", type=float, default=0.2, help="PPO clip range epsilon")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()

    groups = rollout(args)
    t_rollout = time.time() - t0

    import torch
    from transformers import AutoModelForCausalLM

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.training import (
        full_logprobs,
        importance_ratio,
        nucleus_logprobs,
        pack_masks,
        ratio_statistics,
    )

    torch.manual_seed(args.seed)

    # --- rewards and group-normalised advantages ---------------------------
    sequences = []                     # (prompt_ids, completion) in packing order
    seq_adv = []
    rewards = []
    for prompt_ids, completions in groups:
        r = torch.tensor([reward(c.text) for c in completions])
        adv = (r - r.mean()) / (r.std() + 1e-6)
        rewards.append(r.tolist())
        for c, a in zip(completions, adv.tolist()):
            sequences.append((prompt_ids, c))
            seq_adv.append(a)

    # --- the batch, packed along T -------------------------------------------
    completions = [c for _, c in sequences]
    token_ids = torch.tensor([t for c in completions for t in c.token_ids])
    old_logprobs = torch.tensor([lp[t].logprob for c in completions
                                 for t, lp in zip(c.token_ids, c.logprobs)])
    masks = [c.sampling_mask for c in completions]
    ids, offsets = pack_masks(masks)
    sizes = torch.diff(offsets)
    lengths = torch.tensor([len(c.token_ids) for c in completions])
    seq_of_token = torch.repeat_interleave(torch.arange(len(completions)), lengths)
    advantages = torch.tensor(seq_adv)[seq_of_token]

    # --- trainer: the same weights in transformers, float32 ------------------
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    model.eval()   # no dropout: the trainer replays the sampler exactly
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    # One right-padded batch: the padding comes after every real token, so a causal
    # model's logits at the real positions do not depend on it.
    seqs = [prompt_ids + list(c.token_ids) for prompt_ids, c in sequences]
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention_mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, :len(s)] = torch.tensor(s)
        attention_mask[i, :len(s)] = 1
    # Token k of completion i was produced at position len(prompt_i) - 1 + k.
    first_token = (torch.cumsum(lengths, 0) - lengths)[seq_of_token]
    k = torch.arange(len(token_ids)) - first_token
    prompt_lengths = torch.tensor([len(p) for p, _ in sequences])
    row_pos = prompt_lengths[seq_of_token] - 1 + k

    def generation_logits():
        """[T, V] logits at the positions that produced each generated token."""
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[seq_of_token, row_pos]

    logits = generation_logits()
    new_logprobs = nucleus_logprobs(logits, token_ids, (ids, offsets), args.temperature)
    with torch.no_grad():
        unmasked = full_logprobs(logits.detach(), token_ids, args.temperature)
    before_masked = ratio_statistics(new_logprobs, old_logprobs, sizes)
    before_unmasked = ratio_statistics(unmasked, old_logprobs, sizes)

    # PPO / GRPO clipped surrogate, per-token, averaged per sequence then over sequences.
    ratio = importance_ratio(new_logprobs, old_logprobs)
    clipped = importance_ratio(new_logprobs, old_logprobs, clip=args.clip)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    per_seq = torch.zeros(len(completions)).index_add_(0, seq_of_token, per_token) / lengths
    loss = per_seq.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    with torch.no_grad():
        after_logprobs = nucleus_logprobs(generation_logits(), token_ids, (ids, offsets),
                                          args.temperature)
    after = ratio_statistics(after_logprobs, old_logprobs, sizes)
    # Did the step move the policy the way the advantages ask?
    moved = float((advantages * (after_logprobs - new_logprobs.detach())).sum())
    with torch.no_grad():
        r_after = importance_ratio(after_logprobs, old_logprobs)
        c_after = importance_ratio(after_logprobs, old_logprobs, clip=args.clip)
        per_token_after = -torch.minimum(r_after * advantages, c_after * advantages)
        loss_after = float((torch.zeros(len(completions)).index_add_(
            0, seq_of_token, per_token_after) / lengths).mean())

    # --- report ------------------------------------------------------------
    def line(name, st):
        return (f"  {name:<36} ratio mean {st['ratio_mean']:.6f}  p1 {st['ratio_p1']:.4f}  "
                f"p99 {st['ratio_p99']:.4f}  mismatch KL {st['mismatch_kl']:.2e}  "
                f"out of [0.9, 1.1] {100 * st['out_of_band']:.1f}%")

    T = int(token_ids.numel())
    print(f"rollout: {len(PROMPTS)} prompts x {args.group} samples, {T} tokens "
          f"(top_k={args.top_k}, top_p={args.top_p}, temperature={args.temperature}); "
          f"support size mean {before_masked['support_mean']:.1f}, median "
          f"{before_masked['support_median']:.0f}, p99 {before_masked['support_p99']:.0f}, "
          f"singletons {100 * before_masked['singleton_share']:.0f}%")
    for prompt, r in zip(PROMPTS, rewards):
        print(f"  rewards for {prompt!r:<40} {r}")
    print("before the step (trainer at the rollout's weights vs the engine's logprobs):")
    print(line("masked (nucleus_logprobs):", before_masked))
    print(line("unmasked (full_logprobs):", before_unmasked))
    loss_before = float(loss.detach())   # a scalar of the graph: detached, no warning
    print(f"loss {loss_before:.6f} -> {loss_after:.6f} after one AdamW step (lr {args.lr})")
    print("after the step (new policy vs the rollout policy, masked):")
    print(line("masked (nucleus_logprobs):", after))
    print(f"advantage-weighted change of the sampled tokens' logprobs: {moved:+.4f}")
    print(f"time: rollout {t_rollout:.1f}s, total {time.time() - t0:.1f}s")
    print(json.dumps({"tokens": T, "before_masked": before_masked,
                      "before_unmasked": before_unmasked, "after": after,
                      "loss_before": loss_before, "loss_after": loss_after,
                      "advantage_weighted_change": moved, "rewards": rewards}))


if __name__ == "__main__":  # vLLM starts its engine processes with spawn
    main()
