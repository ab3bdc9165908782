"""`examples/grpo_step.py` and the code of `docs/rl_recipes.md`, run as printed.

Both run in a clean environment: none of the variables the rest of the suite sets
(conftest's TRITON_INTERPRET and VLLM_USE_V2_MODEL_RUNNER among them), so the
example's engine runs vLLM's V1 runner natively, as in a new user's shell.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

from vllm_sampling_mask import DEMO_MODEL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "docs", "rl_recipes.md")
SET_BY_TESTS = ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_CPU_KVCACHE_SPACE",
                "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_ENABLE_V1_MULTIPROCESSING")


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SET_BY_TESTS}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def fenced(text: str, info: str) -> list[str]:
    """The bodies of the code blocks whose info string is exactly `info`."""
    return re.findall(rf"^```{info}\n(.*?)^```", text, flags=re.S | re.M)


def test_recipe_code_blocks_run_in_order(tmp_path):
    text = read(RECIPES)
    infos = set(re.findall(r"^```(\S.*)$", text, flags=re.M))
    # every code block is runnable Python, a marked sketch, or a shell command
    assert infos <= {"python", "python sketch", "bash"}, infos
    blocks = fenced(text, "python")
    assert len(blocks) >= 4
    script = tmp_path / "recipes.py"
    script.write_text("\n".join(blocks))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = re.findall(r"^step (\d): loss ([-+.\d]+)  ratio mean ([.\d]+)", r.stdout, flags=re.M)
    assert [s[0] for s in steps] == ["0", "1", "2"]
    assert float(steps[0][2]) == 1.0           # the first step sees the rollout's weights
    assert float(steps[2][1]) < float(steps[0][1])  # the clipped surrogate went down


def _sketch(words: str) -> str:
    (block,) = [b for b in fenced(read(RECIPES), "python sketch") if words in b]
    ast.parse(block)
    return block


def test_recipe_sketches_are_valid_python():
    sketches = fenced(read(RECIPES), "python sketch")
    assert sketches
    for block in sketches:
        ast.parse(block)


def test_the_server_sketch_runs_against_a_real_server(mask_server):
    """The "with a real server" sketch, run as printed against the shared server
    (V1 runner, mask on): only its URL changes, and `MODEL` / `messages` are given."""
    block = _sketch("client.chat.completions.create")
    url = "http://localhost:8000/v1"
    assert block.count(url) == 1
    scope = {"MODEL": DEMO_MODEL,
             "messages": [{"role": "user", "content": "Write a function that sorts."}]}
    exec(compile(block.replace(url, mask_server + "/v1"), "rl_recipes:server", "exec"),
         scope)
    masks, token_ids, old = scope["masks"], scope["token_ids"], scope["old_logprobs"]
    assert len(masks) == len(scope["chat"].choices) == 8
    assert sum(len(m) for m in masks) == len(token_ids) == len(old) > 8
    for mask, choice in zip(masks, scope["chat"].choices):
        assert len(mask) == len(choice.token_ids)
        assert all(t in set(s.tolist()) for t, s in zip(choice.token_ids, mask))
        assert 1 <= max(mask.sizes) <= 50
    assert all(lp <= 0 for lp in old)


def test_the_hook_sketch_runs_and_matches_per_sequence_replay():
    """The loop hook sketch (`sampled_logprobs`) on a padded batch: each sequence's
    rows equal `nucleus_logprobs` of that sequence alone, padding is zero."""
    import numpy as np
    import torch

    from vllm_sampling_mask import SamplingMask
    from vllm_sampling_mask.training import nucleus_logprobs, pack_masks

    scope = {"torch": torch, "pack_masks": pack_masks, "nucleus_logprobs": nucleus_logprobs}
    exec(compile(_sketch("def sampled_logprobs"), "rl_recipes:hook", "exec"), scope)
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    B, L, V, T = 3, 6, 40, 0.7
    logits = torch.randn(B, L, V, generator=g)
    lengths = [6, 0, 3]                           # one empty sequence, one padded
    response_mask = torch.zeros(B, L, dtype=torch.long)
    responses = torch.zeros(B, L, dtype=torch.long)
    masks = []
    for b, n in enumerate(lengths):
        response_mask[b, :n] = 1
        rows = [np.sort(rng.choice(V, int(rng.integers(1, 10)), replace=False))
                for _ in range(n)]
        for t, row in enumerate(rows):
            responses[b, t] = int(rng.choice(row))
        masks.append(SamplingMask.from_lists(rows))
    out = scope["sampled_logprobs"](logits, responses, response_mask, masks, T)
    assert out.shape == (B, L)
    for b, n in enumerate(lengths):
        assert torch.all(out[b, n:] == 0)
        if n:
            want = nucleus_logprobs(logits[b, :n], responses[b, :n], pack_masks([masks[b]]), T)
            assert torch.allclose(out[b, :n], want, atol=1e-6)
            assert torch.all(out[b, :n] <= 0)


def test_grpo_step_example_runs_as_documented():
    doc_command = "python examples/grpo_step.py"
    (command,) = {line for b in fenced(read(RECIPES), "bash") for line in b.splitlines()
                  if line.startswith("python examples/")}
    assert command == doc_command
    assert doc_command in read(os.path.join(ROOT, "README.md"))
    r = subprocess.run(["bash", "-c", command], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    # no "Converting a tensor with requires_grad=True to a scalar" warning
    assert "requires_grad" not in r.stderr, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])     # the documented last line
    masked, unmasked, after = (result["before_masked"], result["before_unmasked"],
                               result["after"])
    T = result["tokens"]
    assert T == masked["tokens"] == unmasked["tokens"] == after["tokens"] > 100
    # before the step: the masked replay is exact to float rounding ...
    assert abs(masked["ratio_mean"] - 1) < 1e-3
    assert masked["mismatch_kl"] < 1e-6 and masked["out_of_band"] == 0.0
    # ... the full softmax is biased low (every ratio is the kept mass, <= 1)
    assert unmasked["ratio_mean"] < 0.97
    assert unmasked["ratio_p99"] < 1 + 1e-4
    assert unmasked["mismatch_kl"] > 100 * masked["mismatch_kl"]
    # top-k / top-p really truncated, and the supports vary
    assert 1 < masked["support_mean"] <= 50 and masked["singleton_share"] < 1
    # the rewards differ within at least one group, so the step has a direction
    assert any(len(set(group)) > 1 for group in result["rewards"])
    # after one step: the policy moved, the way the advantages ask
    assert after["mismatch_kl"] > 1e-6
    assert result["advantage_weighted_change"] > 0
    assert result["loss_after"] < result["loss_before"]
