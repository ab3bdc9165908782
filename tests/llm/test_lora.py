"""Sampling masks with LoRA adapters, on both runners (on CPU: V1 natively, Model
Runner V2 through Triton's interpreter).

Two small adapters for the demo model are written here in peft's format
(`adapter_config.json` and `adapter_model.safetensors`: rank 8 on every linear layer
of every decoder layer, seeded random A and B, B non-zero so the logits move). The
reference for a request naming an adapter is the demo model in transformers with
`W + scaling * B @ A` merged into each target weight. One engine per runner
(`enable_lora=True`, room for both adapters at once). What must hold:

- a request naming an adapter gets that adapter's masks: every support against the
  merged model's reference, and different from the base model's masks on the same
  seeded request (which do not match the adapter's reference);
- a batch mixing the base model and both adapters keeps each row's mask: each row
  against its own model's reference, and the same tokens and masks as the row run
  alone. On a CPU host this needs the `cpu_lora_base_rows` fix: upstream gave a
  base row of such a batch the delta of the adapter in the last slot
  (tests/patches/fixes/test_fix_cpu_lora_base_rows.py checks the fix on upstream's
  PyTorch LoRA ops directly, without an engine).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import (ENGINE_KWARGS, PROMPTS, assert_supports_match_reference,
                      check_alignment, engine_on)

from vllm_sampling_mask import DEMO_MODEL

RUNNERS = ["v1", "mrv2"]   # V1 natively; Model Runner V2 through Triton's interpreter
RANK, ALPHA = 8, 16        # peft's scaling: alpha / r
TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
CASE = dict(temperature=1.0, top_k=40, top_p=0.9)
TOKENS = 16


def write_adapter(path: str, seed: int, std: float = 0.05) -> str:
    """A LoRA adapter for the demo model in peft's layout at `path`: every target
    module of every layer gets A [r, in] ~ N(0, 1/in) and B [out, r] ~ N(0, std^2)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(DEMO_MODEL)
    h, inter = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
              "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q),
              "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
              "mlp.down_proj": (h, inter)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module in TARGETS:
            out_features, in_features = shapes[module]
            name = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{name}.lora_A.weight"] = (
                torch.randn(RANK, in_features, generator=generator) / in_features ** 0.5)
            tensors[f"{name}.lora_B.weight"] = (
                torch.randn(out_features, RANK, generator=generator) * std)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK,
                   "lora_alpha": ALPHA, "lora_dropout": 0.0, "bias": "none",
                   "target_modules": sorted({m.split(".")[1] for m in TARGETS}),
                   "base_model_name_or_path": DEMO_MODEL}, f)
    return path


def merged_model(adapter: str | None):
    """The demo model in transformers, float32, with `adapter` merged into its weights
    (`W + alpha / r * B @ A`); the base model for None."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    if adapter is None:
        return model
    weights = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in weights.items():
            if name.endswith(".lora_A.weight"):
                b = weights[name.replace(".lora_A.", ".lora_B.")]
                target = name[len("base_model.model."):-len(".lora_A.weight")] + ".weight"
                params[target] += ALPHA / RANK * b @ a
    return model


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("lora")
    return {name: write_adapter(str(root / name), seed)
            for name, seed in (("first", 1), ("second", 2))}


@pytest.fixture(scope="module")
def references(adapters) -> dict:
    """name (None: the base model) -> its transformers model."""
    return {None: merged_model(None),
            **{name: merged_model(path) for name, path in adapters.items()}}


@pytest.fixture(scope="module", params=[
    pytest.param(runner, marks=pytest.mark.mrv2 if runner == "mrv2" else ())
    for runner in RUNNERS])
def llm(request):
    engine = engine_on(request.param, **dict(ENGINE_KWARGS, max_model_len=256,
                                             max_num_seqs=8, enable_lora=True,
                                             max_lora_rank=RANK, max_loras=2))
    yield engine
    del engine


def lora(adapters, name):
    from vllm.lora.request import LoRARequest
    if name is None:
        return None
    return LoRARequest(name, 1 + sorted(adapters).index(name), adapters[name])


def generate(llm, adapters, prompts, names, seeds):
    from vllm import SamplingParams
    params = [SamplingParams(**CASE, max_tokens=TOKENS, ignore_eos=True, seed=s, logprobs=0)
              for s in seeds]
    return llm.generate(prompts, params, lora_request=[lora(adapters, n) for n in names])


def test_an_adapters_masks_are_its_own(llm, adapters, references, tokenizer):
    """Each adapter's masks match its merged reference, differ from the base model's
    on the same seeded request, and fail the base model's reference."""
    names = [None, "first", "second"]
    outs = [generate(llm, adapters, [PROMPTS[0]], [name], [7])[0] for name in names]
    for out, name in zip(outs, names):
        check_alignment(out.outputs[0], len(tokenizer))
        assert_supports_match_reference([out], [CASE], references[name])
    base = outs[0].outputs[0].sampling_mask
    for out in outs[1:]:
        assert out.outputs[0].sampling_mask != base
        with pytest.raises(AssertionError):     # the base model does not explain it
            assert_supports_match_reference([out], [CASE], references[None])
    with pytest.raises(AssertionError):         # nor the first adapter the second's
        assert_supports_match_reference([outs[2]], [CASE], references["first"])


def test_a_batch_mixing_base_and_two_adapters_keeps_each_rows_mask(
        llm, adapters, references, tokenizer):
    names = [None, "first", "second", None, "second", "first"]
    prompts = [PROMPTS[i % 3] for i in range(len(names))]
    seeds = [30 + i for i in range(len(names))]
    mixed = generate(llm, adapters, prompts, names, seeds)
    for out, name in zip(mixed, names):
        check_alignment(out.outputs[0], len(tokenizer))
        assert_supports_match_reference([out], [CASE], references[name])
    for i, name in enumerate(names[:3]):          # base, first, second: alone as in the mix
        alone = generate(llm, adapters, [prompts[i]], [name], [seeds[i]])[0].outputs[0]
        assert alone.token_ids == mixed[i].outputs[0].token_ids, name
        assert alone.sampling_mask == mixed[i].outputs[0].sampling_mask, name
