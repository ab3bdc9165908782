"""verl with sampling masks (`vllm_sampling_mask.integrations.verl`), against verl's own code.

The packing tests run everywhere (numpy and torch). The rest need verl (its
environment: requirements/verl-0.9.1-cpu.txt, docs/rl_recipes.md "verl") and are
skipped elsewhere:

- verl's `vLLMHttpServer` as a Ray actor (`num_gpus=0`), the way `vLLMReplica` creates
  it, with a real engine of the demo model (TP 1, float32, enforce_eager, a 1 GiB KV
  cache, `return_sampling_mask` through verl's `engine_kwargs.vllm`), its
  `launch_server` and `generate`: the mask in the sample's `extra_fields` equals the
  engine's own (the same request on the replica's `/inference/v1/generate`);
- verl's `FSDPEngineWithLMHead` built on CPU (gloo, world size 1; `initialize()`, which
  wraps the model in FSDP, is not called), its `prepare_model_inputs` and
  `prepare_model_outputs` on micro-batches made by verl's `list_of_dict_to_tensordict`
  (as the agent loop writes TransferQueue) and split by its `prepare_micro_batches`,
  with the demo model's logits (each sample's own forward, concatenated: what the
  packed varlen forward gives): pi_theta over the support equals the engine's
  processed log-probabilities (ratio 1 within 1e-5 at equal weights), and verl's
  rollout correction reads weights of 1 from them.

No flash-attn stand-in is needed: `verl.workers.engine.fsdp.transformer_impl` imports
without flash-attn.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
import torch

from ray_head import port_block, ray_head

from vllm_sampling_mask.integrations import verl as adapter

pytestmark = pytest.mark.verl

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14]]
# different lengths, so that verl's batches hold them as nested (jagged) tensors
MAX_TOKENS = [12, 9, 11]
# nucleus inside a top-k, at a temperature other than 1
SAMPLING = dict(temperature=0.8, top_k=8, top_p=0.7)


# -- packing (no verl needed) ---------------------------------------------------------


def test_response_rows_are_the_rows_that_predict_each_response_token():
    # two samples packed: 3 prompt + 2 response, then 2 prompt + 3 response
    rows = adapter.response_rows([5, 10], [2, 3])
    assert rows.tolist() == [2, 3, 6, 7, 8]


def test_samples_without_a_mask_get_empty_supports_and_a_wrong_length_is_refused():
    masks = [(np.array([4, 9, 5], np.int32), np.array([0, 2, 3])), None,
             (np.array([1], np.int32), np.array([0, 1]))]
    ids, offsets = adapter._packed_masks(masks, [2, 3, 1])
    assert ids.tolist() == [4, 9, 5, 1]
    assert offsets.tolist() == [0, 2, 3, 3, 3, 3, 4]
    with pytest.raises(ValueError, match="sample 0 has 2 tokens but its response has 3"):
        adapter._packed_masks(masks[:1], [3])
    assert adapter.sample_masks([{"global_steps": 1}, {}]) is None
    assert adapter.sample_masks(np.array([{}, {adapter.MASK_FIELD: masks[0]}]))[1] is masks[0]


def test_support_log_probs_are_taken_over_each_rows_support():
    logits = torch.randn(6, 10, dtype=torch.float64)
    labels = torch.tensor([0, 0, 4, 5, 2, 0])
    temperature = torch.full((6,), 0.5, dtype=torch.float64)
    mask = (np.array([4, 9, 5, 1, 2], np.int32), np.array([0, 2, 3, 5]))
    rows, values = adapter.support_log_probs(logits, labels, temperature, [6], [3], [mask])
    assert rows.tolist() == [2, 3, 4]
    z = logits / 0.5
    want = [z[2, 4] - z[2, [4, 9]].logsumexp(0), z[3, 5] - z[3, 5],
            z[4, 2] - z[4, [1, 2]].logsumexp(0)]
    assert torch.allclose(values, torch.stack(want).to(values.dtype))


# -- verl's server with a real engine -----------------------------------------------


def _need_verl():
    pytest.importorskip("verl", reason="verl is not installed (its environment: "
                        "requirements/verl-0.9.1-cpu.txt, docs/rl_recipes.md 'verl')")


@pytest.fixture(scope="module")
def verl_server():
    _need_verl()
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from vllm_sampling_mask import DEMO_MODEL

    # the V1 runner natively, as verl's server picks it on a CPU host (conftest's
    # defaults are for the interpreted runner)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    with ray_head(ray, size=50, env=env, prefix="verl-ray-"):
        config = RolloutConfig(
            name="vllm", tensor_model_parallel_size=1, dtype="float32", enforce_eager=True,
            enable_sleep_mode=False, load_format="auto", prompt_length=64,
            response_length=16, max_model_len=128, max_num_batched_tokens=256,
            max_num_seqs=8, free_cache_engine=False,
            engine_kwargs={"vllm": {"return_sampling_mask": True,
                                    "kv_cache_memory_bytes": 1 << 30}})
        # as vLLMReplica.launch_servers creates it (a CPU actor here)
        server = ray.remote(vLLMHttpServer).options(num_cpus=1, num_gpus=0).remote(
            config=config, model_config=HFModelConfig(path=DEMO_MODEL),
            rollout_mode=RolloutMode.STANDALONE, workers=[], replica_rank=0, node_rank=0,
            gpus_per_node=1, nnodes=1, cuda_visible_devices="")
        ray.get(server.launch_server.remote(), timeout=600)
        address, port = ray.get(server.get_server_address.remote())
        yield types.SimpleNamespace(actor=server, ray=ray, url=f"http://{address}:{port}",
                                    model=DEMO_MODEL, temperature=SAMPLING["temperature"])
        ray.kill(server)


def _generate(server, prompt, request_id, max_tokens=12, **extra):
    """verl's `vLLMHttpServer.generate`, called as its agent loop calls it."""
    params = dict(SAMPLING, logprobs=True, max_tokens=max_tokens, seed=11, **extra)
    return server.ray.get(server.actor.generate.remote(
        prompt_ids=list(prompt), sampling_params=params, request_id=request_id), timeout=300)


@pytest.fixture(scope="module")
def rollouts(verl_server):
    outs = [_generate(verl_server, p, f"rollout-{i}", n)
            for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
    assert len({len(o.token_ids) for o in outs}) == len(outs)
    return outs


def test_server_returns_the_engines_mask_in_the_samples_extra_fields(verl_server, rollouts):
    import requests

    for prompt, max_tokens, out in zip(PROMPTS, MAX_TOKENS, rollouts):
        ids, offsets = out.extra_fields[adapter.MASK_FIELD]
        assert ids.dtype == np.int32 and offsets.dtype == np.int64
        assert len(offsets) == len(out.token_ids) + 1 and len(out.log_probs) == len(out.token_ids)
        # the same request (same seed) on the replica's own generate route
        r = requests.post(f"{verl_server.url}/inference/v1/generate", timeout=300, json={
            "model": verl_server.model, "token_ids": prompt, "return_sampling_mask": True,
            "sampling_params": dict(SAMPLING, max_tokens=max_tokens, seed=11)})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == list(out.token_ids)
        engine = [ids[offsets[t]:offsets[t + 1]].tolist() for t in range(len(out.token_ids))]
        assert engine == choice["sampling_mask"]
        assert all(tok in row for tok, row in zip(out.token_ids, engine))
    assert any(len(set(r)) > 1 for out in rollouts for r in np.split(
        out.extra_fields[adapter.MASK_FIELD][0], out.extra_fields[adapter.MASK_FIELD][1][1:-1]))


def test_a_request_can_go_without_the_mask(verl_server):
    out = _generate(verl_server, PROMPTS[0], "no-mask",
                    extra_args={"return_sampling_mask": False})
    assert adapter.MASK_FIELD not in out.extra_fields and len(out.token_ids) > 0


# -- verl's training engine on CPU tensors ---------------------------------------------


@pytest.fixture(scope="module")
def verl_engine():
    _need_verl()
    import torch.distributed as dist
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from vllm_sampling_mask import DEMO_MODEL

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port_block(1)}",
                                rank=0, world_size=1)
    try:
        yield FSDPEngineWithLMHead(
            model_config=HFModelConfig(path=DEMO_MODEL), engine_config=FSDPEngineConfig(),
            optimizer_config=FSDPOptimizerConfig(lr=1e-6), checkpoint_config=CheckpointConfig())
    finally:
        if started:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def demo_lm():
    from transformers import AutoModelForCausalLM

    from vllm_sampling_mask import DEMO_MODEL
    return AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()


def _batch(rollouts, temperature, masks=True, remove_padding=True, dynamic_bsz=True):
    """The samples as the V1 agent loop puts them in TransferQueue (one dict each,
    `extra_fields` included), with the trainer's settings on the batch."""
    from verl.utils import tensordict_utils as tu

    fields = []
    for prompt, out in zip(PROMPTS, rollouts):
        extra = dict(out.extra_fields) if masks else {"global_steps": None}
        ids = torch.tensor(list(prompt) + list(out.token_ids))
        fields.append({"prompts": torch.tensor(prompt), "responses": torch.tensor(out.token_ids),
                       "response_mask": torch.ones(len(out.token_ids), dtype=torch.int64),
                       "input_ids": ids, "position_ids": torch.arange(len(ids)),
                       "rollout_log_probs": torch.tensor(out.log_probs),
                       "extra_fields": extra})
    data = tu.list_of_dict_to_tensordict(fields)
    # micro-batches by token count (one sample each packed, two and one padded), or
    # of one sample each
    tu.assign_non_tensor(data, temperature=temperature, use_remove_padding=remove_padding,
                         use_fused_kernels=False, calculate_entropy=True,
                         use_dynamic_bsz=dynamic_bsz)
    if dynamic_bsz:
        tu.assign_non_tensor(data, max_token_len_per_gpu=20 if remove_padding else 40)
    else:
        tu.assign_non_tensor(data, micro_batch_size_per_gpu=1)
    return data


def _log_probs(engine, lm, micro_batch):
    """verl's prepare_model_inputs / the model / prepare_model_outputs (forward_step
    without FSDP): the response log-probabilities per sample."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    _, output_args = engine.prepare_model_inputs(micro_batch)
    with torch.no_grad():
        each = [lm(input_ids=ids[None]).logits[0] for ids in micro_batch["input_ids"].unbind()]
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        logits = torch.cat(each)[None]           # [1, packed tokens, V]
    else:
        logits = torch.nn.utils.rnn.pad_sequence(each, batch_first=True)   # [samples, longest, V]
    out = engine.prepare_model_outputs(CausalLMOutputWithPast(logits=logits),
                                       output_args, micro_batch, None)
    return response_from_nested(out["log_probs"], micro_batch["response_mask"]).unbind()


def _per_sample(engine, lm, data):
    """Each sample's response log-probabilities through verl's micro-batch split."""
    from verl.workers.engine.utils import prepare_micro_batches

    micro_batches, indices = prepare_micro_batches(data, dp_group=None)
    assert len(micro_batches) > 1   # the split (and its reordering) is exercised
    if indices is None:             # fixed-size micro-batches, in order
        starts = np.cumsum([0] + [len(m) for m in micro_batches])
        indices = [range(a, b) for a, b in zip(starts[:-1], starts[1:])]
    found = {}
    for micro_batch, index in zip(micro_batches, indices):
        for i, lp in zip(index, _log_probs(engine, lm, micro_batch)):
            found[i] = lp
    return [found[i] for i in range(len(data))]


@pytest.mark.parametrize("remove_padding, dynamic_bsz", [
    (True, True), (False, True), (True, False), (False, False)],
    ids=["packed", "padded", "packed-fixed", "padded-fixed"])
def test_prepare_model_outputs_takes_pi_theta_over_the_support(verl_server, rollouts,
                                                               verl_engine, demo_lm,
                                                               remove_padding, dynamic_bsz):
    """`use_remove_padding` on and off, `use_dynamic_bsz` on (micro-batches by token
    count) and off (fixed micro-batch size), split by verl's prepare_micro_batches."""
    assert getattr(type(verl_engine).prepare_model_outputs, adapter._MARK, False)
    t = verl_server.temperature
    masked = _per_sample(verl_engine, demo_lm,
                         _batch(rollouts, t, True, remove_padding, dynamic_bsz))
    stock = _per_sample(verl_engine, demo_lm,
                        _batch(rollouts, t, False, remove_padding, dynamic_bsz))
    worst, stock_worst = 0.0, 0.0
    for out, lp, full in zip(rollouts, masked, stock):
        engine_lp = torch.tensor(out.log_probs, dtype=torch.float64)
        ratio = torch.exp(lp.double() - engine_lp)
        worst = max(worst, float((ratio - 1).abs().max()))
        stock_worst = max(stock_worst, float((torch.exp(full.double() - engine_lp) - 1).abs().max()))
    print(f"max |ratio - 1| over the support {worst:.1e}, over the full softmax "
          f"{stock_worst:.3f}")
    assert worst < 1e-5, worst
    assert stock_worst > 1e-2, stock_worst   # the full softmax is not the engine's


def test_the_losss_gradient_reaches_only_each_tokens_support(verl_server, rollouts,
                                                             verl_engine, demo_lm):
    """In training (update_actor) the loss's pi_theta is the spliced log_probs: its
    gradient at a response row is non-zero on that token's support ids only."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from verl.workers.utils.padding import response_from_nested

    data = _batch(rollouts[:2], verl_server.temperature)
    _, output_args = verl_engine.prepare_model_inputs(data)
    with torch.no_grad():
        logits = torch.cat([demo_lm(input_ids=ids[None]).logits[0]
                            for ids in data["input_ids"].unbind()])[None]
    logits.requires_grad_(True)
    out = verl_engine.prepare_model_outputs(CausalLMOutputWithPast(logits=logits),
                                            output_args, data, None)
    response_from_nested(out["log_probs"], data["response_mask"]).values().sum().backward()
    grad = logits.grad[0]
    ends = data["input_ids"].offsets()[1:].tolist()
    masks = [r.extra_fields[adapter.MASK_FIELD] for r in rollouts[:2]]
    rows = adapter.response_rows(ends, [len(offsets) - 1 for _, offsets in masks])
    supports = [ids[offsets[t]:offsets[t + 1]].tolist()
                for ids, offsets in masks for t in range(len(offsets) - 1)]
    assert len(rows) == len(supports)
    for t, (row, support) in enumerate(zip(rows, supports)):
        nonzero = set(torch.nonzero(grad[row]).flatten().tolist())
        assert nonzero <= set(support) and (len(support) == 1 or nonzero), (t, nonzero, support)
    others = torch.ones(grad.shape[0], dtype=torch.bool)
    others[torch.as_tensor(rows)] = False
    assert not grad[others].any()


def test_rollout_correction_reads_the_masked_old_log_probs(verl_server, rollouts,
                                                           verl_engine, demo_lm):
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    def weights(old):
        width = max(len(o.token_ids) for o in rollouts)
        pad = lambda rows: torch.stack([torch.nn.functional.pad(r.float(), (0, width - len(r)))
                                        for r in rows])
        response_mask = pad([torch.ones(len(o.token_ids)) for o in rollouts])
        batch = DataProto(batch=TensorDict({
            "old_log_probs": pad(old),
            "rollout_log_probs": pad([torch.tensor(o.log_probs) for o in rollouts]),
            "response_mask": response_mask}, batch_size=[len(rollouts)]))
        config = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
        batch, _ = compute_rollout_correction_and_add_to_batch(batch, config)
        return batch.batch["rollout_is_weights"][response_mask.bool()]

    masked = _per_sample(verl_engine, demo_lm, _batch(rollouts, verl_server.temperature))
    stock = _per_sample(verl_engine, demo_lm,
                        _batch(rollouts, verl_server.temperature, masks=False))
    on_support, full = weights(masked), weights(stock)
    print(f"rollout_is_weights: over the support {float(on_support.min()):.6f}.."
          f"{float(on_support.max()):.6f}, full softmax {float(full.min()):.3f}.."
          f"{float(full.max()):.3f}")
    assert torch.allclose(on_support, torch.ones(1), atol=1e-5)
    assert (full - 1).abs().max() > 1e-2


def test_fused_kernels_are_refused_by_name(verl_server, rollouts, verl_engine):
    from verl.utils import tensordict_utils as tu

    data = _batch(rollouts, verl_server.temperature)
    tu.assign_non_tensor(data, use_fused_kernels=True)
    with pytest.raises(ValueError, match="use_fused_kernels=False"):
        verl_engine.prepare_model_outputs(types.SimpleNamespace(logits=None), {}, data, None)


# -- verl's multi-turn tool agent loop --------------------------------------------------


@pytest.fixture(scope="module")
def tool_loop_output(verl_server):
    """verl's `ToolAgentLoop.run` for one sample, three assistant turns with a tool
    turn between each, against the real server through verl's `LLMServerClient` and
    `GlobalRequestLoadBalancer`. The tool parser (registered in verl's ToolParser
    registry) asks for a tool after every turn, since the demo model writes no tool
    calls; verl answers each with its "Unknown function" tool message."""
    import asyncio
    import sys

    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from vllm_sampling_mask import DEMO_MODEL

    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import verl_cpu

    @ToolParser.register("every_turn")
    class EveryTurn(ToolParser):
        async def extract_tool_calls(self, responses_ids, tools=None):
            return self.tokenizer.decode(responses_ids), [FunctionCall(name="lookup",
                                                                      arguments="{}")]

    config = verl_cpu.compose([
        f"actor_rollout_ref.model.path={DEMO_MODEL}", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=every_turn",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "data.max_prompt_length=64", "data.max_response_length=64"])
    balancer = verl_server.ray.remote(GlobalRequestLoadBalancer).remote(
        servers={"0": verl_server.actor})
    tokenizer = hf_tokenizer(DEMO_MODEL)

    async def run():   # the loop is built inside the event loop, as verl's worker does
        loop = ToolAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=LLMServerClient(config, load_balancer_handle=balancer),
            tokenizer=tokenizer, processor=None, dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        return await loop.run(dict(SAMPLING, logprobs=True, max_tokens=6),
                              raw_prompt=[{"role": "user", "content": "hello"}])

    output = asyncio.run(run())
    verl_server.ray.kill(balancer)
    return output, config


def test_tool_agent_loop_carries_every_turns_mask_and_empty_rows_between(tool_loop_output):
    output, _ = tool_loop_output
    ids, offsets = output.extra_fields[adapter.MASK_FIELD]
    n = len(output.response_ids)
    assert len(offsets) == n + 1 and len(output.response_mask) == n
    rows = [ids[offsets[t]:offsets[t + 1]].tolist() for t in range(n)]
    generated = [t for t in range(n) if output.response_mask[t] == 1]
    between = [t for t in range(n) if output.response_mask[t] == 0]
    assert output.num_turns >= 5 and between   # assistant, tool, assistant, tool, assistant
    assert generated[-1] > between[0]          # tokens generated after a tool turn
    for t in generated:
        assert output.response_ids[t] in rows[t], (t, rows[t])
    assert all(rows[t] == [] for t in between)


def test_tool_agent_loop_samples_pi_theta_over_the_support_is_the_engines(
        tool_loop_output, rollouts, verl_engine, demo_lm):
    """The multi-turn sample through verl's trainer-side function, packed with a
    single-turn one: at every generated token (after tool turns too), pi_theta over
    its support equals the engine's processed log-probability; the rows between turns
    keep the full softmax."""
    from verl.utils import tensordict_utils as tu

    output, _ = tool_loop_output
    samples = [(list(output.prompt_ids), list(output.response_ids),
                list(output.response_mask), dict(output.extra_fields))]
    samples += [(list(p), list(o.token_ids), [1] * len(o.token_ids), dict(o.extra_fields))
                for p, o in zip(PROMPTS, rollouts)]
    fields = []
    for prompt, response, response_mask, extra in samples:
        ids = torch.tensor(prompt + response)
        fields.append({"prompts": torch.tensor(prompt), "responses": torch.tensor(response),
                       "response_mask": torch.tensor(response_mask, dtype=torch.int64),
                       "input_ids": ids, "position_ids": torch.arange(len(ids)),
                       "extra_fields": extra})
    assert len({len(f["input_ids"]) for f in fields}) > 1   # held as nested tensors
    data = tu.list_of_dict_to_tensordict(fields)
    tu.assign_non_tensor(data, temperature=SAMPLING["temperature"], use_remove_padding=True,
                         use_fused_kernels=False, calculate_entropy=True)
    lp = _log_probs(verl_engine, demo_lm, data)[0]
    generated = torch.tensor(output.response_mask, dtype=torch.bool)
    engine_lp = torch.tensor(output.response_logprobs, dtype=torch.float64)
    ratio = torch.exp(lp.double() - engine_lp)[generated]
    print(f"tool agent loop: {int(generated.sum())} generated tokens of "
          f"{len(output.response_ids)}, "
          f"max |ratio - 1| {float((ratio - 1).abs().max()):.1e}")
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)


def test_turn_masks_follow_each_kept_merges_edits_of_the_response():
    """`TurnMasks` on verl's `MergeResult`s: a trimmed prefix drops rows from the end,
    boundary and context tokens add empty rows, generated tokens their supports; a
    merge verl does not keep (its response_mask not stored) changes nothing."""
    _need_verl()
    from verl.utils.tokenizer.continuous_token import MergeResult

    turns = adapter.TurnMasks()
    agent = types.SimpleNamespace(response_mask=[])

    def turn(mask_rows, result, kept=True, assistant=True):
        if assistant:
            ids = np.concatenate([np.array(r, np.int32) for r in mask_rows])
            offsets = np.concatenate([[0], np.cumsum([len(r) for r in mask_rows])])
            turns.generated(types.SimpleNamespace(extra_fields={
                adapter.MASK_FIELD: (ids, offsets.astype(np.int64))}))
        aligned = list(range(len(turns.rows) + 10))   # stands for verl's new response_mask
        turns.merged((result, aligned, None), assistant)
        if kept:
            agent.response_mask = aligned
        turns.commit(agent)

    turn([[5, 6], [7]], MergeResult(token_ids=[], appended_token_count=2, kind="assistant"))
    turn(None, MergeResult(token_ids=[], appended_token_count=3, kind="context",
                           inserted_token_ids=[1], removed_prefix_token_count=1),
         assistant=False)
    turn([[9]], MergeResult(token_ids=[], appended_token_count=1, kind="assistant",
                            inserted_token_ids=[2, 3]))
    turn(None, MergeResult(token_ids=[], appended_token_count=4, kind="context"),
         kept=False, assistant=False)
    assert [r.tolist() for r in turns.rows] == [[5, 6], [], [], [], [], [], [], [9]]
    out = turns.finish(types.SimpleNamespace(response_ids=list(range(7)), extra_fields={}))
    ids, offsets = out.extra_fields[adapter.MASK_FIELD]
    assert ids.tolist() == [5, 6] and offsets.tolist() == [0, 2, 2, 2, 2, 2, 2, 2]
    bad = MergeResult(token_ids=[], appended_token_count=2, kind="assistant")
    with pytest.raises(ValueError, match="appended 2 tokens for a turn whose engine mask has 1"):
        turn([[4]], bad)


# -- the coverage metric in forward_backward_batch's metrics ---------------------------


def _coverage_batch(lm, seed=0):
    """The samples with made-up responses and supports (the token and 1-5 of the
    model's most likely ids there, so the support holds a share of the mass; every
    fourth token none), fixed micro-batches of one sample, packed."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    fields, masks = [], []
    for k, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        response = torch.randint(20, 400, (n,), generator=g)
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor(prompt + response.tolist())[None]).logits[0]
        top = logits[len(prompt) - 1:].topk(5, dim=-1).indices
        ids, offsets = [], [0]
        for t, token in enumerate(response.tolist()):
            if (t + k) % 4 != 3:        # every fourth token: no support (full softmax)
                size = int(torch.randint(1, 6, (1,), generator=g))
                ids += list(dict.fromkeys([token] + top[t, :size].tolist()))
            offsets.append(len(ids))
        mask = (np.array(ids, np.int32), np.array(offsets, np.int64))
        masks.append(mask)
        input_ids = torch.tensor(prompt + response.tolist())
        fields.append({"prompts": torch.tensor(prompt), "responses": response,
                       "response_mask": torch.ones(n, dtype=torch.int64),
                       "loss_mask": torch.ones(n, dtype=torch.int64),
                       "input_ids": input_ids, "position_ids": torch.arange(len(input_ids)),
                       "extra_fields": {adapter.MASK_FIELD: mask}})
    data = tu.list_of_dict_to_tensordict(fields)
    tu.assign_non_tensor(data, temperature=0.8, use_remove_padding=True,
                         use_fused_kernels=False, calculate_entropy=True,
                         use_dynamic_bsz=False, micro_batch_size_per_gpu=1)
    return data, masks


def _direct_coverage(logits_per_sample, masks, temperature):
    """The mean over tokens with a support of 1 - sum_{v in S} softmax(z / T)[v], and
    the mean support size, in float64 from each sample's response rows."""
    mass, sizes = [], []
    for logits, (ids, offsets), prompt in zip(logits_per_sample, masks, PROMPTS):
        n = len(offsets) - 1
        p = torch.softmax(logits.double()[len(prompt) - 1:len(prompt) - 1 + n] / temperature,
                          dim=-1)
        for t in range(n):
            support = ids[offsets[t]:offsets[t + 1]]
            if len(support):
                mass.append(1.0 - float(p[t, torch.as_tensor(support, dtype=torch.long)].sum()))
                sizes.append(len(support))
    return float(np.mean(mass)), float(np.mean(sizes))


def test_coverage_metric_equals_a_direct_full_softmax_and_the_option_turns_it_off(
        verl_engine, demo_lm, monkeypatch):
    """verl's forward_backward_batch (forward only) over three micro-batches: its
    `metrics` hold the two coverage `Metric`s, whose aggregate is the token mean of a
    float64 full softmax of the very logits the model returned; with
    VLLM_SAMPLING_MASK_COVERAGE=0 they are absent. `engine.module` is the bare demo
    model (what `initialize()` would wrap in FSDP, not run on this CPU host)."""
    from vllm_sampling_mask.config import COVERAGE

    assert getattr(type(verl_engine).forward_step, adapter._MARK, False)
    if not torch.cuda.is_available():
        # verl's device calls (`get_device_id()`, `get_device_name()` in
        # forward_backward_batch / forward_step, transformer_impl.py:1552, 1582) name
        # CUDA here: the CPU host's platform of examples/verl_cpu_host.py answers them
        import sys

        from verl.plugin.platform import platform_manager
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
        try:
            import verl_cpu_host
        finally:
            sys.path.pop(0)
        monkeypatch.setattr(platform_manager, "_current_platform", verl_cpu_host.PlatformCPU())
    monkeypatch.setattr(verl_engine, "module", demo_lm, raising=False)
    monkeypatch.setattr(verl_engine, "_autocast_dtype", torch.float32, raising=False)
    seen = []
    data, masks = _coverage_batch(demo_lm)
    handle = demo_lm.register_forward_hook(lambda m, a, out: seen.append(out.logits[0]))
    try:
        out = verl_engine.forward_backward_batch(data, loss_function=None, forward_only=True)
        assert len(seen) == len(PROMPTS)       # one micro-batch per sample, in order
        mass, size = _direct_coverage(seen, masks, 0.8)
        logged = out["metrics"]
        got_mass = logged[adapter.COVERAGE_METRICS[0]].aggregate()
        got_size = logged[adapter.COVERAGE_METRICS[1]].aggregate()
        print(f"mass outside {got_mass:.6f} (direct {mass:.6f}), size {got_size:.3f}")
        assert abs(got_mass - mass) < 1e-5 and 0.0 < mass < 1.0
        assert abs(got_size - size) < 1e-9
        monkeypatch.setenv(COVERAGE, "0")
        data, _ = _coverage_batch(demo_lm)
        out = verl_engine.forward_backward_batch(data, loss_function=None, forward_only=True)
        assert not set(adapter.COVERAGE_METRICS) & set(out["metrics"])
        monkeypatch.setenv(COVERAGE, "maybe")
        with pytest.raises(ValueError, match=f"{COVERAGE} must be 1 .* or 0"):
            verl_engine.forward_backward_batch(_coverage_batch(demo_lm)[0], loss_function=None,
                                               forward_only=True)
    finally:
        handle.remove()
