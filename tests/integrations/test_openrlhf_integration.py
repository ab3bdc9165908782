"""OpenRLHF with sampling masks (`vllm_sampling_mask.integrations.openrlhf`), against
OpenRLHF's own code.

The row helpers run everywhere (numpy and torch). The rest need OpenRLHF (its
environment: requirements/openrlhf-0.11.2-cpu.txt, docs/rl_recipes.md "OpenRLHF") and
are skipped elsewhere:

- OpenRLHF's `RolloutRayActor` as a Ray actor (`num_gpus=0`; `create_vllm_engines`
  asks for GPU bundles, which a CPU host never has) with a real engine of the demo
  model (float32, enforce_eager, a 1 GiB KV cache, processed logprobs as OpenRLHF sets
  them with `--algo.advantage.is_correction_level`), the Ray job's runtime
  environment from `adapter.runtime_env()` (the launcher's): its
  `generate_responses`, run by OpenRLHF's `SingleTurnAgentExecutor`, returns one
  support per generated token equal to the engine's own (the same seeded request
  on the actor's `generate`); OpenRLHF's `_process_response_into_experience`,
  `Experience.concat_experiences`, `split_experience_batch` and
  `make_experience_batch` carry it;
- OpenRLHF's `Actor` (the demo model loaded by `Actor.__init__`, float32, eager
  attention) and `PolicyLoss` on CPU tensors: with the masks, the old
  log-probabilities equal the engine's processed log-probabilities (ratio 1 within
  1e-5 at equal weights, the correction's `vllm_kl` 0); without them (OpenRLHF as
  shipped) they do not.

`PolicyModelActor.forward`, `ReferenceModelActor.forward` and `training_step` hand the
masks to `Actor.forward` (`masks_for_forward`, tested below); they run in OpenRLHF's
whole loop in tests/integrations/test_openrlhf_loop.py.

A test-only stand-in of flash-attn (tests/flash_attn_stand_in.py):
`openrlhf.models.actor` imports `flash_attn.bert_padding` and
`flash_attn.utils.distributed` at module top (for packed samples), and flash-attn
does not build without CUDA; the stand-in holds those pure tensor functions only.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pytest
import torch

import flash_attn_stand_in
from ray_head import ray_head

from vllm_sampling_mask.integrations import openrlhf as adapter

pytestmark = pytest.mark.openrlhf

PROMPTS = ["The cat sat on the", "Once upon a time", "1 2 3 4"]
MAX_TOKENS = [12, 9, 11]
SAMPLING = dict(temperature=0.8, top_k=8, top_p=0.7)
MAX_LEN = 128


# -- rows (no OpenRLHF needed) ----------------------------------------------------------


def test_observation_rows_put_each_requests_mask_on_its_action_range():
    first = (np.array([4, 9, 5], np.int32), np.array([0, 2, 3]))
    second = (np.array([7, 1], np.int32), np.array([0, 1, 2]))
    # 3 prompt tokens, 2 generated, 1 environment token, 2 generated
    ids, offsets = adapter.observation_rows(8, [(3, 5), (6, 8)], [first, second])
    rows = [ids[offsets[t]:offsets[t + 1]].tolist() for t in range(8)]
    assert rows == [[], [], [], [4, 9], [5], [], [7], [1]]
    with pytest.raises(ValueError, match="2 action ranges but made 1 engine requests"):
        adapter.observation_rows(8, [(3, 5), (6, 8)], [first])
    with pytest.raises(ValueError, match=r"action range 0 \(3, 6\) .* 2 generated tokens"):
        adapter.observation_rows(8, [(3, 6)], [first])


def test_action_rows_cut_like_the_action_mask():
    rows = (np.array([4, 9, 5, 7], np.int32), np.array([0, 0, 2, 3, 4]))
    ids, offsets = adapter.action_rows(rows, 1, 3)
    assert ids.tolist() == [4, 9, 5] and offsets.tolist() == [0, 2, 3]
    ids, offsets = adapter.action_rows(rows, 1, 100)   # max_len past the end
    assert offsets.tolist() == [0, 2, 3, 4]


def test_support_log_probs_over_each_rows_support_full_softmax_without_one():
    logits = torch.randn(2, 4, 10, dtype=torch.float64)
    sequences = torch.tensor([[0, 4, 5, 2], [1, 3, 3, 0]])
    masks = [(np.array([4, 9, 5, 1], np.int32), np.array([0, 2, 3, 3])), None]
    values = adapter.support_log_probs(logits, sequences, masks, 3)
    z = logits
    want = [[z[0, 0, 4] - z[0, 0, [4, 9]].logsumexp(0), z[0, 1, 5] - z[0, 1, 5],
             z[0, 2, 2] - z[0, 2].logsumexp(0)],
            [z[1, j, sequences[1, j + 1]] - z[1, j].logsumexp(0) for j in range(3)]]
    assert torch.allclose(values, torch.tensor(want, dtype=values.dtype))


def test_packed_support_log_probs_read_the_same_rows_at_the_attended_tokens():
    """OpenRLHF's packed layout: the logits of the attended tokens only, row-major in
    one row; padding columns read 0."""
    logits = torch.randn(2, 5, 10, dtype=torch.float64)
    sequences = torch.tensor([[0, 4, 5, 0, 0], [1, 3, 3, 7, 6]])
    attention = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    masks = [(np.array([4, 9, 5, 0, 2, 8], np.int32), np.array([0, 2, 3, 6])),
             (np.array([3, 1], np.int32), np.array([0, 0, 2]))]
    padded = adapter.support_log_probs(logits, sequences, masks, 4)
    packed_logits = logits.reshape(10, 10)[attention.flatten().bool()].unsqueeze(0)
    packed = adapter.packed_support_log_probs(packed_logits, sequences, attention, masks, 4)
    keep = attention[:, :4].bool()          # column j: predicted at token j
    assert torch.allclose(packed[keep], padded[keep])
    assert packed[0, 3] == 0                # token 3 of sample 0 is padding
    with pytest.raises(ValueError, match="--ds.ring_attn_size 1"):
        adapter.packed_support_log_probs(packed_logits[:, :5], sequences, attention,
                                         masks, 4)


def test_packed_coverage_reads_the_same_rows_as_the_padded_one():
    """The coverage grids of both layouts agree at the attended columns and equal a
    float64 full softmax outside each support; columns without one read 0."""
    logits = torch.randn(2, 5, 10, dtype=torch.float64)
    sequences = torch.tensor([[0, 4, 5, 0, 0], [1, 3, 3, 7, 6]])
    attention = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    masks = [(np.array([4, 9, 5, 0, 2, 8], np.int32), np.array([0, 2, 3, 6])),
             (np.array([3, 1], np.int32), np.array([0, 0, 2]))]
    _, (mass, sizes) = adapter.support_log_probs(logits, sequences, masks, 4, coverage=True)
    packed_logits = logits.reshape(10, 10)[attention.flatten().bool()].unsqueeze(0)
    _, (pmass, psizes) = adapter.packed_support_log_probs(packed_logits, sequences,
                                                          attention, masks, 4, coverage=True)
    keep = attention[:, :4].bool()
    assert torch.allclose(pmass[keep], mass[keep]) and torch.equal(psizes[keep], sizes[keep])
    p = torch.softmax(logits, dim=-1)
    assert sizes.tolist() == [[2, 1, 3, 0], [0, 2, 0, 0]]
    assert abs(float(mass[0, 0]) - (1 - float(p[0, 0, [4, 9]].sum()))) < 1e-12
    assert abs(float(mass[1, 1]) - (1 - float(p[1, 1, [3, 1]].sum()))) < 1e-12
    assert float(mass[0, 3]) == 0.0 and float(mass[1, 0]) == 0.0


# -- OpenRLHF's rollout actor with a real engine ----------------------------------------


def _need_openrlhf():
    pytest.importorskip("openrlhf", reason="OpenRLHF is not installed (its environment: "
                        "requirements/openrlhf-0.11.2-cpu.txt, docs/rl_recipes.md 'OpenRLHF')")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from vllm_sampling_mask import DEMO_MODEL
    return AutoTokenizer.from_pretrained(DEMO_MODEL)


@pytest.fixture(scope="module")
def rollout_actor():
    _need_openrlhf()
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    adapter.install()
    import vllm  # noqa: F401  (the overlay's vLLM first, as OpenRLHF imports it)
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    from vllm_sampling_mask import DEMO_MODEL

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    with ray_head(ray, size=50, env=env, prefix="openrlhf-ray-",
                  runtime_env=adapter.runtime_env()):
        # create_vllm_engines' arguments, with float32 and a KV cache size for a CPU
        # host, and no GPU (it would place the actor in a GPU bundle)
        actor = RolloutRayActor.options(num_cpus=1, num_gpus=0).remote(
            model=DEMO_MODEL, enforce_eager=True, tensor_parallel_size=1, seed=0,
            distributed_executor_backend="uni", max_model_len=MAX_LEN,
            enable_prefix_caching=False, dtype="float32", trust_remote_code=True,
            full_determinism=False, kv_cache_memory_bytes=1 << 30, bundle_indices=None,
            num_gpus=0, enable_sleep_mode=False, agent_func_path=None, remote_rm_url=None,
            mm_pad_token_ids=set(), logprobs_mode="processed_logprobs", max_logprobs=1)
        ray.get(actor.get_num_unfinished_requests.remote(), timeout=600)
        yield types.SimpleNamespace(actor=actor, ray=ray)
        ray.kill(actor)


def test_the_launcher_runs_openrlhfs_train_ppo_ray_as_main(rollout_actor, capsys):
    """The launcher hands its arguments to OpenRLHF's own CLI (here `--help`, which
    stops after argparse; a training run needs GPU bundles) in a process connected to
    Ray, so OpenRLHF's `train` keeps the job's runtime environment."""
    import sys

    flash_attn_stand_in.install()
    argv = list(sys.argv)
    with pytest.raises(SystemExit) as stop:
        adapter.main(["--help"])
    sys.argv = argv
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--train.agent_func_path" in out and "--algo.advantage.is_correction_level" in out
    env = adapter.runtime_env()
    assert env["env_vars"]["VLLM_SAMPLING_MASK_RETURN"] == "1"
    assert env["worker_process_setup_hook"] == "vllm_sampling_mask.integrations.openrlhf.install"


def _params(max_tokens, seed, **extra):
    from vllm import SamplingParams

    # SamplesGenerator._dispatch_prompts_to_vllm's parameters (logprobs=1: the
    # correction is on), with a seed so that a request can be repeated
    return SamplingParams(**SAMPLING, max_tokens=max_tokens, min_tokens=1,
                          skip_special_tokens=False, logprobs=1, seed=seed, **extra)


@pytest.fixture(scope="module")
def responses(rollout_actor, tokenizer):
    ray = rollout_actor.ray
    return [ray.get(rollout_actor.actor.generate_responses.remote(
        prompt=p, label="", sampling_params=_params(n, 11 + i), max_length=MAX_LEN,
        hf_tokenizer=tokenizer, num_samples=1), timeout=300)[0]
        for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]


def _rows(pair):
    ids, offsets = pair
    return [ids[offsets[t]:offsets[t + 1]].tolist() for t in range(len(offsets) - 1)]


def test_rollout_actor_returns_the_engines_mask_one_support_per_generated_token(
        rollout_actor, responses, tokenizer):
    ray = rollout_actor.ray
    for i, (prompt, n, out) in enumerate(zip(PROMPTS, MAX_TOKENS, responses)):
        (start, end), = out["action_ranges"]
        rows = _rows(out[adapter.MASK_KEY])
        assert len(rows) == len(out["observation_tokens"]) == end
        assert all(r == [] for r in rows[:start])              # prompt tokens
        prompt_ids = out["observation_tokens"][:start]
        # the same seeded request on the actor's own generate, mask asked directly
        engine = ray.get(rollout_actor.actor.generate.remote(
            prompt_ids, _params(n, 11 + i, extra_args={"return_sampling_mask": True})),
            timeout=300).outputs[0]
        assert list(engine.token_ids) == out["observation_tokens"][start:end]
        assert rows[start:end] == [engine.sampling_mask.ids[
            engine.sampling_mask.offsets[t]:engine.sampling_mask.offsets[t + 1]].tolist()
            for t in range(len(engine.token_ids))]
        assert all(tok in row for tok, row in zip(engine.token_ids, rows[start:end]))
    assert any(len(r) > 1 for out in responses for r in _rows(out[adapter.MASK_KEY]))


def test_a_greedy_request_gets_empty_rows_and_is_served(rollout_actor, tokenizer):
    from vllm import SamplingParams

    out, = rollout_actor.ray.get(rollout_actor.actor.generate_responses.remote(
        prompt=PROMPTS[0], label="", max_length=MAX_LEN, hf_tokenizer=tokenizer,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=6, logprobs=1),
        num_samples=1), timeout=300)
    (start, end), = out["action_ranges"]
    assert end > start
    assert _rows(out[adapter.MASK_KEY]) == [[]] * end   # no mask: the full softmax


def _experiences(responses):
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    generator = object.__new__(SamplesGenerator)   # the method reads no state
    return [generator._process_response_into_experience(r, max_len=MAX_LEN)
            for r in responses]


def test_the_mask_reaches_the_experience_and_survives_openrlhfs_batching(responses):
    from openrlhf.trainer.ppo_utils.experience import (Experience, make_experience_batch,
                                                       split_experience_batch)

    experiences = _experiences(responses)
    for exp, out in zip(experiences, responses):
        (start, end), = out["action_ranges"]
        mask, = exp.sampling_mask
        rows = _rows(mask)
        action = exp.action_mask[0].tolist()
        assert len(rows) == len(action)                       # one row per action column
        assert [bool(r) for r in rows] == [bool(a) for a in action]
        assert rows == _rows(out[adapter.MASK_KEY])[1:]
        assert sum(action) == end - start                     # one per generated token
    batch = Experience.concat_experiences(experiences, pad_token_id=0)
    assert len(batch.sampling_mask) == len(experiences)
    items = split_experience_batch(batch)
    rebuilt = make_experience_batch(items)
    for got, exp in zip(rebuilt.sampling_mask, experiences):
        assert _rows(got) == _rows(exp.sampling_mask[0])


# -- OpenRLHF's Actor and PolicyLoss on CPU tensors -------------------------------------


@pytest.fixture(scope="module")
def actor():
    _need_openrlhf()
    flash_attn_stand_in.install()
    adapter.install()
    import openrlhf.utils.utils as ou
    from openrlhf.models.actor import Actor

    from vllm_sampling_mask import DEMO_MODEL

    # Actor.__init__ takes "bf16" or "fp16" only; float32 here, as the engine runs
    original = ou.convert_to_torch_dtype
    ou.convert_to_torch_dtype = lambda name: torch.float32
    try:
        model = Actor(DEMO_MODEL, attn_implementation="eager", param_dtype="bf16",
                      temperature=SAMPLING["temperature"])
    finally:
        ou.convert_to_torch_dtype = original
    assert model.model.dtype == torch.float32
    return model.eval()


@pytest.fixture(scope="module")
def batch(responses):
    from openrlhf.trainer.ppo_utils.experience import Experience

    return Experience.concat_experiences(_experiences(responses), pad_token_id=0)


def _ratio(log_probs, batch):
    keep = batch.action_mask.bool()
    return (log_probs - batch.rollout_log_probs)[keep].exp()


def test_old_log_probs_over_the_support_equal_the_engines_and_stock_do_not(actor, batch):
    from openrlhf.models.loss import PolicyLoss

    with torch.no_grad():
        with adapter.masks_for_forward(batch.sampling_mask):
            masked = actor(batch.sequences, batch.action_mask, batch.attention_mask)
        stock = actor(batch.sequences, batch.action_mask, batch.attention_mask)
    ratio = _ratio(masked, batch)
    assert ratio.numel() == int(batch.action_mask.sum())
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), ratio
    stock_ratio = _ratio(stock, batch)
    assert (stock_ratio - 1).abs().max() > 1e-2, stock_ratio    # OpenRLHF as shipped
    print(f"\nOpenRLHF Actor.forward, {ratio.numel()} action tokens: largest |ratio - 1| "
          f"{float((ratio - 1).abs().max()):.2g} over the support, "
          f"{float((stock_ratio - 1).abs().max()):.2g} over the full softmax "
          f"(stock ratios {float(stock_ratio.min()):.3g} to {float(stock_ratio.max()):.3g})")
    # the same through the explicit argument
    with torch.no_grad():
        direct = actor(batch.sequences, batch.action_mask, batch.attention_mask,
                       sampling_mask=batch.sampling_mask)
    assert torch.equal(direct, masked)

    loss_fn = PolicyLoss(is_correction_level="token", is_correction_mode="mask")
    advantages = torch.ones_like(masked)
    _, _, _, vllm_kl, filtered = loss_fn(masked, masked, advantages,
                                         action_mask=batch.action_mask,
                                         rollout_log_probs=batch.rollout_log_probs)
    assert abs(float(vllm_kl)) < 1e-6 and float(filtered) == 0.0
    _, _, _, stock_kl, _ = loss_fn(stock, stock, advantages, action_mask=batch.action_mask,
                                   rollout_log_probs=batch.rollout_log_probs)
    assert abs(float(stock_kl)) > 1e-3
    print(f"PolicyLoss vllm_kl: {float(vllm_kl):.2g} with masks, {float(stock_kl):.2g} without")


def test_the_loss_gradient_reaches_only_each_tokens_support(actor, batch):
    from openrlhf.models.loss import PolicyLoss

    with torch.no_grad():
        with adapter.masks_for_forward(batch.sampling_mask):
            old = actor(batch.sequences, batch.action_mask, batch.attention_mask)
    captured = {}

    def keep_logits(module, args, output):   # returns None: the output is unchanged
        captured["logits"] = output["logits"]

    handle = actor.model.register_forward_hook(keep_logits)
    try:
        with adapter.masks_for_forward(batch.sampling_mask):
            new = actor(batch.sequences, batch.action_mask, batch.attention_mask)
    finally:
        handle.remove()
    logits = captured["logits"]
    logits.retain_grad()
    loss, *_ = PolicyLoss()(new, old, torch.ones_like(new), action_mask=batch.action_mask)
    loss.backward()
    grad = logits.grad
    for b, mask in enumerate(batch.sampling_mask):
        for j, row in enumerate(_rows(mask)):
            nonzero = torch.nonzero(grad[b, j]).flatten().tolist()
            assert set(nonzero) <= set(row), (b, j)
            if len(row) > 1:
                assert nonzero, (b, j)


def test_packed_samples_take_the_same_log_probs_over_the_support(actor, batch):
    """`--ds.packing_samples`: OpenRLHF's `Actor.forward` unpads the batch into one row
    (`unpad_and_slice_tensor`, position ids restarting per sample) and pads the
    log-probabilities back; with the masks each action token's log-probability is
    taken over its support there too, equal to the padded layout's and the engine's,
    and the gradient reaches the support ids only."""
    from openrlhf.models.loss import PolicyLoss

    with torch.no_grad():
        padded = actor(batch.sequences, batch.action_mask, batch.attention_mask,
                       sampling_mask=batch.sampling_mask)
    captured = {}

    def keep_logits(module, args, output):   # the first forward's: the masked one
        captured.setdefault("logits", output["logits"])

    actor.packing_samples = True
    handle = actor.model.register_forward_hook(keep_logits)
    try:
        packed = actor(batch.sequences, batch.action_mask, batch.attention_mask,
                       sampling_mask=batch.sampling_mask)
        with torch.no_grad():
            stock = actor(batch.sequences, batch.action_mask, batch.attention_mask)
        with pytest.raises(ValueError, match="--ds.ring_attn_size 1"):
            actor(batch.sequences, batch.action_mask, batch.attention_mask,
                  ring_attn_group=object(), sampling_mask=batch.sampling_mask)
    finally:
        handle.remove()
        actor.packing_samples = False
    logits = captured["logits"]
    assert logits.shape[0] == 1 and logits.shape[1] == int(batch.attention_mask.sum())
    keep = batch.action_mask.bool()
    assert torch.allclose(packed.detach()[keep], padded[keep], atol=1e-5)
    ratio = _ratio(packed.detach(), batch)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5), ratio
    assert (_ratio(stock, batch) - 1).abs().max() > 1e-2       # packed, as shipped
    logits.retain_grad()
    loss, *_ = PolicyLoss()(packed, padded, torch.ones_like(packed),
                            action_mask=batch.action_mask)
    loss.backward()
    flat = torch.nonzero(batch.attention_mask.flatten()).flatten().tolist()
    length = batch.sequences.shape[1]
    rows = {b: _rows(m) for b, m in enumerate(batch.sampling_mask)}
    for p, i in enumerate(flat):
        b, j = divmod(i, length)
        nonzero = set(torch.nonzero(logits.grad[0, p]).flatten().tolist())
        row = rows[b][j] if j < len(rows[b]) else []
        assert nonzero <= set(row), (b, j)


def test_each_patch_has_its_record_and_seams():
    from vllm_sampling_mask.integrations.seams import OPENRLHF_SEAMS

    names = [p.name for p in adapter.PATCHES]
    assert len(set(names)) == len(names)
    for patch in adapter.PATCHES:
        assert patch.what and patch.why and patch.remove_when, patch.name
        assert OPENRLHF_SEAMS.get(patch.seams), patch.name
        assert patch.modules and all(m.startswith("openrlhf.") for m in patch.modules)
        assert callable(getattr(adapter, f"patch_{patch.name}"))


def test_install_patches_openrlhfs_modules_as_they_load():
    _need_openrlhf()
    flash_attn_stand_in.install()
    adapter.install()
    import dataclasses

    from openrlhf.models.actor import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.launcher import ReferenceModelActor
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    assert adapter.MASK_KEY in [f.name for f in dataclasses.fields(Experience)]
    assert Experience().sampling_mask == []
    assert Experience(sampling_mask=[None]).sampling_mask == [None]
    patched = [
        adapter._actor_class(RolloutRayActor).generate_responses,
        SamplesGenerator._process_response_into_experience,
        RemoteExperienceMaker.make_experience, RemoteExperienceMaker._dispatch_forward,
        adapter._actor_class(PolicyModelActor).forward,
        adapter._actor_class(ReferenceModelActor).forward,
        ActorPPOTrainer.training_step, Actor.forward]
    assert all(getattr(f, adapter._MARK, False) for f in patched)


# -- the coverage metric in training_step's status -------------------------------------


class _DeepSpeedStandIn:
    """Stand-in for the three DeepSpeedStrategy calls `ActorPPOTrainer.training_step`
    makes on its DeepSpeed engine (openrlhf/trainer/ray/ppo_actor.py:356-361
    `strategy.backward` / `strategy.optimizer_step`, :378 `strategy.get_grad_norm`),
    which need DeepSpeed's initialized engine; the loop test runs the real ones."""

    ring_attn_group = None

    def backward(self, loss, model, optimizer):
        loss.backward()

    def optimizer_step(self, optimizer, model, scheduler, name="model"):
        optimizer.step()
        optimizer.zero_grad()

    def get_grad_norm(self, model):
        return 0.0


def _coverage_experience(actor, seed=0):
    """Two right-padded samples (OpenRLHF's layout: action column j is token j + 1)
    with made-up supports: the token and 1-5 of the actor's most likely ids at that
    column (so the support holds a share of the mass); every fourth action token none."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    g = torch.Generator().manual_seed(seed)
    length, columns = 12, 11
    sequences = torch.randint(20, 400, (2, length), generator=g)
    attention = torch.ones(2, length, dtype=torch.long)
    attention[1, 9:] = 0
    sequences[1, 9:] = 0
    action = torch.zeros(2, columns, dtype=torch.bool)
    action[0, 3:11] = True      # prompt of 4, 8 response tokens
    action[1, 2:8] = True       # prompt of 3, 6 response tokens, 3 pad
    with torch.no_grad():
        top = actor.model(sequences, attention_mask=attention).logits.topk(5, dim=-1).indices
    masks = []
    for b in range(2):
        ids, offsets = [], [0]
        for j in range(columns):
            if action[b, j] and j % 4 != 1:
                size = int(torch.randint(1, 6, (1,), generator=g))
                row = [int(sequences[b, j + 1])] + top[b, j, :size].tolist()
                ids += list(dict.fromkeys(row))
            offsets.append(len(ids))
        masks.append((np.array(ids, np.int32), np.array(offsets, np.int64)))
    zeros = torch.zeros(2, columns)
    return Experience(sequences=sequences, attention_mask=attention, action_mask=action,
                      action_log_probs=zeros, rollout_log_probs=zeros,
                      advantages=torch.ones(2, columns), sampling_mask=masks), masks


def _trainer(actor):
    """OpenRLHF's ActorPPOTrainer (not built: its __init__ starts DeepSpeed and the
    vLLM engines) holding what training_step reads: the real Actor and PolicyLoss,
    an optimizer at learning rate 0 (the shared actor's weights stay), and the
    arguments of a run without KL loss, entropy or dynamic batching."""
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    trainer = object.__new__(ActorPPOTrainer)
    trainer.actor = actor
    trainer.actor_loss_fn = PolicyLoss()
    trainer.strategy = _DeepSpeedStandIn()
    trainer.actor_optim = torch.optim.SGD(actor.parameters(), lr=0.0)
    trainer.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.actor_optim,
                                                                lambda step: 1.0)
    trainer.ema_model, trainer.aux_loss, trainer.replay_buffer = None, False, None
    trainer.args = types.SimpleNamespace(
        actor=types.SimpleNamespace(entropy_coef=None, aux_loss_coef=0.0),
        algo=types.SimpleNamespace(kl=types.SimpleNamespace(use_loss=False)),
        train=types.SimpleNamespace(dynamic_batch_enable=False))
    return trainer


def test_coverage_in_training_steps_status_equals_a_direct_full_softmax(actor, monkeypatch):
    """OpenRLHF's training_step (patched) on CPU tensors: its status carries the two
    coverage means, token-weighted, equal to a float64 full softmax of the actor's
    temperature-scaled logits over the action tokens with a support; with
    VLLM_SAMPLING_MASK_COVERAGE=0 they are absent."""
    from vllm_sampling_mask.config import COVERAGE

    experience, masks = _coverage_experience(actor)
    loss_info = {"dp_size": 1, "batch_num_tokens": experience.action_mask.sum().float(),
                 "global_batch_size": torch.tensor(2.0)}
    with torch.no_grad():
        _, output = actor(experience.sequences, experience.action_mask,
                          experience.attention_mask, return_output=True)
    p = torch.softmax(output["logits"].double(), dim=-1)    # already / temperature
    mass, sizes = [], []
    for b, (ids, offsets) in enumerate(masks):
        for j in range(len(offsets) - 1):
            support = torch.as_tensor(ids[offsets[j]:offsets[j + 1]], dtype=torch.long)
            if len(support):
                mass.append(1.0 - float(p[b, j, support].sum()))
                sizes.append(len(support))
    trainer = _trainer(actor)
    try:
        status = trainer.training_step(experience, 0.0, 0, loss_info)
        monkeypatch.setenv(COVERAGE, "0")
        off = trainer.training_step(experience, 0.0, 0, loss_info)
    finally:
        actor.eval()
    got = status["metrics"]
    print(f"mass outside {float(got[adapter.COVERAGE_METRICS[0]]):.6f} "
          f"(direct {np.mean(mass):.6f}), size {float(got[adapter.COVERAGE_METRICS[1]]):.3f}")
    assert abs(float(got[adapter.COVERAGE_METRICS[0]]) - np.mean(mass)) < 1e-5
    assert 0.0 < np.mean(mass) < 1.0
    assert abs(float(got[adapter.COVERAGE_METRICS[1]]) - np.mean(sizes)) < 1e-9
    assert all(status["weights"][k] == "token" for k in adapter.COVERAGE_METRICS)
    assert not set(adapter.COVERAGE_METRICS) & set(off["metrics"])
    assert "policy_loss" in off["metrics"]
