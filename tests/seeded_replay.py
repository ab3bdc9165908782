"""Shared body of the seeded-replay engine tests (one engine per runner module).

A seeded request must return the same tokens and masks alone and in a batch with
greedy, unseeded and other seeded requests, with its mask on or off.
"""

from __future__ import annotations

from vllm import SamplingParams

TARGET_PROMPT = "def function_0(self, value):\n    "
OTHER_PROMPTS = ["def function_1(self, value):\n    ", "class Widget:\n    def ",
                 "import numpy as np\n", "for i in range(10):\n    "]


def target(tokens, mask):
    return SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=7, max_tokens=tokens,
                          ignore_eos=True, extra_args={"return_sampling_mask": mask})


def neighbours(tokens):
    """Greedy (no mask: a greedy request cannot have one), unseeded, another seeded
    request; each runs at least as long as the target so every step is shared."""
    long = dict(max_tokens=tokens + 4, ignore_eos=True)
    return [SamplingParams(temperature=0.0, extra_args={"return_sampling_mask": False},
                           **long),
            SamplingParams(temperature=1.0, top_k=40, **long),
            SamplingParams(temperature=0.8, top_k=30, top_p=0.9, seed=99, **long),
            SamplingParams(temperature=1.2, **long)]


def check_seeded_replay(llm, tokens):
    alone = {m: llm.generate([TARGET_PROMPT], target(tokens, m))[0].outputs[0]
             for m in (True, False)}
    a, b = alone[True], alone[False]
    assert len(a.token_ids) == tokens and a.sampling_mask is not None
    assert len(a.sampling_mask) == tokens
    assert b.sampling_mask is None
    assert b.token_ids == a.token_ids          # the mask does not change the draw
    assert len(set(a.token_ids)) > 1           # really sampled, not a constant
    others = neighbours(tokens)
    for mask in (True, False):
        # every kind of neighbour at once, then each kind alone beside the target
        for crowd in [others] + [[o] for o in others]:
            outs = llm.generate([TARGET_PROMPT, *OTHER_PROMPTS[:len(crowd)]],
                                [target(tokens, mask), *crowd])
            got = outs[0].outputs[0]
            assert got.token_ids == alone[mask].token_ids, (mask, len(crowd))
            assert got.sampling_mask == alone[mask].sampling_mask, (mask, len(crowd))
