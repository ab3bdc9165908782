"""TRL's GRPOTrainer with sampling masks: ``MaskedGRPOTrainer``.

One change to a TRL script turns it on::

    from vllm_sampling_mask.integrations.trl import MaskedGRPOTrainer as GRPOTrainer

Everything else (``GRPOConfig``, reward functions, datasets, ``vllm_mode="server"`` or
``"colocate"``) stays TRL's. What it does, by the seams in ``integrations.seams``:

1. Rollouts carry masks. Server mode: the trainer's ``VLLMClient`` asks
   ``/v1/completions`` for ``return_sampling_mask: true`` whenever the sampling
   truncates (``top_k > 0``, ``top_p < 1`` or ``min_p > 0``) and keeps each choice's
   ``sampling_mask`` (start the server with ``--return-sampling-mask``; a server
   without it answers 400 naming the flag). Colocate mode: TRL builds ``LLM(...)``
   with fixed arguments, so the engine gets the flag from the environment
   (``VLLM_SAMPLING_MASK_RETURN=1``, set while TRL builds it), each request asks
   for the mask through ``SamplingParams.extra_args``, and ``vllm_engine_kwargs``
   (e.g. ``dtype="float32"``, ``kv_cache_memory_bytes``, ``enforce_eager`` on a CPU
   host) reach ``LLM(...)`` as well.
2. The batch carries them: one ``SamplingMask`` per completion, its T supports for
   the completion's T tokens, under the key ``"sampling_masks"`` (a list, which
   TRL's shuffle and split permute and slice with the tensors; it is reused as is
   for ``num_iterations > 1`` and every gradient-accumulation micro-batch).
3. The loss uses them: TRL's log-probability hook
   (``_get_per_token_logps_and_entropies``) computes, for a batch with masks,
   ``log pi_theta(a_t)`` over the support (``nucleus_logprobs_from_hidden``: the
   backbone's last hidden states and the LM head's rows on the support, at TRL's
   temperature, no ``[B, L, V]`` logits), through a forward of the model itself
   (so DDP / FSDP wrappers run as for TRL's fused head). ``old_per_token_logps``,
   the reference model's log-probabilities and the policy's are all over the
   support, so TRL's ``vllm_importance_sampling_*`` correction (every mode) and its
   metrics ``sampling/importance_sampling_ratio/*`` compare the trainer with the
   engine on the same distribution: 1 at equal weights, up to float rounding.
   The logged ``entropy`` (and ``top_entropy_quantile``'s mask) is the entropy of
   the full temperature-scaled softmax, as without masks, computed without
   gradient; the entropy bonus (``entropy_coef``, ``use_adaptive_entropy``) is
   refused with masks on. The same no-gradient pass logs, over the tokens with a
   support, ``sampling_mask/mass_outside_support`` (the mean of the trainer's
   full-softmax probability outside the support at the current weights:
   ``training.support_coverage``) and ``sampling_mask/support_size`` (the mean
   support size); ``sampling_mask_coverage=False`` turns them off.
4. Weights reach the engine. Server mode with CUDA: TRL's NCCL path as is. Server
   mode on a CPU host: a checkpoint written to a temporary directory and
   ``POST /collective_rpc`` ``reload_weights`` from it, then
   ``/reset_prefix_cache`` (the server needs ``VLLM_SERVER_DEV_MODE=1`` and the
   same filesystem; ``vllm_api_key`` or ``VLLM_API_KEY`` is sent as a bearer token
   when the server has ``--api-key``). Colocate mode: TRL's own sync (the
   ``cpu_colocated_load_weights`` fix makes it run on a CPU host).
5. Rows without a mask: a completion whose request asked for none (untruncated
   sampling), or whose mask was dropped (``sampling_mask: null``), has an empty
   support at each token, which the loss reads as "no mask: full softmax"
   (``empty_support="full"``). ``sampling_mask/tokens_without_mask`` logs their
   share. A ``rollout_func`` may return ``"sampling_mask"`` (one ``SamplingMask``
   or list of per-token id lists per completion, ``[]`` for a token the engine did
   not sample, e.g. environment output under ``env_mask`` 0). TRL's tool loop
   (``tools``, ``environment_factory``) is refused: it joins several rollouts into
   one completion.

Without this class (plain ``GRPOTrainer``) nothing changes: TRL runs as shipped.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import types
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from accelerate.utils import is_peft_model

import trl.generation.vllm_generation as _vllm_generation
import trl.trainer.grpo_trainer as _grpo_trainer
from trl import GRPOTrainer
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration

from vllm_sampling_mask.config import RETURN as RETURN_MASK_ENV
from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
from vllm_sampling_mask.training import (
    nucleus_logprobs_from_hidden,
    pack_masks,
    support_coverage,
)

__all__ = ["MaskedGRPOTrainer", "MaskedVLLMClient", "MaskedVLLMGeneration", "MASKS_KEY",
           "RETURN_MASK_ENV", "truncates"]

MASKS_KEY = "sampling_masks"
HEAD_KWARG = "sampling_mask_head"
_ENTROPY_ROWS = 256


def truncates(top_k: Optional[int], top_p: Optional[float], min_p: Optional[float]) -> bool:
    """Whether sampling with these settings draws from a truncated support."""
    return bool((top_k or 0) > 0 or (top_p is not None and top_p < 1.0)
                or (min_p or 0.0) > 0.0)


def empty_mask(tokens: int) -> SamplingMask:
    """A mask of ``tokens`` empty supports: no mask, the full softmax at each token."""
    return SamplingMask(np.zeros(0, np.int32), np.zeros(tokens + 1, np.int64))


def as_mask(value: Any, tokens: int, where: str) -> SamplingMask:
    """One completion's mask (``SamplingMask``, per-token id lists, or None: no mask)."""
    if value is None:
        return empty_mask(tokens)
    mask = value if isinstance(value, SamplingMask) else SamplingMask.from_lists(value)
    if len(mask) != tokens:
        raise ValueError(f"{where}: the sampling mask has {len(mask)} supports for a "
                         f"completion of {tokens} tokens; give one support per token "
                         "([] for a token the engine did not sample)")
    return mask


@dataclass
class MaskOptions:
    """What ``MaskedGRPOTrainer`` hands to the generation backend TRL builds."""
    engine_kwargs: dict = field(default_factory=dict)
    api_key: Optional[str] = None
    masks: bool = True


# ---------------------------------------------------------------------------
# Server mode: the client
# ---------------------------------------------------------------------------

class MaskedVLLMClient(VLLMClient):
    """TRL's ``VLLMClient`` that keeps ``choices[].sampling_mask`` and reloads weights
    from a checkpoint (for hosts without NCCL)."""

    def __init__(self, *args, api_key: Optional[str] = None, **kwargs):
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sampling_masks: Optional[list] = None
        super().__init__(*args, **kwargs)
        self.session.headers.update(self._auth)

    def _get(self, url: str, **kwargs) -> dict:
        kwargs["headers"] = {**self._auth, **(kwargs.get("headers") or {})}
        return super()._get(url, **kwargs)

    def _post(self, url: str, **kwargs) -> dict:
        kwargs["headers"] = {**self._auth, **(kwargs.get("headers") or {})}
        response = super()._post(url, **kwargs)
        if url.endswith("/v1/completions"):
            self.sampling_masks = [
                as_mask(c.get("sampling_mask"), len(c["token_ids"]), "the server's choice")
                for c in response["choices"]]
        return response

    def reload_weights(self, weights_path: str) -> None:
        """The server reloads its weights from ``weights_path`` (a checkpoint directory
        on its filesystem): ``POST /collective_rpc`` ``reload_weights``."""
        response = self.session.post(
            f"{self.base_url}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": weights_path}})
        if response.status_code == 404:
            raise RuntimeError(
                f"The vLLM server at {self.base_url} has no /collective_rpc route, which "
                "the weight sync on a host without NCCL uses: restart it with "
                "VLLM_SERVER_DEV_MODE=1 in its environment.")
        if response.status_code != 200:
            raise RuntimeError(f"reload_weights failed: {response.status_code}, "
                               f"{response.text[:500]}")


# ---------------------------------------------------------------------------
# The generation backend
# ---------------------------------------------------------------------------

@contextlib.contextmanager
def _replaced(owner, name: str, value):
    previous = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, previous)


@contextlib.contextmanager
def _environment(name: str, value: str):
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


class MaskedVLLMGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` whose rollouts carry sampling masks
    (``last_sampling_masks``: one ``SamplingMask`` per completion of the last
    ``generate``, this process's share)."""

    def __init__(self, *args, options: MaskOptions, **kwargs):
        self._options = options
        self._reload_sync = False
        self.last_sampling_masks: Optional[list[SamplingMask]] = None
        if kwargs.get("mode") == "colocate" and kwargs.get("tensor_parallel_size", 1) > 1:
            raise ValueError("MaskedGRPOTrainer: vllm_tensor_parallel_size > 1 in colocate "
                             "mode is not supported with sampling masks; use 1 or "
                             "vllm_mode='server'")
        super().__init__(*args, **kwargs)
        if options.masks and truncates(self.top_k, self.top_p, self.min_p):
            if self.mode == "server":     # request body fields, top level
                self.generation_kwargs = {**self.generation_kwargs,
                                          "return_sampling_mask": True}
            else:                          # SamplingParams(extra_args=...)
                extra = dict(self.generation_kwargs.get("extra_args") or {})
                extra["return_sampling_mask"] = True
                self.generation_kwargs = {**self.generation_kwargs, "extra_args": extra}
        elif not options.masks and self.mode == "server":    # the server needs no work
            self.generation_kwargs = {**self.generation_kwargs, "return_sampling_mask": False}

    def _init_vllm(self):
        if self.mode == "server":
            accelerator = self.accelerator
            if accelerator.is_main_process:
                base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
                self.vllm_client = MaskedVLLMClient(
                    base_url=base_url, group_port=self.group_port,
                    connection_timeout=self.server_timeout, api_key=self._options.api_key)
            if accelerator.device.type == "cuda":
                if accelerator.is_main_process:
                    self.vllm_client.init_communicator(device=accelerator.device)
            else:
                self._reload_sync = True   # no NCCL: checkpoint + reload_weights
            accelerator.wait_for_everyone()
            return
        build = functools.partial(_vllm_generation.LLM, **self._options.engine_kwargs)
        flag = "1" if self._options.masks else "0"
        with _environment(RETURN_MASK_ENV, flag), _replaced(_vllm_generation, "LLM", build):
            super()._init_vllm()
        generate = self.llm.generate

        def generate_keeping_masks(*args, **kwargs):
            outputs = generate(*args, **kwargs)
            self._colocated_masks = [
                as_mask(getattr(o, "sampling_mask", None), len(o.token_ids),
                        "the engine's output")
                for request in outputs for o in request.outputs]
            return outputs

        self.llm.generate = generate_keeping_masks

    def generate(self, prompts, images, num_generations, profiler=None):
        self._colocated_masks = None
        if self.mode == "server" and self.accelerator.is_main_process:
            self.vllm_client.sampling_masks = None
        result = super().generate(prompts, images, num_generations, profiler)
        if self.mode == "server":
            from accelerate.utils import broadcast_object_list

            masks = [self.vllm_client.sampling_masks if self.accelerator.is_main_process
                     else None]
            broadcast_object_list(masks, from_process=0)
            if masks[0] is None:      # TRL took another route (prompts with images)
                raise ValueError("MaskedGRPOTrainer: multimodal prompts are not supported "
                                 "with sampling masks")
            share = slice(self.accelerator.process_index * len(prompts),
                          (self.accelerator.process_index + 1) * len(prompts))
            self.last_sampling_masks = masks[0][share]
        else:
            self.last_sampling_masks = self._colocated_masks
        completion_ids = result[1]
        if len(self.last_sampling_masks) != len(completion_ids):
            raise RuntimeError(f"{len(self.last_sampling_masks)} sampling masks for "
                               f"{len(completion_ids)} completions")
        return result

    def sync_weights(self):
        if not self._reload_sync:
            return super().sync_weights()
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().to("cpu").contiguous()
                   for name, tensor in self._iter_named_params()}   # every process gathers
        if self.accelerator.is_main_process:
            with tempfile.TemporaryDirectory(prefix="trl-sync-") as path:
                save_file(tensors, os.path.join(path, "model.safetensors"))
                self.vllm_client.reload_weights(path)
            self.vllm_client.reset_prefix_cache()


# ---------------------------------------------------------------------------
# The log-probability head
# ---------------------------------------------------------------------------

@dataclass
class MaskedHead:
    """What one forward of the masked head needs besides the model inputs."""
    masks: list                  # one SamplingMask per row
    logits_to_keep: int
    temperature: float
    compute_entropy: bool
    coverage: bool = False       # with compute_entropy: support_coverage's figures


def _head_forward(model, head: MaskedHead, input_ids, attention_mask, **kwargs):
    """Log-probabilities over the supports, ``[B, K]`` (zero where the completion
    mask is 0), the full softmax's entropy without gradient (or None) and, with
    ``head.coverage`` and ``head.compute_entropy``, the rows' ``Coverage`` (the valid
    tokens in row order; else None)."""
    text_config = model.config.get_text_config()
    if getattr(text_config, "final_logit_softcapping", None) is not None:
        raise ValueError("MaskedGRPOTrainer: models with final_logit_softcapping are not "
                         "supported with sampling masks")
    scale = getattr(text_config, "logit_scale", None) or 1.0
    K = head.logits_to_keep
    kwargs["use_cache"] = False
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              **kwargs).last_hidden_state[:, -K - 1:-1]
    lm_head = model.get_output_embeddings()
    weight, bias = lm_head.weight, lm_head.bias
    if hasattr(weight, "full_tensor"):           # FSDP2 DTensor
        weight = weight.full_tensor()
        bias = bias.full_tensor() if bias is not None else None
    hidden = hidden.to(weight.device)
    valid = attention_mask[:, -K:].to(weight.device).bool()
    counts = valid.sum(dim=1).tolist()
    rows = []
    for i, (mask, count) in enumerate(zip(head.masks, counts)):
        if count == 0:                # masked out (e.g. mask_truncated_completions)
            continue
        if count != len(mask):
            raise RuntimeError(f"sampling masks out of line with the batch: row {i} has "
                               f"{count} completion tokens but {len(mask)} supports")
        rows.append(mask)
    out = torch.zeros(valid.shape, dtype=torch.float32, device=weight.device)
    entropy = coverage = None
    if rows:
        h = hidden[valid]
        tokens = input_ids[:, -K:].to(weight.device)[valid]
        temperature = head.temperature / scale
        packed = pack_masks(rows, device=weight.device)
        logps = nucleus_logprobs_from_hidden(h, weight, tokens, packed, temperature,
                                             bias, empty_support="full")
        out = out.masked_scatter(valid, logps.to(torch.float32))
        if head.compute_entropy:
            # the entropy pass; with the coverage metric on, each chunk's support
            # logits too (an empty mask gathers nothing: the entropy alone)
            support = packed if head.coverage else _no_supports(h.shape[0], h.device)
            cover = support_coverage(h, support, temperature, lm_head_weight=weight,
                                     bias=bias, entropy=True, chunk_rows=_ENTROPY_ROWS,
                                     validate=False)
            entropy = torch.zeros_like(out).masked_scatter(valid, cover.entropy.float())
            coverage = cover if head.coverage else None
    elif head.compute_entropy:
        entropy = torch.zeros_like(out)
    if not rows:    # keep the output connected to the graph
        out = out + hidden.sum() * 0.0
    return types.SimpleNamespace(log_probs=out, entropy=entropy, coverage=coverage)


def _no_supports(T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """T empty supports, packed."""
    return (torch.zeros(0, dtype=torch.int64, device=device),
            torch.zeros(T + 1, dtype=torch.int64, device=device))


def add_masked_head(model) -> None:
    """Let ``model(..., sampling_mask_head=MaskedHead(...))`` return log-probabilities
    over the supports; without that keyword the model's forward is unchanged
    (TRL's fused LM head included)."""
    previous = model.forward
    if getattr(previous, "_sampling_mask_head", False):
        return

    @functools.wraps(previous)
    def forward(*args, **kwargs):
        head = kwargs.pop(HEAD_KWARG, None)
        if head is None:
            return previous(*args, **kwargs)
        return _head_forward(model, head, *args, **kwargs)

    forward._sampling_mask_head = True
    model.forward = forward


# ---------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------

class MaskedGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose vLLM rollouts return sampling masks and whose loss
    takes the policy's log-probabilities over them (see the module docstring).

    Extra keyword arguments (everything else is ``GRPOTrainer``'s):
        vllm_engine_kwargs: more keyword arguments for the ``LLM(...)`` TRL builds
            in colocate mode (on a CPU host: ``dtype="float32"``,
            ``kv_cache_memory_bytes=1 << 30``, ``enforce_eager=True``).
        vllm_api_key: the server's ``--api-key`` (default: ``VLLM_API_KEY``), sent
            as a bearer token on every request to it.
        sampling_masks: False keeps the rest (engine arguments, the weight sync on a
            host without NCCL) and trains as stock TRL does, without masks: the
            control of an A/B run.
        sampling_mask_coverage: log, for the tokens with a support, the trainer's
            full-softmax probability outside it at the current weights
            (``sampling_mask/mass_outside_support``, mean over tokens) and the mean
            support size (``sampling_mask/support_size``), from the loss's forward
            (default True). Its cost rides on the entropy pass TRL's loss already
            asks for: per chunk of rows, a gather of the N support logits and a
            segmented log-sum-exp (O(N) operations and bytes, N = the supports'
            total size); False skips it.
    """

    def __init__(self, *args, vllm_engine_kwargs: Optional[dict] = None,
                 vllm_api_key: Optional[str] = None, sampling_masks: bool = True,
                 sampling_mask_coverage: bool = True, **kwargs):
        if not isinstance(sampling_mask_coverage, bool):
            raise ValueError("MaskedGRPOTrainer: sampling_mask_coverage must be True or "
                             f"False (got {sampling_mask_coverage!r})")
        self._coverage = sampling_mask_coverage
        self._coverage_sums: Optional[list] = None
        self._mask_options = MaskOptions(
            engine_kwargs=dict(vllm_engine_kwargs or {}),
            api_key=vllm_api_key if vllm_api_key is not None else os.environ.get("VLLM_API_KEY"),
            masks=bool(sampling_masks))
        self._active_masks: Optional[list] = None
        backend = functools.partial(MaskedVLLMGeneration, options=self._mask_options)
        with _replaced(_grpo_trainer, "VLLMGeneration", backend):
            super().__init__(*args, **kwargs)
        if self.tools or self.environment_factories is not None:
            raise ValueError(
                "MaskedGRPOTrainer: tools / environment_factory are not supported: TRL's "
                "tool loop joins several rollouts into one completion. Use a rollout_func "
                "that returns 'sampling_mask' ([] for tokens the engine did not sample).")
        if self._entropy_bonus_enabled:
            raise ValueError(
                "MaskedGRPOTrainer: entropy_coef / use_adaptive_entropy are not supported "
                "with sampling masks (the logged entropy is computed without gradient); "
                "set entropy_coef=0 and use_adaptive_entropy=False")
        add_masked_head(self.model.get_base_model() if is_peft_model(self.model)
                        else self.model)
        if self.ref_model is not None:
            add_masked_head(self.ref_model)

    # -- rollouts -------------------------------------------------------------
    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields = result[:6]
        given = extra_fields.pop("sampling_mask", None)     # from a rollout_func
        if given is not None:
            masks = [as_mask(m, len(ids), "rollout_func's sampling_mask")
                     for m, ids in zip(given, completion_ids, strict=True)]
        elif self.use_vllm and self.rollout_func is None and self._mask_options.masks:
            masks = self.vllm_generation.last_sampling_masks
        else:               # no engine rollout to take masks from: stock TRL
            self._active_masks = None
            return result
        tokens = sum(len(ids) for ids in completion_ids)
        without = sum(int((m.sizes == 0).sum()) for m in masks)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["sampling_mask/tokens_without_mask"].append(
            without / max(tokens, 1))
        self._active_masks = masks
        return result

    def _generate_and_score_completions(self, inputs):
        try:
            output = super()._generate_and_score_completions(inputs)
            if self._active_masks is not None:
                output[MASKS_KEY] = self._active_masks
        finally:
            self._active_masks = None
        return output

    # -- loss -----------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        self._active_masks = inputs.get(MASKS_KEY)
        self._coverage_sums = [] if (self._coverage and self._active_masks is not None) \
            else None
        try:
            loss = super()._compute_loss(model, inputs)
            if self._coverage_sums:
                self._log_coverage()
            return loss
        finally:
            self._active_masks = None
            self._coverage_sums = None

    def _log_coverage(self) -> None:
        """The loss forward's coverage, over every process's tokens with a support."""
        total = torch.stack(self._coverage_sums).sum(dim=0)
        total = self.accelerator.gather(total.to(self.accelerator.device).unsqueeze(0))
        mass, size, count = total.reshape(-1, 3).sum(dim=0).tolist()
        if count > 0:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["sampling_mask/mass_outside_support"].append(mass / count)
            self._metrics[mode]["sampling_mask/support_size"].append(size / count)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask,
                                           logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False,
                                           **multimodal):
        masks = self._active_masks
        if masks is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss,
                **multimodal)
        if any(v is not None for v in multimodal.values()) or compute_aux_loss:
            raise ValueError("MaskedGRPOTrainer: multimodal inputs and the MoE aux loss "
                             "are not supported with sampling masks")
        if len(masks) != input_ids.size(0):
            raise RuntimeError(f"{len(masks)} sampling masks for a batch of "
                               f"{input_ids.size(0)} rows")
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            record = compute_entropy and self._coverage_sums is not None
            head = MaskedHead(masks=masks[start:end], logits_to_keep=logits_to_keep,
                              temperature=self.temperature, compute_entropy=compute_entropy,
                              coverage=record)
            with self.accelerator.autocast():
                out = model(input_ids=input_ids[start:end],
                            attention_mask=attention_mask[start:end], **{HEAD_KWARG: head})
            if record and out.coverage is not None:
                self._coverage_sums.append(out.coverage.totals())
            logps.append(out.log_probs)
            entropies.append(out.entropy)
        return (torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None)
