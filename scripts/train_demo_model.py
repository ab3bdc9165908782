"""Train the demo model shipped in `vllm_sampling_mask/demo_model/`.

A tiny Llama-architecture causal LM (4 layers, hidden 128, head_dim 32) with a
4,096-token byte-level BPE tokenizer, trained on this CPU on the Python 3.11
standard library's own source (present on every machine the project runs on).
Seeded and single-threaded in its data order, so a rerun gives the same corpus,
tokenizer and (up to float reduction order) the same weights.

    python scripts/train_demo_model.py            # ~25-30 minutes on 2 cores
    python scripts/train_demo_model.py --steps 50 --out /tmp/demo   # smoke run

It prints the mean next-token entropy of the trained model on held-out text
against log(vocab size), the measure of how peaked its distributions are.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sysconfig
import time
from pathlib import Path

import torch

VOCAB_SIZE = 4096
SEQ_LEN = 128
SPECIALS = ["<unk>", "<s>", "</s>"]
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "vllm_sampling_mask" / "demo_model"


def corpus_files() -> list[Path]:
    """The stdlib's top-level modules, sorted: same list on every 3.11 machine."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size < 400_000)
    return files


def read_corpus(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
        eos_token="</s>", model_max_length=2048)


def build_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=None,
        torch_dtype="float32")
    return LlamaForCausalLM(config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    files = corpus_files()
    held_out = files[::20]                       # every 20th module is held out
    train_files = [f for f in files if f not in held_out]
    texts = read_corpus(train_files)
    t0 = time.time()
    tokenizer = train_tokenizer(texts)
    print(f"corpus: {len(train_files)} train / {len(held_out)} held-out stdlib "
          f"modules; tokenizer {len(tokenizer)} ids in {time.time() - t0:.1f}s")

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.long)
    val_ids: list[int] = []
    for text in read_corpus(held_out):
        val_ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    val = torch.tensor(val_ids[: 64 * SEQ_LEN], dtype=torch.long).view(64, SEQ_LEN)
    print(f"train tokens: {len(data):,}; held-out tokens used: {val.numel():,}")

    model = build_model(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(1, args.steps // 20)

    model.train()
    t0 = time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (
            1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(data) - SEQ_LEN - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s: s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  lr {lr:.2e}  "
                  f"{time.time() - t0:.0f}s", flush=True)

    model.eval()
    with torch.no_grad():
        logits = model(input_ids=val).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        val_loss = -logp.gather(-1, val[:, 1:, None]).mean().item()
        entropy = -(logp.exp() * logp).sum(-1).mean().item()
    print(f"held-out loss {val_loss:.3f}; mean next-token entropy {entropy:.3f} nats "
          f"vs log(V) = {math.log(len(tokenizer)):.3f} nats")

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    (args.out / "TRAINING.txt").write_text(
        f"trained by scripts/train_demo_model.py --steps {args.steps} --batch "
        f"{args.batch} --lr {args.lr} --seed {args.seed}\n"
        f"parameters: {n_params}\nheld-out loss: {val_loss:.3f}\n"
        f"mean next-token entropy: {entropy:.3f} nats; log(V) = "
        f"{math.log(len(tokenizer)):.3f} nats\n")
    print(f"saved to {args.out}")


if __name__ == "__main__":
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    main()
