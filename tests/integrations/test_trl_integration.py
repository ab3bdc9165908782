"""MaskedGRPOTrainer against the real TRL (1.16) and vLLM, on the demo model, on CPU.

One engine per mode: a colocated one (the trainer's own `LLM`, built by TRL with the
mask flag from `VLLM_SAMPLING_MASK_RETURN`) and a `trl vllm-serve` server (float32,
`--return-sampling-mask`, `--api-key`). Each module-scoped trainer runs real GRPO
steps (top_k 50, top_p 0.9, temperature 0.9, token-level importance sampling so that
TRL's ratio metric is per token), and the tests read what TRL itself logged and what
went through its batch:

- the masked ratio (TRL's `sampling/importance_sampling_ratio/{min,mean,max}`) is 1
  within 1e-5 at equal weights, server and colocate, and in each of TRL's
  `vllm_importance_sampling_mode`s (per sequence: 1e-4, ten tokens' rounding);
- after optimizer steps and a weight sync (server: checkpoint + `reload_weights`;
  colocate: TRL's own `load_weights` loop, which the `cpu_colocated_load_weights` fix
  makes run on CPU), the engine's log-probabilities of the next rollout equal the
  trainer's recomputation over the supports at the new weights (1e-5), while the
  starting weights give them a gap above 1e-3 (the sync really happened);
- TRL's stock hook (full softmax) on the same rollouts spreads the ratio;
- with `steps_per_generation` 2, `num_iterations` 2 and gradient accumulation 2,
  every micro-batch's supports line up with its `completion_mask` (counts equal);
- a completion without a mask (empty supports) gets the full softmax's
  log-probabilities, the same as TRL's own fused head;
- the coverage metrics the loss logs (`sampling_mask/mass_outside_support`,
  `sampling_mask/support_size`) equal a direct full-softmax computation (1e-5);
- a `rollout_func` hands its own supports in (`sampling_mask`), `[]` for environment
  tokens under `env_mask` 0: the batch carries them as given;
- without the integration (plain `GRPOTrainer`, and `MaskedGRPOTrainer` without vLLM)
  training is stock TRL's, bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")

import requests  # noqa: E402
import torch  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from vllm_sampling_mask import DEMO_MODEL  # noqa: E402

pytestmark = pytest.mark.trl

PROMPTS = ["def main():\n    ", "class Parser:\n    def __init__(self",
           "    for i in range(", "if __name__ == '__main__':\n"]
ENGINE = dict(dtype="float32", kv_cache_memory_bytes=1 << 30, enforce_eager=True)
API_KEY = "trl-test-key"


def _dataset():
    from datasets import Dataset
    return Dataset.from_dict({"prompt": PROMPTS})


def _reward(completions, **kwargs):
    return [float(len(set(c))) for c in completions]


def _config(tmp, **overrides):
    from trl import GRPOConfig
    base = dict(output_dir=str(tmp), per_device_train_batch_size=4, num_generations=4,
                max_completion_length=10, learning_rate=1e-3, temperature=0.9, top_k=50,
                top_p=0.9, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                save_strategy="no", seed=0, use_vllm=True,
                vllm_importance_sampling_mode="token_truncate",
                vllm_importance_sampling_clip_max=10.0)
    base.update(overrides)
    return GRPOConfig(**base)


def _recording(cls):
    """`cls` that keeps every generation batch and every micro-batch the loss saw."""
    class Recording(cls):
        def __init__(self, *args, **kwargs):
            self.generations, self.micro_batches = [], []
            super().__init__(*args, **kwargs)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.generations.append({k: v for k, v in output.items()})
            return output

        def _compute_loss(self, model, inputs):
            self.micro_batches.append(
                ([len(m) for m in inputs.get("sampling_masks") or []],
                 inputs["completion_mask"].sum(dim=1).tolist()))
            return super()._compute_loss(model, inputs)
    return Recording


def _ratios(trainer):
    """TRL's own ratio metric, (min, mean, max) per logged step."""
    key = "sampling/importance_sampling_ratio/"
    return [(h[key + "min"], h[key + "mean"], h[key + "max"])
            for h in trainer.state.log_history if key + "mean" in h]


def _engine_and_trainer_gap(generation):
    sampling = generation["sampling_per_token_logps"]
    old = generation["old_per_token_logps"]
    mask = generation["completion_mask"].bool()
    return (old - sampling)[mask].abs().max().item()


def _starting_weights_gap(generation, temperature=0.9):
    """Max |engine - log pi| with pi over the supports under the *starting* weights."""
    from transformers import AutoModelForCausalLM

    from vllm_sampling_mask.training import nucleus_logprobs, pack_masks
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32).eval()
    ids = torch.cat([generation["prompt_ids"], generation["completion_ids"]], dim=1)
    attention = torch.cat([generation["prompt_mask"], generation["completion_mask"]], dim=1)
    K = generation["completion_ids"].size(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, -K - 1:-1]
    valid = generation["completion_mask"].bool()
    start = nucleus_logprobs(logits[valid], generation["completion_ids"][valid],
                             pack_masks(generation["sampling_masks"]), temperature)
    return (start - generation["sampling_per_token_logps"][valid]).abs().max().item()


# ---------------------------------------------------------------------------
# colocate
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    # 2 optimizer steps of 2 micro-batches each per generation (steps_per_generation
    # 2 x num_iterations 2 = 4 micro-batches), 3 steps: a second generation after
    # two optimizer steps and a sync
    args = _config(tmp_path_factory.mktemp("colocate"), vllm_mode="colocate",
                   steps_per_generation=2, num_iterations=2, gradient_accumulation_steps=2,
                   max_steps=3)
    trainer = _recording(MaskedGRPOTrainer)(
        model=DEMO_MODEL, reward_funcs=_reward, args=args, train_dataset=_dataset(),
        vllm_engine_kwargs=ENGINE)
    trainer.train()
    yield trainer
    del trainer.vllm_generation.llm


def test_colocate_masked_ratio_is_one_at_equal_weights(colocated):
    lo, mean, hi = _ratios(colocated)[0]
    assert abs(lo - 1) < 1e-5 and abs(mean - 1) < 1e-5 and abs(hi - 1) < 1e-5, (lo, mean, hi)
    assert _engine_and_trainer_gap(colocated.generations[0]) < 1e-5


def test_colocate_engine_follows_the_trainer_after_a_sync(colocated):
    assert len(colocated.generations) == 2, "a second rollout after two optimizer steps"
    after = colocated.generations[1]
    assert _engine_and_trainer_gap(after) < 1e-5
    assert _starting_weights_gap(after) > 1e-3      # the weights did move


def test_colocate_stock_hook_spreads_the_ratio_on_the_same_rollouts(colocated):
    from trl import GRPOTrainer
    g = colocated.generations[0]
    ids = torch.cat([g["prompt_ids"], g["completion_ids"]], dim=1)
    attention = torch.cat([g["prompt_mask"], g["completion_mask"]], dim=1)
    K = g["completion_ids"].size(1)
    # the starting weights are gone; the stock hook at the trainer's weights against
    # the masked hook at the same weights isolates the distribution the two score
    with torch.no_grad():
        stock, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            colocated, colocated.model, ids, attention, K)
        colocated._active_masks = g["sampling_masks"]
        try:
            masked, _, _ = colocated._get_per_token_logps_and_entropies(
                colocated.model, ids, attention, K)
        finally:
            colocated._active_masks = None
    valid = g["completion_mask"].bool()
    ratio = torch.exp(stock - masked)[valid]
    assert (ratio.max() - ratio.min()).item() > 0.05
    assert (ratio <= 1 + 1e-6).all()      # the full softmax gives each draw less


def test_colocate_supports_follow_every_micro_batch(colocated):
    # 3 optimizer steps x 2 accumulation micro-batches, the first 4 from one rollout
    assert len(colocated.micro_batches) == 6
    for counts, completion in colocated.micro_batches:
        assert counts == completion and sum(counts) > 0


def test_rows_without_a_mask_take_the_full_softmax(colocated):
    from trl import GRPOTrainer

    from vllm_sampling_mask.integrations.trl import empty_mask
    g = colocated.generations[1]
    ids = torch.cat([g["prompt_ids"], g["completion_ids"]], dim=1)
    attention = torch.cat([g["prompt_mask"], g["completion_mask"]], dim=1)
    K = g["completion_ids"].size(1)
    masks = list(g["sampling_masks"])
    masks[0] = empty_mask(len(masks[0]))
    with torch.no_grad():
        stock, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            colocated, colocated.model, ids, attention, K)
        colocated._active_masks = masks
        try:
            mixed, _, _ = colocated._get_per_token_logps_and_entropies(
                colocated.model, ids, attention, K)
            colocated._active_masks = g["sampling_masks"]
            masked, _, _ = colocated._get_per_token_logps_and_entropies(
                colocated.model, ids, attention, K)
        finally:
            colocated._active_masks = None
    torch.testing.assert_close(mixed[0], stock[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[1:], masked[1:], atol=0, rtol=0)
    assert (masked[0] - stock[0]).abs().max() > 1e-3


def _direct_coverage(trainer, g, temperature=0.9):
    """Mass outside and mean size over every valid token, by the model's full
    [B, K, V] logits and a float64 softmax."""
    ids = torch.cat([g["prompt_ids"], g["completion_ids"]], dim=1)
    attention = torch.cat([g["prompt_mask"], g["completion_mask"]], dim=1)
    K = g["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -K - 1:-1]
    p = torch.softmax(logits.double() / temperature, dim=-1)
    outside, sizes = [], []
    for row, (mask, count) in enumerate(zip(g["sampling_masks"],
                                            g["completion_mask"].sum(dim=1).tolist())):
        for t, support in enumerate(mask.token_ids[:count]):
            outside.append(1.0 - p[row, t, support].sum().item())
            sizes.append(len(support))
    return sum(outside) / len(outside), sum(sizes) / len(sizes), max(outside)


def test_coverage_metric_equals_a_full_softmax_through_the_loss(colocated):
    """TRL's `_compute_loss` on a rollout batch (the hook's loss forward) logs
    `sampling_mask/mass_outside_support` and `sampling_mask/support_size` equal to a
    direct full-softmax computation at the same weights (1e-5); off, nothing is logged
    and the entropy is the same."""
    key, size_key = "sampling_mask/mass_outside_support", "sampling_mask/support_size"
    logged = [h[key] for h in colocated.state.log_history if key in h]
    assert logged and all(0.0 < v < 1.0 for v in logged), logged
    g = colocated.generations[1]
    metrics = colocated._metrics["train"]
    colocated.model.train()
    with torch.no_grad():
        colocated._compute_loss(colocated.model, dict(g))
    want_mass, want_size, most = _direct_coverage(colocated, g)
    assert abs(metrics[key][-1] - want_mass) < 1e-5, (metrics[key][-1], want_mass)
    assert abs(metrics[size_key][-1] - want_size) < 1e-9
    assert want_mass > 1e-3 and want_size > 1     # real truncation, not a vacuous 0
    before, entropy = len(metrics[key]), metrics["entropy"][-1]
    colocated._coverage = False
    try:
        with torch.no_grad():
            colocated._compute_loss(colocated.model, dict(g))
    finally:
        colocated._coverage = True
    assert len(metrics[key]) == before
    # the same entropy pass without the supports' gather
    assert abs(metrics["entropy"][-1] - entropy) < 1e-6, (metrics["entropy"][-1], entropy)


# ---------------------------------------------------------------------------
# server
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    trl_cli = os.path.join(os.path.dirname(sys.executable), "trl")
    proc = subprocess.Popen(
        [trl_cli, "vllm-serve", "--model", DEMO_MODEL, "--dtype", "float32",
         "--kv-cache-memory-bytes", "1G", "--return-sampling-mask", "--enforce-eager",
         "--api-key", API_KEY, "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, "trl vllm-serve exited"
            try:
                if requests.get(base + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.time() < deadline, "trl vllm-serve did not start"
            time.sleep(2)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(server, tmp_path_factory):
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    args = _config(tmp_path_factory.mktemp("server"), vllm_mode="server",
                   vllm_server_base_url=server, max_steps=2)
    trainer = _recording(MaskedGRPOTrainer)(
        model=DEMO_MODEL, reward_funcs=_reward, args=args, train_dataset=_dataset(),
        vllm_api_key=API_KEY)
    trainer.train()
    return trainer


def test_server_masked_ratio_is_one_at_equal_weights(served):
    lo, mean, hi = _ratios(served)[0]
    assert abs(lo - 1) < 1e-5 and abs(mean - 1) < 1e-5 and abs(hi - 1) < 1e-5, (lo, mean, hi)


def test_server_engine_follows_the_trainer_after_a_reload(served):
    after = served.generations[1]
    lo, mean, hi = _ratios(served)[1]
    assert abs(lo - 1) < 1e-5 and abs(hi - 1) < 1e-5, (lo, mean, hi)
    assert _engine_and_trainer_gap(after) < 1e-5
    assert _starting_weights_gap(after) > 1e-3


def test_server_supports_line_up(served):
    assert served.micro_batches
    for counts, completion in served.micro_batches:
        assert counts == completion


@pytest.mark.parametrize("mode", ["token_mask", "sequence_truncate", "sequence_mask"])
def test_server_every_importance_sampling_mode_reads_the_masked_logprobs(
        server, tmp_path, mode):
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    args = _config(tmp_path, vllm_mode="server", vllm_server_base_url=server, max_steps=1,
                   vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=0.5,
                   vllm_importance_sampling_clip_max=2.0)
    trainer = MaskedGRPOTrainer(model=DEMO_MODEL, reward_funcs=_reward, args=args,
                                train_dataset=_dataset(), vllm_api_key=API_KEY)
    trainer.train()
    lo, mean, hi = _ratios(trainer)[0]
    # a sequence's ratio is the product of its 10 tokens' (float32 rounding each)
    tolerance = 1e-5 if mode.startswith("token") else 1e-4
    assert abs(lo - 1) < tolerance and abs(hi - 1) < tolerance, (mode, lo, mean, hi)


def test_a_rollout_func_gives_masks_and_tokens_the_engine_did_not_sample(server, tmp_path):
    """A rollout_func returns `sampling_mask` beside its completions: the engine's
    supports for the sampled tokens, `[]` for two appended environment tokens (under
    `env_mask` 0). The batch carries exactly those supports; TRL's ratio over the
    sampled tokens is 1."""
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    ENV = [13, 13]

    def rollout(prompts, trainer):
        generation = trainer.vllm_generation
        ids = [trainer.processing_class(p)["input_ids"] for p in prompts[::4]]
        out = generation.vllm_client.generate(
            prompts=ids, n=4, temperature=0.9, top_k=50, top_p=0.9, max_tokens=8,
            generation_kwargs={"return_sampling_mask": True})
        masks = generation.vllm_client.sampling_masks
        return {"prompt_ids": [p for p in out["prompt_ids"] for _ in range(4)],
                "completion_ids": [c + ENV for c in out["completion_ids"]],
                "logprobs": [[lp[0] for lp in seq] + [0.0, 0.0] for seq in out["logprobs"]],
                "env_mask": [[1] * len(c) + [0, 0] for c in out["completion_ids"]],
                "sampling_mask": [m.token_ids + [[], []] for m in masks]}

    args = _config(tmp_path, vllm_mode="server", vllm_server_base_url=server, max_steps=1)
    trainer = _recording(MaskedGRPOTrainer)(
        model=DEMO_MODEL, reward_funcs=_reward, args=args, train_dataset=_dataset(),
        vllm_api_key=API_KEY, rollout_func=rollout)
    trainer.train()
    lo, mean, hi = _ratios(trainer)[0]
    assert abs(lo - 1) < 1e-5 and abs(hi - 1) < 1e-5, (lo, mean, hi)
    generation = trainer.generations[0]
    for mask, ids in zip(generation["sampling_masks"], generation["completion_ids"]):
        sizes = mask.sizes.tolist()
        assert sizes[-2:] == [0, 0] and all(n > 0 for n in sizes[:-2])
    assert trainer.state.log_history[0]["sampling_mask/tokens_without_mask"] > 0


def test_server_refuses_the_sync_routes_without_the_key(server):
    r = requests.post(server + "/collective_rpc", json={"method": "reload_weights"})
    assert r.status_code == 401


# ---------------------------------------------------------------------------
# not turned on
# ---------------------------------------------------------------------------

def test_without_the_integration_training_is_stock_trl(tmp_path):
    import trl.generation.vllm_generation as vllm_generation
    import trl.trainer.grpo_trainer as grpo_trainer
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    from vllm_sampling_mask.config import RETURN
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer

    def run(cls):
        args = _config(tmp_path / cls.__name__, use_vllm=False, max_steps=1)
        trainer = _recording(cls)(model=DEMO_MODEL, reward_funcs=_reward, args=args,
                                  train_dataset=_dataset())
        trainer.train()
        return trainer

    stock, masked = run(GRPOTrainer), run(MaskedGRPOTrainer)
    assert grpo_trainer.VLLMGeneration is VLLMGeneration
    assert vllm_generation.LLM.__module__.startswith("vllm")
    assert RETURN not in os.environ
    assert "sampling_masks" not in masked.generations[0]
    for (name, a), (_, b) in zip(stock.model.named_parameters(),
                                 masked.model.named_parameters()):
        assert torch.equal(a, b), name
    assert stock.state.log_history[0]["loss"] == masked.state.log_history[0]["loss"]


def test_a_bad_coverage_option_names_it():
    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer
    with pytest.raises(ValueError, match="sampling_mask_coverage must be True or False"):
        MaskedGRPOTrainer(model=DEMO_MODEL, reward_funcs=_reward,
                          sampling_mask_coverage="yes")
