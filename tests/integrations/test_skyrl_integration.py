"""SkyRL's sample-support replay fed the engine's exact support
(`vllm_sampling_mask.integrations.skyrl`).

The layout tests run everywhere (numpy only). The rest run SkyRL's own code, in
SkyRL's environment (Python 3.12, requirements/skyrl-0.4.0-cpu.txt), and are skipped
elsewhere: SkyRL's `VLLMServerActor` as a Ray actor (`num_gpus=0`, vLLM's CPU worker)
with a real engine of the demo model (float32, enforce_eager, a 1 GiB KV cache), its
arguments built by SkyRL's `build_vllm_cli_args` from a SkyRL config whose
`engine_init_kwargs` turn the adapter on, driven by SkyRL's `RemoteInferenceClient`;
and SkyRL's trainer-side `HFModelWrapper.forward` with sample-support replay, on CPU
tensors of the demo model.

`skyrl.backends.skyrl_train.workers.model_wrapper` imports `flash_attn.bert_padding`
at module top (flash-attn has no CPU build); where flash-attn is not installed, the
trainer test puts a small test-only stand-in of its two pure tensor functions
(`pad_input`, `unpad_input`) in `sys.modules`. With `sdpa` attention and
`remove_microbatch_padding=False` (the only attention SkyRL allows without CUDA)
`forward` never calls them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import socket
import sys
import types

import numpy as np
import pytest

from ray_head import ray_head as own_ray_head

from vllm_sampling_mask.integrations import skyrl as adapter
from vllm_sampling_mask.integrations.skyrl import (SupportWidthError, WIDTH_OPTION,
                                                   support_rows, support_width)

PROMPT = [1, 2, 3, 4, 5]


# -- the layout (no SkyRL needed) ---------------------------------------------------


def test_support_rows_are_skyrls_minus_one_padded_layout():
    ids = np.array([3, 50, 337, 4, 201, 201], dtype=np.int32)
    offsets = np.array([0, 3, 5, 6])
    rows = support_rows(ids, offsets, 4)
    assert rows.dtype == np.int32 and rows.shape == (3, 4)
    assert rows.tolist() == [[3, 50, 337, -1], [4, 201, -1, -1], [201, -1, -1, -1]]
    assert support_rows(np.array([], dtype=np.int32), np.array([0]), 8).shape == (0, 8)


def test_a_support_wider_than_the_row_width_is_refused_never_cut():
    ids = np.arange(10, dtype=np.int32)
    offsets = np.array([0, 2, 10])   # token 1: 8 ids (e.g. ties at the k-th logit)
    with pytest.raises(SupportWidthError) as err:
        support_rows(ids, offsets, 6)
    message = str(err.value)
    assert "widest 8 ids, at token 1" in message and f"{WIDTH_OPTION} >= 8" in message
    assert err.value.param == WIDTH_OPTION
    assert support_rows(ids, offsets, 8)[1].tolist() == list(range(2, 10))


def test_row_width_is_the_top_k_or_the_servers_fixed_width():
    assert support_width(8) == 8
    assert support_width(8, 24) == 24
    assert support_width(-1, 24) == 24 and support_width(None, 24) == 24
    for top_k, option, param in ((-1, None, "sampling_params.top_k"),
                                 (None, None, "sampling_params.top_k"),
                                 (32, 24, "sampling_params.top_k"),
                                 ("8", None, "sampling_params.top_k"),
                                 (8, 0, WIDTH_OPTION), (8, True, WIDTH_OPTION)):
        with pytest.raises(SupportWidthError) as err:
            support_width(top_k, option)
        assert err.value.param == param, (top_k, option)
    assert adapter.engine_init_kwargs() == {
        "return_sampling_mask": True, "middleware": [adapter.MIDDLEWARE]}
    assert adapter.engine_init_kwargs(24)[WIDTH_OPTION] == 24


def _need_skyrl():
    pytest.importorskip("skyrl", reason="SkyRL is not installed (its environment: "
                        "requirements/skyrl-0.4.0-cpu.txt, docs/rl_recipes.md 'SkyRL')")


# -- SkyRL's rollout server on Ray, with a real engine ------------------------------


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head of our own (tests/ray_head.py); yields the first port of its block
    (the servers take ports from base + 50 on)."""
    _need_skyrl()
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    with own_ray_head(ray, num_cpus=4, prefix="skyrl-ray-") as base:
        yield base


@contextlib.contextmanager
def _skyrl_server(port: int, extra_engine_kwargs: str = ""):
    """SkyRL's VLLMServerActor on Ray (num_gpus=0, vLLM's CPU worker), its arguments
    built by SkyRL from a config that turns the adapter on."""
    import ray
    from skyrl.backends.skyrl_train.inference_servers.utils import build_vllm_cli_args
    from skyrl.backends.skyrl_train.inference_servers.vllm_server_actor import \
        VLLMServerActor
    from skyrl.train.config.config import SkyRLTrainConfig

    import vllm_sampling_mask as m

    cfg = SkyRLTrainConfig.from_cli_overrides([
        f"trainer.policy.model.path={m.DEMO_MODEL}",
        "trainer.placement.colocate_all=false",   # sleep mode has no CPU support
        "trainer.algorithm.enable_sample_support_replay=true",
        "generator.inference_engine.enable_return_sample_support_set=true",
        "generator.sampling_params.top_k=8",
        "generator.inference_engine.model_dtype=float32",
        "generator.inference_engine.enforce_eager=true",
        "generator.inference_engine.enable_prefix_caching=false",
        "generator.inference_engine.engine_init_kwargs={"
        f"return_sampling_mask: true, middleware: [{adapter.MIDDLEWARE}], "
        "worker_cls: vllm.v1.worker.cpu_worker.CPUWorker, "
        f"kv_cache_memory_bytes: {1 << 30}{extra_engine_kwargs}}}",
    ])
    args = build_vllm_cli_args(cfg)
    actor = ray.remote(VLLMServerActor).options(num_gpus=0, num_cpus=1).remote(
        args, port, distributed_executor_backend="uni", enable_ray_prometheus_stats=False)
    try:
        info = ray.get(actor.start.remote(), timeout=600)
        yield types.SimpleNamespace(url=f"http://{info.ip}:{info.port}", model=m.DEMO_MODEL)
        ray.get(actor.shutdown.remote(), timeout=60)
    finally:
        ray.kill(actor)


@pytest.fixture(scope="module")
def skyrl_server(ray_head):
    with _skyrl_server(ray_head + 50) as server:
        yield server


def _client(server):
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import \
        RemoteInferenceClient
    return RemoteInferenceClient(proxy_url=server.url, server_urls=[server.url],
                                 data_parallel_size=1, model_name=server.model,
                                 enable_return_sample_support_set=True)


def _generate(server, prompts, sampling_params, return_sample_support=True):
    """SkyRL's `RemoteInferenceClient.generate`, as its generator calls it."""
    client = _client(server)

    async def go():
        try:
            return await client.generate({
                "prompt_token_ids": prompts, "sampling_params": sampling_params,
                "return_sample_support": return_sample_support})
        finally:
            await client.aclose()
    return asyncio.run(go())


def _engine_masks(server, prompt, sampling_params):
    """The same request, the engine's own mask from `/inference/v1/generate`."""
    import requests
    r = requests.post(f"{server.url}/inference/v1/generate", timeout=300, json={
        "model": server.model, "token_ids": prompt, "sampling_params": sampling_params,
        "return_sampling_mask": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["sampling_mask"]


CASES = {
    # nucleus inside a top-k (the notes' 22/22 case), a wide top-k, min-p
    "top_k8_top_p0.7": dict(temperature=1.0, top_k=8, top_p=0.7),
    "top_k64": dict(temperature=1.0, top_k=64),
    "top_k40_min_p0.05": dict(temperature=0.9, top_k=40, min_p=0.05),
}


@pytest.mark.skyrl
@pytest.mark.parametrize("case", list(CASES))
def test_replayed_support_equals_the_engines_mask_token_by_token(skyrl_server, case):
    params = dict(CASES[case], max_tokens=16, seed=7, logprobs=0)
    out = _generate(skyrl_server, [PROMPT], params)
    rows = out["rollout_sample_support"][0]
    token_ids = out["response_ids"][0]
    top_k = params["top_k"]
    assert rows.dtype == np.int32 and rows.shape == (len(token_ids), top_k)
    engine_tokens, engine_mask = _engine_masks(skyrl_server, PROMPT, params)
    assert engine_tokens == token_ids   # same seed, same draw
    for t, (row, mask, sampled) in enumerate(zip(rows, engine_mask, token_ids)):
        kept = row[row >= 0]
        assert (row[len(kept):] == -1).all(), f"token {t}: padding not trailing: {row}"
        assert kept.tolist() == mask, f"token {t}: {kept.tolist()} != engine {mask}"
        assert sampled in kept, f"token {t}: sampled {sampled} not in its support"
    # the sampled token's processed logprob rides along, as SkyRL's route sends it
    assert len(out["response_logprobs"][0]) == len(token_ids)
    assert all(lp <= 0.0 for lp in out["response_logprobs"][0])


@pytest.mark.skyrl
def test_the_route_is_the_adapters_for_support_and_skyrls_otherwise(skyrl_server):
    import requests
    body = {"model": skyrl_server.model, "token_ids": PROMPT,
            "sampling_params": {"temperature": 1.0, "top_k": 1, "max_tokens": 4, "seed": 1},
            "return_sample_support": True}
    # SkyRL's own capture refuses top_k 1 (400); the exact support needs no top-k
    # list to rebuild it from, so the adapter serves it, one id a row
    r = requests.post(f"{skyrl_server.url}/skyrl/v1/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    support = r.json()["choices"][0]["rollout_sample_support"]
    assert support["shape"] == [4, 1] and support["dtype"] == "int32"
    # without return_sample_support the request is SkyRL's handler's
    body["return_sample_support"] = False
    body["sampling_params"]["logprobs"] = 1
    r = requests.post(f"{skyrl_server.url}/skyrl/v1/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["rollout_sample_support"] is None and len(choice["logprobs"]["content"]) == 4


@pytest.mark.skyrl
def test_a_support_without_a_fixed_width_is_refused_and_the_engine_serves_on(skyrl_server):
    import aiohttp
    with pytest.raises(aiohttp.ClientResponseError) as err:
        _generate(skyrl_server, [PROMPT], dict(temperature=1.0, top_p=0.9, max_tokens=4))
    assert err.value.status == 400
    assert "sampling_params.top_k" in err.value.message and WIDTH_OPTION in err.value.message
    out = _generate(skyrl_server, [PROMPT], dict(temperature=1.0, top_k=4, max_tokens=4))
    assert out["rollout_sample_support"][0].shape == (4, 4)


# -- SkyRL's trainer over the replayed support ------------------------------------


def _bert_padding_stand_in():
    """Test-only stand-in for `flash_attn.bert_padding` (no CPU build of flash-attn):
    its two pure tensor functions, for model_wrapper's module-top import."""
    import torch

    def unpad_input(hidden, attention_mask, unused_mask=None):
        seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)
        indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
        cu = torch.nn.functional.pad(torch.cumsum(seqlens, 0, dtype=torch.int32), (1, 0))
        flat = hidden.reshape(-1, *hidden.shape[2:])
        return flat[indices], indices, cu, int(seqlens.max()), seqlens

    def pad_input(hidden, indices, batch, seqlen):
        out = hidden.new_zeros((batch * seqlen, *hidden.shape[1:]))
        out[indices] = hidden
        return out.reshape(batch, seqlen, *hidden.shape[1:])

    package = types.ModuleType("flash_attn")
    module = types.ModuleType("flash_attn.bert_padding")
    module.pad_input, module.unpad_input = pad_input, unpad_input
    package.bert_padding = module
    return {"flash_attn": package, "flash_attn.bert_padding": module}


@pytest.mark.skyrl
def test_skyrls_trainer_replays_the_engines_logprobs_over_the_support(skyrl_server,
                                                                      monkeypatch):
    import torch
    try:
        import flash_attn.bert_padding  # noqa: F401
    except ImportError:
        for name, module in _bert_padding_stand_in().items():
            monkeypatch.setitem(sys.modules, name, module)
    from skyrl.backends.skyrl_train.workers.model_wrapper import HFModelWrapper
    from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors

    prompts = [PROMPT, [7, 8, 9]]   # two lengths: left padding in SkyRL's batch
    params = dict(temperature=0.8, top_k=8, top_p=0.7, max_tokens=12, seed=11, logprobs=0)
    out = _generate(skyrl_server, prompts, params)
    responses = out["response_ids"]
    (sequences, attention_mask, _, _, loss_mask, rollout_logprobs, _,
     support) = convert_prompts_responses_to_batch_tensors(
        0, prompts, responses, [[0.0] * len(r) for r in responses],
        [[1] * len(r) for r in responses], logprobs=out["response_logprobs"],
        rollout_sample_support=out["rollout_sample_support"])

    model = HFModelWrapper(skyrl_server.model, bf16=False)
    model.eval()
    num_actions = loss_mask.shape[1]
    with torch.no_grad():
        replayed = model(sequences, num_actions, attention_mask,
                         temperature=params["temperature"], sample_support=support,
                         loss_mask=loss_mask, enable_sample_support_replay=True)
        full = model(sequences, num_actions, attention_mask,
                     temperature=params["temperature"])
    active = loss_mask.bool()
    # pi_theta over the exact support equals the engine's processed logprob, token
    # by token (float32 both sides, same weights)
    gap = (replayed - rollout_logprobs)[active].abs().max().item()
    assert gap < 1e-4, f"replayed vs engine logprobs differ by {gap}"
    # over the full vocabulary they do not: the support is what makes them equal
    assert (full - rollout_logprobs)[active].abs().max().item() > 1e-2


@pytest.mark.skyrl
def test_a_servers_fixed_width_pads_every_row_and_bounds_the_top_k(ray_head):
    """`skyrl_sample_support_width` from SkyRL's engine_init_kwargs, through its
    server arguments to the route: rows of that width, a wider top_k refused."""
    import aiohttp
    with _skyrl_server(ray_head + 55, f", {WIDTH_OPTION}: 12") as server:
        params = dict(temperature=1.0, top_k=8, top_p=0.9, max_tokens=8, seed=5)
        out = _generate(server, [PROMPT], params)
        rows = out["rollout_sample_support"][0]
        assert rows.shape == (len(out["response_ids"][0]), 12)
        _, engine_mask = _engine_masks(server, PROMPT, params)
        assert [row[row >= 0].tolist() for row in rows] == engine_mask
        assert (rows[:, 8:] == -1).all()
        with pytest.raises(aiohttp.ClientResponseError) as err:
            _generate(server, [PROMPT], dict(params, top_k=16))
        assert err.value.status == 400 and "top_k=16" in err.value.message


# -- the coverage metric in SkyRL's trainer --------------------------------------------


def _model_wrapper(monkeypatch):
    """SkyRL's model_wrapper module (flash-attn's two padding functions stood in where
    flash-attn is not installed: see `_bert_padding_stand_in`)."""
    import peft  # noqa: F401  (transformers probes flash_attn's spec: before the stand-in)
    import transformers.modeling_utils  # noqa: F401
    try:
        import flash_attn.bert_padding  # noqa: F401
    except ImportError:
        for name, module in _bert_padding_stand_in().items():
            monkeypatch.setitem(sys.modules, name, module)
    return importlib.import_module(adapter.MODEL_WRAPPER)


def _coverage_batch(model, temperature, n=8):
    """Two samples with made-up responses and supports (the token and 1-5 of the
    model's likeliest ids there), one loss-masked out twice, in SkyRL's batch tensors;
    and the direct float64 full-softmax figures over the loss tokens."""
    import torch
    from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors

    g = torch.Generator().manual_seed(0)
    prompts = [PROMPT, [7, 8, 9]]
    responses = [torch.randint(20, 400, (n,), generator=g).tolist() for _ in prompts]
    loss_masks = [[1] * n, [1, 1, 0, 1, 1, 1, 0, 1]]
    supports, want_mass, want_size = [], [], []
    with torch.no_grad():
        for prompt, response, loss in zip(prompts, responses, loss_masks):
            ids = torch.tensor(prompt + response)[None]
            z = model.model(ids).logits[0, len(prompt) - 1:-1].double() / temperature
            top = z.topk(5, dim=-1).indices
            p = torch.softmax(z, dim=-1)
            rows_ids, offsets = [], [0]
            for t, token in enumerate(response):
                size = int(torch.randint(1, 6, (1,), generator=g))
                row = list(dict.fromkeys([token] + top[t, :size].tolist()))
                rows_ids += row
                offsets.append(len(rows_ids))
                if loss[t]:
                    want_mass.append(1.0 - float(p[t, row].sum()))
                    want_size.append(len(row))
            supports.append(support_rows(np.array(rows_ids), np.array(offsets), 6))
    (sequences, attention_mask, _, _, loss_mask, _, _, support) = \
        convert_prompts_responses_to_batch_tensors(
            0, prompts, responses, [[0.0] * n for _ in prompts], loss_masks,
            rollout_sample_support=supports)
    return (sequences, attention_mask, loss_mask, support,
            float(np.mean(want_mass)), float(np.mean(want_size)), len(want_mass))


@pytest.mark.skyrl
def test_replays_coverage_equals_a_direct_full_softmax(monkeypatch):
    """SkyRL's `HFModelWrapper.forward` with replay (its `score_aligned_sample_support`
    patched by the package's site hook) on CPU tensors of the demo model: the coverage
    it adds equals a float64 full softmax of the model's temperature-scaled logits over
    the loss tokens; outside `coverage_sums` nothing is collected."""
    _need_skyrl()
    import torch

    from vllm_sampling_mask import DEMO_MODEL

    wrapper = _model_wrapper(monkeypatch)
    assert getattr(wrapper.score_aligned_sample_support, adapter._MARK, False)
    model = wrapper.HFModelWrapper(DEMO_MODEL, bf16=False)
    model.eval()
    temperature, n = 0.8, 8
    sequences, attention_mask, loss_mask, support, want_mass, want_size, tokens = \
        _coverage_batch(model, temperature, n)
    forward = dict(temperature=temperature, sample_support=support, loss_mask=loss_mask,
                   enable_sample_support_replay=True)
    with torch.no_grad():
        with adapter.coverage_sums() as sums:
            model(sequences, n, attention_mask, **forward)
        model(sequences, n, attention_mask, **forward)     # no collector: no pass
    mass, size, count = sums
    print(f"mass outside {mass / count:.6f} (direct {want_mass:.6f}), size {size / count:.3f}")
    assert count == tokens == 14
    assert abs(mass / count - want_mass) < 1e-5 and 0 < want_mass < 1
    assert abs(size / count - want_size) < 1e-9


class _FSDPStrategyStandIn:
    """Stand-in for the one strategy call `_forward_backward_micro` makes
    (skyrl/backends/skyrl_train/workers/worker.py:1245 `self.strategy.backward`), which
    needs SkyRL's FSDP-wrapped model."""

    def backward(self, loss, model, optimizer):
        loss.backward()


@pytest.mark.skyrl
def test_the_policy_workers_status_carries_the_coverage(monkeypatch):
    """SkyRL's `PolicyWorkerBase._forward_backward_micro` (patched by the site hook)
    with SkyRL's own default trainer configuration, replay on: its status carries the
    two means, equal to the direct float64 figures; VLLM_SAMPLING_MASK_COVERAGE=0 leaves
    them out. The worker is not built (its __init__ joins a Ray job and FSDP): it holds
    the demo model's `HFModelWrapper`, SkyRL's policy loss, an optimizer at learning
    rate 0. `torch.cuda.current_device` answers "cpu" for worker.py:1090
    (`experience.to_device(torch.cuda.current_device())`)."""
    _need_skyrl()
    import torch
    from skyrl.backends.skyrl_train.utils.ppo_utils import PolicyLossRegistry
    from skyrl.train.config.config import SkyRLTrainConfig
    from skyrl.train.dataset.replay_buffer import Experience

    from vllm_sampling_mask import DEMO_MODEL
    from vllm_sampling_mask.config import COVERAGE

    wrapper = _model_wrapper(monkeypatch)
    worker_module = importlib.import_module(adapter.WORKER)
    assert getattr(worker_module.PolicyWorkerBase._forward_backward_micro, adapter._MARK,
                   False)
    model = wrapper.HFModelWrapper(DEMO_MODEL, bf16=False)
    temperature, n = 0.8, 8
    sequences, attention_mask, loss_mask, support, want_mass, want_size, _ = \
        _coverage_batch(model, temperature, n)
    cfg = SkyRLTrainConfig().trainer
    cfg.algorithm.enable_sample_support_replay = True
    cfg.algorithm.temperature = temperature
    worker = object.__new__(worker_module.PolicyWorkerBase)
    worker.cfg, worker.model = cfg, model
    worker.policy_loss_fn = PolicyLossRegistry.get(cfg.algorithm.policy_loss_type)
    worker.strategy = _FSDPStrategyStandIn()
    worker.optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    worker.scheduler = torch.optim.lr_scheduler.LambdaLR(worker.optimizer, lambda step: 1.0)
    worker.mesh_rank = types.SimpleNamespace(dp_size=1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")

    def experience():
        zeros = torch.zeros(loss_mask.shape)
        return Experience(
            sequences=sequences, action_log_probs=zeros, base_action_log_probs=zeros,
            values=None, returns=None, advantages=torch.ones(loss_mask.shape),
            attention_mask=attention_mask, loss_mask=loss_mask,
            response_mask=torch.ones(loss_mask.shape, dtype=torch.long),
            rollout_logprobs=zeros, rollout_expert_indices=None, num_actions=n, info={},
            rollout_sample_support=support)

    status = worker._forward_backward_micro(experience(), 1.0)
    got_mass, got_size = (status[name] for name in adapter.COVERAGE_METRICS)
    print(f"status: mass outside {got_mass:.6f} (direct {want_mass:.6f}), "
          f"size {got_size:.3f}")
    assert abs(got_mass - want_mass) < 1e-5
    assert abs(got_size - want_size) < 1e-9
    monkeypatch.setenv(COVERAGE, "0")
    off = worker._forward_backward_micro(experience(), 1.0)
    assert "policy_loss" in off and not set(adapter.COVERAGE_METRICS) & set(off)


# -- the tied LM head through SkyRL's FSDP2 init -------------------------------------


def _fsdp_step(monkeypatch, retie: bool):
    """SkyRL's own `FSDPStrategy._fsdp_init_model` (its FSDP config, float32, a
    one-rank gloo group and CPU mesh) on the demo model (tied LM head), then one AdamW
    step; also an unsharded tied copy's same step. Returns both models and a batch.
    `_sync_non_persistent_buffers` (fsdp_utils.py:125, :127: `.cuda()` and
    `device="cuda"` in the broadcast of rank 0's buffers) is stood in by a no-op: at
    one rank `_fsdp_init_model` has put rank 0's buffers back before it."""
    import torch
    from skyrl.backends.skyrl_train.distributed import fsdp_utils
    from skyrl.train.config import FSDPConfig
    from skyrl.train.config.config import MixedPrecisionConfig
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from vllm_sampling_mask import DEMO_MODEL

    _model_wrapper(monkeypatch)             # fsdp_strategy imports model_wrapper
    strategy = importlib.import_module(
        "skyrl.backends.skyrl_train.distributed.fsdp_strategy")
    adapter.patch_fsdp_strategy(strategy)   # the site hook's, where the package is installed
    if not retie:                           # the adapter switched off
        monkeypatch.setattr(strategy, "apply_fsdp2", strategy.apply_fsdp2.__wrapped__)
    monkeypatch.setattr(fsdp_utils, "_sync_non_persistent_buffers", lambda model, sd: None)
    torch.manual_seed(0)
    batch = torch.randint(3, 4096, (2, 12))
    models = []
    for sharded in (True, False):
        model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        if sharded:
            fp32 = MixedPrecisionConfig(param_dtype="fp32", reduce_dtype="fp32",
                                        buffer_dtype="fp32")
            owner = types.SimpleNamespace(
                fsdp_config=FSDPConfig(mixed_precision=fp32),
                device_mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",)))
            model = strategy.FSDPStrategy._fsdp_init_model(owner, model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        models.append(model)
    return models, batch


@pytest.fixture
def gloo_rank(monkeypatch):
    """A one-rank gloo process group for SkyRL's FSDP2 init."""
    _need_skyrl()
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.fail("a process group is already initialised in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _head_and_logits(models, batch):
    import torch

    sharded, tied = models
    head = sharded.get_parameter("lm_head.weight").full_tensor()
    embed = sharded.get_parameter("model.embed_tokens.weight").full_tensor()
    with torch.no_grad():
        logits = (sharded(input_ids=batch).logits - tied(input_ids=batch).logits)
    return ((head - embed).abs().max().item(),
            (embed - tied.model.embed_tokens.weight).abs().max().item(),
            logits.abs().max().item())


@pytest.mark.skyrl
def test_skyrls_fsdp2_step_keeps_a_tied_head_tied(monkeypatch, gloo_rank):
    """With `patch_fsdp_strategy` one FSDP2 step of SkyRL's init equals the unsharded
    tied model's: the head is the embedding, which the weight sync delivers."""
    head_vs_embed, embed_vs_tied, logits = _head_and_logits(*_fsdp_step(monkeypatch, True))
    print(f"\nre-tied: head-embed {head_vs_embed}, embed vs tied {embed_vs_tied}, "
          f"logits {logits}")
    assert head_vs_embed == 0.0
    assert embed_vs_tied < 1e-6 and logits < 1e-5


@pytest.mark.skyrl
def test_without_the_fix_skyrls_fsdp2_step_unties_the_head(monkeypatch, gloo_rank):
    """The control: SkyRL's init as shipped trains a head of its own (AdamW moves the
    two apart by about 2 x lr in one step) and its logits leave the tied model's."""
    head_vs_embed, embed_vs_tied, logits = _head_and_logits(*_fsdp_step(monkeypatch, False))
    print(f"\nas shipped: head-embed {head_vs_embed}, embed vs tied {embed_vs_tied}, "
          f"logits {logits}")
    assert head_vs_embed > 1e-4 and logits > 1e-3
