"""Build a tiny random-weight Qwen3-MoE causal LM for router-replay tests.

The model shares the demo model's tokenizer (vocab 4096) and is small enough to
build in a second and to serve on a CPU host through vLLM's V1 runner:
2 layers, hidden 128, 4 attention heads of head_dim 32 (CPU attention does not
take 16), 2 KV heads, 4 experts with top-2 routing, float32. Weights come from
`torch.manual_seed(seed)`, so a given seed always writes the same checkpoint.

    python scripts/make_tiny_moe.py --out /tmp/tiny-moe

Without `--out` the model goes to a fresh temporary directory, printed at the end.
Re-running into the same directory overwrites it with the same files.
"""

from __future__ import annotations

import argparse
import os
import tempfile

NUM_LAYERS = 2
NUM_EXPERTS = 4
TOP_K = 2


def make_tiny_moe(out: str, seed: int = 0) -> str:
    """Write the tiny MoE checkpoint and the demo tokenizer to `out`; return `out`."""
    import torch
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from vllm_sampling_mask import DEMO_MODEL

    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.02,
    )
    # Some transformers versions name the expert count `num_local_experts`; vLLM's
    # Qwen3-MoE reads `num_experts`. Make sure both spellings hold 4.
    assert getattr(config, "num_experts", NUM_EXPERTS) == NUM_EXPERTS
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config).to(torch.float32).eval()
    # Random routers at std 0.02 with hidden 128 give near-uniform, near-tied
    # gates; a larger router scale makes the top-2 choice well defined.
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.mlp.gate
            gate.weight.normal_(0.0, 0.5)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="output directory (default: a new temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="tiny-moe-")
    print(make_tiny_moe(out, seed=args.seed))


if __name__ == "__main__":
    main()
