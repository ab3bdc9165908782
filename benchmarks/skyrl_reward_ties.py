"""How often a GRPO group's rewards all tie in SkyRL's CPU loop (examples/skyrl_cpu.py).

A group whose answers all score the same has zero advantage, and at step 1 the KL
term has no gradient either (the policy is the reference), so a step whose groups all
tie trains nothing. This draws the loop's own rollouts without SkyRL: its prompts
through the demo model's chat template, its sampling settings (read from the loop's
`overrides`), `n` answers per prompt and one seed per group, each answer scored by
the loop's `reward`; it prints, per `n`, the groups whose answers share one reward.
Any environment with vLLM runs it (SkyRL itself is not needed).

    python benchmarks/skyrl_reward_ties.py
    python benchmarks/skyrl_reward_ties.py --seeds 50 --n 2 4 8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import skyrl_cpu  # noqa: E402


def sampling_settings() -> dict:
    """The loop's `generator.sampling_params.*` overrides, as vLLM arguments."""
    with tempfile.TemporaryDirectory() as work:
        args = skyrl_cpu.overrides(False, work, "ties")
    prefix = "generator.sampling_params."
    found = dict(a[len(prefix):].split("=", 1) for a in args if a.startswith(prefix))
    return {"temperature": float(found["temperature"]), "top_p": float(found["top_p"]),
            "top_k": int(found["top_k"]), "max_tokens": int(found["max_generate_length"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="groups per prompt")
    parser.add_argument("--n", type=int, nargs="+", default=[2, 4], help="answers per group")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams
    from vllm_sampling_mask import DEMO_MODEL

    settings = sampling_settings()
    llm = LLM(DEMO_MODEL, dtype="float32", enforce_eager=True,
              kv_cache_memory_bytes=1 << 28)
    template = llm.get_tokenizer().apply_chat_template
    prompts = [template([{"role": "user", "content": p}], tokenize=False,
                        add_generation_prompt=True) for p in skyrl_cpu.PROMPTS]
    print(f"{len(prompts)} prompts x {args.seeds} seeds, {settings}")
    for n in args.n:
        params = [SamplingParams(n=n, seed=seed, **settings) for seed in range(args.seeds)]
        outputs = llm.generate([p for p in prompts for _ in params], params * len(prompts),
                               use_tqdm=False)
        tied = sum(len({skyrl_cpu.reward(c.text) for c in o.outputs}) == 1 for o in outputs)
        print(f"n={n}: {tied} of {len(outputs)} groups with one reward")


if __name__ == "__main__":
    main()
