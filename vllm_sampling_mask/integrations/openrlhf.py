"""OpenRLHF: sampling masks from its vLLM rollout actors to its actor's log-probabilities.

OpenRLHF (0.11.2) rolls out through Ray `RolloutRayActor`s (one `AsyncLLMEngine`
each, built by `create_vllm_engines` with fixed arguments); an agent executor
(`SingleTurnAgentExecutor`, a multi-turn one, or the script of
`--train.agent_func_path`) calls the actor's `generate` and returns one dict per
sample, which `SamplesGenerator._process_response_into_experience` turns into an
`Experience`. `RemoteExperienceMaker.make_experience` sends each micro-batch to the
policy (`PolicyModelActor.forward`) and reference (`ReferenceModelActor.forward`)
actors for the old and reference log-probabilities; `ActorPPOTrainer.training_step`
takes pi_theta from `Actor.forward` and hands all three to `PolicyLoss`, whose
train/rollout correction (`--algo.advantage.is_correction_level`) compares the old
log-probabilities with the engine's (processed logprobs: over the support).

OpenRLHF has no plugin mechanism and no field for a per-token mask: `Experience` is a
dataclass whose batching (`concat_experiences`, `split_experience_batch`,
`make_experience_batch`) copies only its declared `fields()`, and
`_process_response_into_experience` builds it from named keys of the executor's dict,
dropping any other. So this module patches OpenRLHF in place (`install()`, run in
every process of the job: the launcher below does that), each patch a record in
`PATCHES` with the seams it relies on in `integrations.seams` (`OPENRLHF_SEAMS`):

- `experience_field`: `Experience` gets a `sampling_mask` field (a list, one entry
  per sample: `(ids, offsets)` over the sample's action positions, or None), which
  OpenRLHF's own batching then carries like `prompts`.
- `rollout`: `RolloutRayActor.generate_responses` hands its executor an engine that
  records each request's mask; the sample's dict gets `"sampling_mask"` over its
  observation tokens (empty rows outside the action ranges, e.g. prompt and
  environment tokens, and for requests without a mask: greedy or untruncated).
- `experience`: `_process_response_into_experience` puts it on the `Experience`,
  cut like the action mask.
- `old_logprobs`: `make_experience` / `_dispatch_forward` send each micro-batch's
  masks to the policy and reference actors' `forward`, which pass them to
  `Actor.forward`.
- `train_step`: `training_step` passes the experience's masks to `Actor.forward`,
  and returns in its status the support's coverage at the current weights:
  `sampling_mask/mass_outside_support` (the full softmax's probability outside each
  action token's support, `training.support_coverage`, mean over the tokens with a
  support) and `sampling_mask/support_size` (their mean support size), computed
  without gradient from the logits `Actor.forward` already selected, weighted
  "token" as OpenRLHF weighs its losses over micro-batches and ranks.
  `VLLM_SAMPLING_MASK_COVERAGE=0` (in the driver's environment: the launcher passes
  it to every worker) turns it off.
- `actor_forward`: `Actor.forward`, given masks, takes each action token's
  log-probability over its support (`training.nucleus_logprobs` on the
  temperature-scaled logits; rows without a mask keep the full softmax,
  `empty_support="full"`), in the padded layout or the packed one
  (`--ds.packing_samples`, `packed_support_log_probs`); ring attention
  (`--ds.ring_attn_size` > 1) is refused with a ValueError naming the flag.

The engine flag: `create_vllm_engines` builds the engines with fixed arguments, so
they take it from `VLLM_SAMPLING_MASK_RETURN=1`, which the launcher sets for every
Ray worker. The masked old log-probabilities equal the engine's processed
log-probabilities at equal weights, so the correction reads 1 there; run with
`--algo.advantage.is_correction_level token` (or `seq`) so that OpenRLHF asks vLLM
for them (`logprobs_mode="processed_logprobs"`).

Launcher (the explicit wrap; OpenRLHF's own arguments unchanged)::

    python -m vllm_sampling_mask.integrations.openrlhf <train_ppo_ray arguments>

starts Ray (when not connected) with `install` as every worker's setup hook and
the engine flag in their environment, installs the patches in the driver, and runs
`openrlhf.cli.train_ppo_ray` as its own `__main__`. A job on an existing cluster
passes the same runtime environment (`runtime_env()`).

Importing this module imports neither OpenRLHF nor vLLM; `install()` registers
post-import hooks (each OpenRLHF module is patched when it is imported).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from typing import Optional, Sequence

import numpy as np

from vllm_sampling_mask.formats.packed_wire import offsets_of_counts

__all__ = ["MASK_KEY", "PATCHES", "COVERAGE_METRICS", "install", "runtime_env",
           "observation_rows", "action_rows", "support_log_probs",
           "packed_support_log_probs", "masks_for_forward", "coverage_status", "main"]

# the key in the executor's dict and the Experience field
MASK_KEY = "sampling_mask"
_MARK = "_vllm_sampling_mask_openrlhf"

M_ENGINE = "openrlhf.trainer.ray.vllm_engine"
M_EXPERIENCE = "openrlhf.trainer.ppo_utils.experience"
M_SAMPLES = "openrlhf.trainer.ppo_utils.samples_generator"
M_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
M_LAUNCHER = "openrlhf.trainer.ray.launcher"
M_PPO_ACTOR = "openrlhf.trainer.ray.ppo_actor"
M_ACTOR = "openrlhf.models.actor"


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change to OpenRLHF, recorded like the overlay's vLLM patches: `install`
    registers its one hook (the function `@hook(name)` marks) for each of its
    `modules`."""

    name: str
    modules: tuple[str, ...]
    what: str
    why: str
    remove_when: str
    seams: str        # the part of OPENRLHF_SEAMS it relies on


_NO_FIELD = ("OpenRLHF has a field for a per-token sampling support (or a per-sample "
             "extra-fields dict its batching carries)")

PATCHES: tuple[Patch, ...] = (
    Patch("experience_field", (M_EXPERIENCE,),
          "Experience gets a `sampling_mask` list field",
          "its batching copies only the dataclass's fields()", _NO_FIELD,
          "experience"),
    Patch("rollout", (M_ENGINE,),
          "RolloutRayActor.generate_responses records each request's mask for the "
          "sample's dict",
          "executors return named keys built from the RequestOutput and drop the rest",
          "an executor's dict carries the RequestOutput's sampling_mask", "rollout"),
    Patch("experience", (M_SAMPLES,),
          "_process_response_into_experience puts the dict's mask on the Experience",
          "it builds the Experience from named keys only", _NO_FIELD, "experience"),
    Patch("old_logprobs", (M_MAKER, M_LAUNCHER, M_PPO_ACTOR),
          "make_experience sends each micro-batch's masks to the policy and reference "
          "actors' forward (PolicyModelActor.forward, ReferenceModelActor.forward)",
          "the forward calls take sequences, action_mask and attention_mask only",
          "those forwards take per-token supports", "old_logprobs"),
    Patch("train_step", (M_PPO_ACTOR,),
          "ActorPPOTrainer.training_step passes the experience's masks to Actor.forward "
          "and logs the support's coverage in its status",
          "it calls Actor.forward with sequences and masks only",
          "Actor.forward takes per-token supports", "train_step"),
    Patch("actor_forward", (M_ACTOR,),
          "Actor.forward takes action log-probabilities over each token's support",
          "it takes them over the full softmax", "Actor.forward takes per-token supports",
          "actor_forward"),
)

_installed = False


def runtime_env(env_vars: Optional[dict] = None) -> dict:
    """The Ray runtime environment of a masked OpenRLHF job: `install` in every worker
    and the engine flag in its environment, VLLM_SAMPLING_MASK_COVERAGE where the
    driver has it (plus `env_vars`)."""
    from vllm_sampling_mask.config import COVERAGE, RETURN

    passed = {COVERAGE: os.environ[COVERAGE]} if COVERAGE in os.environ else {}
    return {"worker_process_setup_hook": f"{__name__}.install",
            "env_vars": {RETURN: "1", **passed, **(env_vars or {})}}


def install() -> None:
    """Register the patches (idempotent): each OpenRLHF module is patched when it is
    imported, or now where it already is."""
    global _installed
    if _installed:
        return
    from vllm_sampling_mask.patches.apply import disabled

    if disabled():
        _installed = True
        return
    import wrapt

    for patch in PATCHES:
        for module in patch.modules:
            wrapt.register_post_import_hook(HOOKS[patch.name], module)
    _installed = True


HOOKS: dict = {}   # a record's name -> its hook (`hook`); checked against PATCHES below


def hook(name: str):
    """Mark the decorated function as the hook of the record named `name`."""
    def register(function):
        HOOKS[name] = function
        return function
    return register


# -- masks as rows: pure helpers ---------------------------------------------------------


def _pair(mask) -> tuple[np.ndarray, np.ndarray]:
    ids, offsets = (mask.ids, mask.offsets) if hasattr(mask, "offsets") else mask
    return np.asarray(ids, dtype=np.int32), np.asarray(offsets, dtype=np.int64)


def observation_rows(n_tokens: int, action_ranges: Sequence, masks: Sequence):
    """One support per observation token as `(ids, offsets)`: action range k's tokens
    get the rows of `masks[k]` (the k-th request's mask), every other token an empty
    row. The ranges and the masks must pair up, each range as long as its mask."""
    if len(action_ranges) != len(masks):
        raise ValueError(
            f"the agent executor returned {len(action_ranges)} action ranges but made "
            f"{len(masks)} engine requests: sampling masks need one action range per "
            "llm_engine.generate call, in order")
    counts = np.zeros(n_tokens, dtype=np.int64)
    pieces = []
    for k, ((start, end), mask) in enumerate(zip(action_ranges, masks)):
        ids, offsets = _pair(mask)
        if end - start != len(offsets) - 1 or start < 0 or end > n_tokens:
            raise ValueError(
                f"action range {k} ({start}, {end}) of {n_tokens} observation tokens does "
                f"not match its request's {len(offsets) - 1} generated tokens")
        counts[start:end] = np.diff(offsets)
        pieces.append((start, ids[offsets[0]:offsets[-1]]))
    pieces.sort(key=lambda p: p[0])
    ids = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.int32)
    offsets = offsets_of_counts(counts)
    return ids.astype(np.int32), offsets


def action_rows(rows, start: int, stop: int):
    """Rows `start:stop` of `(ids, offsets)` (OpenRLHF cuts the action mask as
    `[1:max_len]`)."""
    ids, offsets = _pair(rows)
    n = len(offsets) - 1
    start, stop = min(start, n), min(stop, n)
    sub = offsets[start:stop + 1]
    return ids[sub[0]:sub[-1]].copy(), (sub - sub[0]).astype(np.int64)


def _supports_at(masks, b_idx: np.ndarray, t_idx: np.ndarray):
    """`(ids, offsets)` over the positions `(b_idx[k], t_idx[k])` (sorted by sample,
    then column): row t of `masks[b]` where that mask has one, an empty row elsewhere."""
    counts = np.zeros(len(b_idx), dtype=np.int64)
    parts = []
    for b in np.unique(b_idx):
        mask = masks[b] if b < len(masks) else None
        if mask is None:
            continue
        ids, offsets = _pair(mask)
        where = np.nonzero(b_idx == b)[0]
        has = t_idx[where] < len(offsets) - 1
        rows = t_idx[where][has]
        starts = offsets[rows]
        lens = offsets[rows + 1] - starts
        parts.append(ids[np.repeat(starts - (np.cumsum(lens) - lens), lens)
                         + np.arange(lens.sum())])
        counts[where[has]] = lens
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    offsets = offsets_of_counts(counts)
    return ids.astype(np.int32), offsets


def _values_at(flat, rows, b_idx, t_idx, sequences, masks, coverage=False):
    """Log-probabilities of `sequences[b, t + 1]` from `flat[rows]` at the positions
    `(b_idx, t_idx)`, over each position's support (the full softmax without one);
    with `coverage`, also their `Coverage` (`training.support_coverage` on the same
    selected logits, without gradient), else None."""
    import torch

    from vllm_sampling_mask.training import nucleus_logprobs, support_coverage

    device = flat.device
    logits = flat.index_select(0, torch.as_tensor(rows, device=device))
    labels = sequences[torch.as_tensor(b_idx, device=sequences.device),
                       torch.as_tensor(t_idx + 1, device=sequences.device)].to(device)
    ids, offsets = _supports_at(masks, b_idx, t_idx)
    packed = (torch.as_tensor(ids, device=device), torch.as_tensor(offsets, device=device))
    values = nucleus_logprobs(logits, labels, packed, empty_support="full")
    cover = support_coverage(logits.detach(), packed) if coverage else None
    return values, cover


def _grid(cover, index, batch: int, columns: int):
    """A `Coverage`'s mass outside and sizes at the flat grid positions `index` as
    `[batch, columns]` tensors (0 elsewhere)."""
    mass = cover.mass_outside.new_zeros(batch * columns)
    sizes = cover.sizes.new_zeros(batch * columns)
    index = index.to(mass.device)
    return (mass.index_put((index,), cover.mass_outside).view(batch, columns),
            sizes.index_put((index,), cover.sizes.to(mass.device)).view(batch, columns))


def support_log_probs(logits, sequences, masks, columns: int, coverage: bool = False):
    """Log-probabilities `[B, columns]` of `sequences[:, 1:]` (column j: the token at
    j + 1, predicted by logits row j) over each token's support, where `masks[b]`
    (`(ids, offsets)` over the sample's first columns) gives one; the full softmax
    elsewhere (`empty_support="full"`). `logits` `[B, T, V]` are already divided by the
    temperature. Differentiable in `logits`.

    With `coverage`, returns `(log_probs, (mass_outside, sizes))`, the last two
    `[B, columns]` without gradient (`training.support_coverage`; 0 where a column has
    no support)."""
    import torch

    batch, length, _ = logits.shape
    if columns > length - 1:
        raise ValueError(f"{columns} columns but sequences of {length} tokens")
    b_idx = np.repeat(np.arange(batch), columns)
    t_idx = np.tile(np.arange(columns), batch)
    values, cover = _values_at(logits.reshape(batch * length, -1), b_idx * length + t_idx,
                               b_idx, t_idx, sequences, masks, coverage)
    if not coverage:
        return values.view(batch, columns)
    index = torch.arange(batch * columns)
    return values.view(batch, columns), _grid(cover, index, batch, columns)


def packed_support_log_probs(logits, sequences, attention_mask, masks, columns: int,
                             coverage: bool = False):
    """`support_log_probs` for OpenRLHF's packed layout (`--ds.packing_samples`):
    `logits` `[1, N, V]` are those of the N tokens where `attention_mask` `[B, T]` is
    set, in row-major order (OpenRLHF's `unpad_and_slice_tensor`, one ring-attention
    rank). Columns of padding tokens read 0, as OpenRLHF's `gather_and_pad_tensor`
    leaves them. Differentiable in `logits`. `coverage` as in `support_log_probs`."""
    import torch

    batch, length = sequences.shape
    if columns > length - 1:
        raise ValueError(f"{columns} columns but sequences of {length} tokens")
    flat = logits.reshape(-1, logits.shape[-1])
    where = torch.nonzero(attention_mask.reshape(-1)).flatten().cpu().numpy()
    if len(where) != flat.shape[0]:
        raise ValueError(f"{flat.shape[0]} packed logits rows for {len(where)} attended "
                         "tokens (ring attention splits them: --ds.ring_attn_size 1)")
    b_idx, t_idx = where // length, where % length
    keep = t_idx < columns
    values, cover = _values_at(flat, np.nonzero(keep)[0], b_idx[keep], t_idx[keep],
                               sequences, masks, coverage)
    out = values.new_zeros(batch * columns)
    index = torch.as_tensor(b_idx[keep] * columns + t_idx[keep], device=values.device)
    log_probs = out.index_put((index,), values).view(batch, columns)
    if not coverage:
        return log_probs
    return log_probs, _grid(cover, index, batch, columns)


# -- the masks for the next Actor.forward ----------------------------------------------

_pending: contextvars.ContextVar = contextvars.ContextVar("openrlhf_sampling_masks",
                                                         default=None)


@contextlib.contextmanager
def masks_for_forward(masks):
    """`Actor.forward` calls inside this block take their log-probabilities over
    `masks` (one `(ids, offsets)` or None per batch row)."""
    token = _pending.set(masks)
    try:
        yield
    finally:
        _pending.reset(token)


def _has_masks(masks) -> bool:
    return masks is not None and any(m is not None for m in masks)


def _actor_class(obj):
    """The class a Ray actor class instantiates (Ray's subclass of the decorated class,
    which holds its own copy of each method), or the class itself."""
    meta = getattr(obj, "__ray_metadata__", None)
    return obj if meta is None else meta.modified_class


def _wrap(cls, name, make):
    original = cls.__dict__.get(name) or getattr(cls, name)
    if getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


# -- experience_field ----------------------------------------------------------------


@hook("experience_field")
def patch_experience_field(module) -> None:
    """`Experience` gets the `sampling_mask` field (a list, like `prompts`)."""
    cls = module.Experience
    if MASK_KEY in cls.__dataclass_fields__:
        return
    # the field as `dataclasses` builds it (named, typed, a field to `fields()`)
    f, = dataclasses.fields(dataclasses.make_dataclass(
        "SamplingMaskField", [(MASK_KEY, list, dataclasses.field(default_factory=list))]))
    cls.__dataclass_fields__[MASK_KEY] = f
    cls.__annotations__[MASK_KEY] = list
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, sampling_mask=None, **kwargs):
        original(self, *args, **kwargs)
        self.sampling_mask = [] if sampling_mask is None else sampling_mask

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__


# -- rollout --------------------------------------------------------------------------


class _RecordingEngine:
    """The rollout actor as an executor sees it, with `generate` recording each
    request's mask, in call order. A request's own `return_sampling_mask` (in its
    `extra_args`) is kept; without one the engine's default applies: a mask where the
    sampling truncates (temperature > 0 and top-k, top-p or min-p), none otherwise
    (greedy, untruncated: empty rows, the full softmax)."""

    def __init__(self, actor):
        self._actor = actor
        self.masks: list = []

    def __getattr__(self, name):
        return getattr(self._actor, name)

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        output = await self._actor.generate(prompt_token_ids, sampling_params,
                                            multi_modal_data=multi_modal_data)
        out = output.outputs[0]
        error = getattr(out, "sampling_mask_error", None)
        if error is not None:
            raise ValueError(f"sampling mask of request {output.request_id}: {error}")
        n = len(out.token_ids)
        mask = getattr(out, "sampling_mask", None)
        if mask is None:
            self.masks.append((np.zeros(0, np.int32), np.zeros(n + 1, np.int64)))
            return output
        ids, offsets = _pair(mask)
        if len(offsets) - 1 > n:
            raise RuntimeError(f"the engine returned {len(offsets) - 1} supports for the "
                               f"{n} tokens of request {output.request_id}")
        # a mask that stopped early (the engine's size limit, `sampling_mask_reason`)
        # has no supports for the tokens after: empty rows, the full softmax
        offsets = np.concatenate([offsets, np.full(n + 1 - len(offsets), offsets[-1])])
        self.masks.append((ids, offsets.astype(np.int64)))
        return output


class _MaskingExecutor:
    """An agent executor whose samples carry `MASK_KEY` over their observation tokens."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def execute(self, *args, **kwargs):
        engine = _RecordingEngine(kwargs.pop("llm_engine"))
        out = await self.inner.execute(*args, llm_engine=engine, **kwargs)
        out[MASK_KEY] = observation_rows(len(out["observation_tokens"]),
                                         out["action_ranges"], engine.masks)
        return out


@hook("rollout")
def patch_rollout(module) -> None:
    """`RolloutRayActor.generate_responses` runs its executor through
    `_MaskingExecutor` where the engine has return_sampling_mask."""
    cls = _actor_class(module.RolloutRayActor)

    def make(original):
        async def generate_responses(self, *args, **kwargs):
            from vllm_sampling_mask.config import mask_enabled

            if not isinstance(self.executor, _MaskingExecutor) and \
                    mask_enabled(self.llm.vllm_config):
                self.executor = _MaskingExecutor(self.executor)
            return await original(self, *args, **kwargs)
        return generate_responses

    _wrap(cls, "generate_responses", make)


# -- experience ------------------------------------------------------------------------


@hook("experience")
def patch_experience(module) -> None:
    """`_process_response_into_experience` keeps the dict's mask, cut like the action
    mask (`[1:max_len]`)."""
    cls = module.SamplesGenerator

    def make(original):
        def _process_response_into_experience(self, response, **generate_kwargs):
            experience = original(self, response, **generate_kwargs)
            rows = response.get(MASK_KEY)
            if rows is not None:
                truncate_length = generate_kwargs.get("max_len", 2048)
                experience.sampling_mask = [action_rows(rows, 1, truncate_length)]
            else:
                experience.sampling_mask = [None]
            return experience
        return _process_response_into_experience

    _wrap(cls, "_process_response_into_experience", make)


# -- old_logprobs ----------------------------------------------------------------------

_batch_masks: contextvars.ContextVar = contextvars.ContextVar("openrlhf_batch_masks",
                                                             default=None)


def _patch_maker(module) -> None:
    """`make_experience` sends each micro-batch's masks along with the policy's and the
    reference's forward (`_dispatch_forward`)."""
    cls = module.RemoteExperienceMaker

    def make_make(original):
        def make_experience(self, samples_list):
            masks = [list(getattr(s, MASK_KEY, None) or [None] * len(s.sequences))
                     for s in samples_list]
            if not any(_has_masks(m) for m in masks):
                return original(self, samples_list)
            token = _batch_masks.set(masks)
            try:
                return original(self, samples_list)
            finally:
                _batch_masks.reset(token)
        return make_experience

    def make_dispatch(original):
        def _dispatch_forward(self, group, sync_condition, **kwargs):
            masks = _batch_masks.get()
            if masks is not None and "action_mask" in kwargs and group in (
                    self.actor_model_group, self.initial_model_group):
                kwargs[MASK_KEY] = masks
            return original(self, group, sync_condition, **kwargs)
        return _dispatch_forward

    _wrap(cls, "make_experience", make_make)
    _wrap(cls, "_dispatch_forward", make_dispatch)


def _forward_taking_masks(original):
    def forward(self, *args, sampling_mask=None, **kwargs):
        if not _has_masks(sampling_mask):
            return original(self, *args, **kwargs)
        with masks_for_forward(sampling_mask):
            return original(self, *args, **kwargs)
    return forward


@hook("old_logprobs")
def patch_old_logprobs(module) -> None:
    """The experience maker sends the masks (`_patch_maker`); the reference's
    (launcher) and the policy's (ppo_actor) `forward` take `sampling_mask=`."""
    if module.__name__ == M_MAKER:
        _patch_maker(module)
    elif module.__name__ == M_LAUNCHER:
        _wrap(_actor_class(module.ReferenceModelActor), "forward", _forward_taking_masks)
    else:
        _wrap(_actor_class(module.PolicyModelActor), "forward", _forward_taking_masks)


# -- train_step ------------------------------------------------------------------------


COVERAGE_METRICS = ("sampling_mask/mass_outside_support", "sampling_mask/support_size")
# the training step's coverage sums, filled by Actor.forward (None: not asked for)
_coverage_sums: contextvars.ContextVar = contextvars.ContextVar("openrlhf_coverage",
                                                               default=None)


def coverage_status(sums) -> dict:
    """The two coverage means from `[mass outside, support size, tokens]` sums."""
    mass, size, count = sums
    return {COVERAGE_METRICS[0]: mass / count, COVERAGE_METRICS[1]: size / count}


@hook("train_step")
def patch_train_step(module) -> None:
    """`training_step` passes the experience's masks to `Actor.forward` and, unless
    VLLM_SAMPLING_MASK_COVERAGE=0, puts the coverage of its action tokens with a
    support in the status it returns (two 0-d tensors weighted "token", as OpenRLHF
    weighs its per-token losses)."""

    def make(original):
        def training_step(self, experience, *args, **kwargs):
            import torch

            from vllm_sampling_mask.config import coverage_enabled

            masks = getattr(experience, MASK_KEY, None)
            if not _has_masks(masks):
                return original(self, experience, *args, **kwargs)
            sums = [0.0, 0.0, 0] if coverage_enabled() else None
            token = _coverage_sums.set(sums)
            try:
                with masks_for_forward(masks):
                    status = original(self, experience, *args, **kwargs)
            finally:
                _coverage_sums.reset(token)
            if sums is not None and sums[2] > 0 and isinstance(status, dict) \
                    and "metrics" in status:
                for name, value in coverage_status(sums).items():
                    status["metrics"][name] = torch.tensor(value, dtype=torch.float64)
                    status.setdefault("weights", {})[name] = "token"
            return status
        return training_step

    _wrap(module.ActorPPOTrainer, "training_step", make)


# -- actor_forward ---------------------------------------------------------------------


@hook("actor_forward")
def patch_actor_forward(module) -> None:
    """`Actor.forward` takes the action log-probabilities over the supports in
    `masks_for_forward` (or its `sampling_mask=` argument)."""

    def make(original):
        def forward(self, sequences, action_mask=None, attention_mask=None, *args,
                    sampling_mask=None, **kwargs):
            masks = sampling_mask if sampling_mask is not None else _pending.get()
            if action_mask is None or not _has_masks(masks):
                return original(self, sequences, action_mask, attention_mask, *args, **kwargs)
            packed = getattr(self, "packing_samples", False)
            if packed and kwargs.get("ring_attn_group") is not None:
                raise ValueError(
                    "sampling masks with ring attention are not supported: run with "
                    "--ds.ring_attn_size 1 (or without the sampling-mask launcher)")
            if len(masks) != sequences.shape[0]:
                raise ValueError(f"{len(masks)} sampling masks for a batch of "
                                 f"{sequences.shape[0]} sequences")
            want_output = kwargs.pop("return_output", False)
            _, output = original(self, sequences, action_mask, attention_mask, *args,
                                 return_output=True, **kwargs)
            columns = sequences.shape[1] - 1
            sums = _coverage_sums.get()
            coverage = sums is not None
            if packed:
                log_probs = packed_support_log_probs(output["logits"], sequences,
                                                     attention_mask, masks, columns, coverage)
            else:
                log_probs = support_log_probs(output["logits"], sequences, masks, columns,
                                              coverage)
            if coverage:
                from vllm_sampling_mask.training import Coverage

                log_probs, (mass, sizes) = log_probs
                actions = slice(-action_mask.shape[1], None)
                mass_sum, size_sum, count = Coverage(
                    mass[:, actions], sizes[:, actions], None
                ).totals(action_mask).tolist()                  # one host sync
                sums[0] += mass_sum
                sums[1] += size_sum
                sums[2] += int(count)
            action_log_probs = log_probs[:, -action_mask.shape[1]:] * action_mask.float()
            return (action_log_probs, output) if want_output else action_log_probs
        return forward

    _wrap(module.Actor, "forward", make)


# -- the launcher ----------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> None:
    """`openrlhf.cli.train_ppo_ray` with sampling masks (its arguments unchanged)."""
    import runpy
    import sys

    import ray

    argv = list(sys.argv[1:] if argv is None else argv)
    install()
    if not ray.is_initialized():
        # OpenRLHF's own defaults for these (train_ppo_ray.train), kept
        ray.init(runtime_env=runtime_env({
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM", "true"),
            "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN"),
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS":
                os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "1")}))
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


# every record has its one hook, every hook its record
if set(HOOKS) != {patch.name for patch in PATCHES}:
    raise RuntimeError(f"OpenRLHF patch records {sorted(p.name for p in PATCHES)} and "
                       f"hooks {sorted(HOOKS)} differ")


if __name__ == "__main__":
    main()
