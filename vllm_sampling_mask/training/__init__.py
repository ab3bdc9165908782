"""Trainer-side log-probabilities under a sampling mask.

When the engine samples token ``a_t`` with top-k / top-p / min-p, it draws from
the renormalised distribution over the *support* ``S_t`` (the ids that survived
the truncation), not from the full softmax.  The sampling mask records ``S_t``
for every generated token; this package recomputes, on the trainer's own logits,
the log-probability of the action under that same distribution::

    z_t        = logits[t] / temp_t                      (temperature first,
                                                          as the sampler did)
    log pi_t   = z_t[a_t] - logsumexp_{v in S_t} z_t[v]

and its gradient::

    d log pi_t / d logits[t, v] = (1[v == a_t] - p_t(v)) / temp_t    for v in S_t
                                = 0                                  otherwise

with ``p_t(v) = softmax(z_t restricted to S_t)[v]``.  Ids outside the support
get exactly zero gradient, which is the point: the policy gradient is taken
with respect to the distribution the rollout actually used.

Packed mask layout (shared with :class:`~vllm_sampling_mask.frontend.sampling_mask.SamplingMask`)::

    ids      [N]      every support concatenated, N = sum_t |S_t|
    offsets  [T + 1]  offsets[0] == 0, offsets[-1] == N, non-decreasing;
                      support t is ids[offsets[t]:offsets[t + 1]]

Several sequences can be packed along ``T``: concatenate their logits rows,
their token ids and their masks (``pack_masks``, i.e. ``SamplingMask.concat``).

Entry points
------------
``nucleus_logprobs(logits, token_ids, mask, temperature=1.0)``
    From ``[T, V]`` logits: the kept logits are gathered with one flat index,
    reduced per support by a segmented log-sum-exp; hand-written backward.
    Extra memory O(N + T) besides the ``[T, V]`` gradient autograd needs.

``nucleus_logprobs_from_hidden(hidden, lm_head_weight, token_ids, mask, ...)``
    From the last hidden states ``[T, H]`` and the LM head ``[V, H]``
    (optional bias ``[V]``): only the N + T needed logits are formed (an
    SDDMM, O((N + T) * H) work, weight rows read once in vocabulary order);
    hand-written backward; no ``[T, V]`` tensor at any point.

``full_logprobs(logits, token_ids, temperature=1.0)``
    The untruncated counterpart ``z_t[a_t] - logsumexp_v z_t[v]`` (dense,
    O(T * V) memory, plain autograd).

``importance_ratio(new_logprobs, old_logprobs, clip=None)``
    ``exp(new - old)`` with the old log-probabilities treated as constants,
    optionally clamped.

``ratio_statistics(new_logprobs, old_logprobs, support_sizes=None, band=(0.9, 1.1))``
    Summary of the trainer/engine mismatch as a plain dict of Python numbers
    (k3 KL estimate, ratio mean and percentiles, share outside a band,
    support-size figures): for logs and replay checks, no gradient.

``support_coverage(logits_or_hidden, mask, temperature, lm_head_weight=None, ...)``
    Per token, without gradient: the trainer's full-softmax mass outside the
    support, the support size and optionally the entropy, ``[rows, V]``
    logits a chunk at a time (a :class:`Coverage` of ``[T]`` tensors).

``mask_to_tensors(mask, device=None)``, ``pack_masks(masks, device=None)``
    A mask, or a batch of them packed along T, as ``(ids, offsets)`` int64
    tensors on a device.

Package layout
--------------
The names above are the API; the modules are how it is organised:

``inputs``
    Input normalisation and validation (mask / offsets / token / temperature
    checks, ``mask_to_tensors``, ``pack_masks``).
``segments``
    Segmented operations on packed supports (segment ids, segment
    log-sum-exp, flat index helpers).
``logits``
    The logits op: ``nucleus_logprobs``, ``full_logprobs``.
``hidden``
    The hidden-state op: ``nucleus_logprobs_from_hidden`` and its index
    layouts (``PairLayout`` and its parts, named tuples).
``ratio``
    ``importance_ratio``, ``ratio_statistics``.
``coverage``
    ``support_coverage`` and its result type ``Coverage``.

Precision: everything is computed in float32 (float64 when an input is
float64), whatever the input dtype; the result is float32 (float64 for float64
inputs).  Gradients are accumulated in that precision and cast once to the
input dtype.

Validation (``validate=True``, the default) checks every bad input below and
raises ``ValueError`` naming the token position ``t``:

* length mismatches between logits / hidden, token_ids and the mask;
* offsets not starting at 0, decreasing, or not ending at ``len(ids)``;
* an empty support (unless ``empty_support="full"``: such a token has no mask,
  and its log-probability is the full softmax's); an id outside ``[0, V)``; an
  id listed twice in a support;
* a sampled token outside ``[0, V)`` or not inside its support;
* a non-positive (or NaN / infinite) temperature.

It is vectorised: at most two device-to-host synchronisations per call (three
when a support is not in ascending order and has to be checked for duplicate
ids), never one per token.  ``validate=False`` skips it for the hot loop; the
result on invalid input is then unspecified (a sampled token outside its
support just gives the formula's value, which can be positive).

Synchronisations with ``validate=False``: none for ``nucleus_logprobs``; none
for ``nucleus_logprobs_from_hidden`` when the weight is processed as one block
(a float32 weight on CPU), one (the block boundaries) otherwise.

``torch.compile``: ``nucleus_logprobs`` compiles; with ``validate=False`` it
is a single graph with no break (the custom ``autograd.Function`` is traced
by Dynamo, forward and backward).  Validation reads a few values on the host,
so with ``validate=True`` Dynamo splits the graph there (it still compiles
and gives the same results).  ``full_logprobs`` compiles.
``nucleus_logprobs_from_hidden`` works under ``torch.compile`` but not as one
graph: Dynamo does not support creating sparse tensors (the CPU SDDMM) and
the block loop depends on data, so those parts run eagerly between graph
breaks.  Checked with torch 2.13 on CPU.

This package depends on torch, numpy, the standard library and the numpy-only
``vllm_sampling_mask.frontend.sampling_mask``.
"""

from __future__ import annotations

from .coverage import Coverage, support_coverage
from .hidden import nucleus_logprobs_from_hidden
from .inputs import mask_to_tensors, pack_masks
from .logits import full_logprobs, nucleus_logprobs
from .ratio import importance_ratio, ratio_statistics

__all__ = [
    "Coverage",
    "full_logprobs",
    "importance_ratio",
    "mask_to_tensors",
    "nucleus_logprobs",
    "nucleus_logprobs_from_hidden",
    "pack_masks",
    "ratio_statistics",
    "support_coverage",
]
