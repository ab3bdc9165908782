"""The hidden-state op: ``nucleus_logprobs_from_hidden``, never the ``[T, V]`` logits.

From the last hidden states ``[T, H]`` and the LM head ``[V, H]`` (optional
bias ``[V]``).  Since ``log pi`` needs logits only on ``S_t``, only those N
logits (plus the T sampled ones) are computed: a sampled dense-dense product
(SDDMM, ``z_k = W[id_k] . h[t_k]``, O((N + T) * H) work) instead of the
``[T, V]`` matmul (O(T * V * H)).  The pairs are processed in vocabulary-id
order, so each weight row is read once and contiguously however many supports
contain it (on CPU through ``torch.sparse.sampled_addmm`` on a CSR pattern;
elsewhere by gathering weight rows in chunks of at most ``chunk_size``).  The
weight is used in place when it is already in the compute dtype; otherwise
(bf16 / fp16) it is converted block by block, ``chunk_size`` vocabulary rows
at a time (default: 256 MiB of float32), so the working set stays bounded.

The backward is hand-written too: ``grad_hidden`` is an ``embedding_bag`` of
weight rows per token weighted by the coefficients
``(1[v == a_t] - p_t(v)) * g_t / temp_t``, ``grad_weight`` an
``embedding_bag`` of hidden rows per vocabulary id written block by block into
the one ``[V, H]`` buffer the weight gradient needs, ``grad_bias`` an
``index_add``.  No ``[T, V]`` tensor exists at any point; memory beyond the
inputs and their gradients is O(N + T * H + chunk_size * H).

The index layouts both passes read are named types built once per call by
:func:`build_layout`: :class:`PairLayout` holds the pairs in id-major order
(:class:`IdMajorPairs`), in block-then-token order (:class:`TokenMajorPairs`)
and the vocabulary blocks (:class:`VocabBlocks`, iterated as
:class:`VocabBlock`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .inputs import MaskLike, Temperature, compute_dtype, prepare
from .logits import full_rows
from .segments import segment_logsumexp

__all__ = [
    "IdMajorPairs",
    "PairLayout",
    "TokenMajorPairs",
    "VocabBlock",
    "VocabBlocks",
    "build_layout",
    "nucleus_logprobs_from_hidden",
]

_DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
# The SDDMM kernel: "sparse" (torch.sparse.sampled_addmm, the fast CPU path)
# or "gather" (gathered weight rows in chunks, any device).  `None` picks
# sparse on CPU and gather elsewhere.  Tests force each one.
_SDDMM_KERNEL: Optional[str] = None


# ---------------------------------------------------------------------------
# Index layouts
# ---------------------------------------------------------------------------
#
# The pairs (token t, vocabulary id v) whose logits are needed: the N support
# entries (t, ids[k]) plus one entry (t, a_t) per token for the sampled logit,
# n = N + T pairs in all.  All index tensors are int64 on the op's device.

class IdMajorPairs(NamedTuple):
    """The n pairs sorted by vocabulary id, then token (stable).

    The forward SDDMM and ``grad_weight`` run in this order, so each weight
    row is read once, contiguously.  Read as a CSR matrix ``[V, T]``: row
    ``v`` lists the tokens whose support (or sampled id) contains ``v``.

    Attributes:
        vocab_ids: ``[n]`` the pair's vocabulary id (non-decreasing).
        tokens: ``[n]`` the pair's token position ``t`` (the CSR columns).
        row_ptr: ``[V + 1]`` CSR row pointers: the pairs of id ``v`` are
            ``row_ptr[v]:row_ptr[v + 1]``.
        target_pos: ``[T]`` position of token ``t``'s sampled pair ``(t, a_t)``.
        is_target: ``[n]`` bool, True at those T sampled pairs (they give the
            sampled logit and take no part in the normaliser).
    """

    vocab_ids: torch.Tensor
    tokens: torch.Tensor
    row_ptr: torch.Tensor
    target_pos: torch.Tensor
    is_target: torch.Tensor


class TokenMajorPairs(NamedTuple):
    """The same n pairs sorted by (vocabulary block, token): ``grad_hidden``'s order.

    ``grad_hidden`` runs one ``embedding_bag`` per vocabulary block with one
    bag per token.  With a single block this is the plain token order (each
    token's support, then its sampled pair), known in closed form.

    Attributes:
        vocab_ids: ``[n]`` the pair's vocabulary id.
        id_major_pos: ``[n]`` where the pair sits in :class:`IdMajorPairs`
            order (to read the per-pair coefficients computed there).
        row_ptr: ``[n_blocks, T + 1]`` bag pointers per block, relative to
            the block's first pair: in block ``b`` the pairs of token ``t``
            are ``row_ptr[b, t]:row_ptr[b, t + 1]``.
    """

    vocab_ids: torch.Tensor
    id_major_pos: torch.Tensor
    row_ptr: torch.Tensor


class VocabBlock(NamedTuple):
    """One block of vocabulary rows and the pairs that fall in it.

    Attributes:
        index: block number ``b``.
        pair_start: first pair of the block (the same in id-major and
            token-major order).
        pair_end: one past the block's last pair.
        vocab_start: first vocabulary id of the block.
        vocab_rows: vocabulary ids in the block (``block_size``, fewer in the
            last block).
    """

    index: int
    pair_start: int
    pair_end: int
    vocab_start: int
    vocab_rows: int


class VocabBlocks(NamedTuple):
    """The vocabulary cut into blocks of ``block_size`` rows.

    A block is the unit in which a weight in another dtype is converted to the
    compute dtype, so the working set stays ``block_size * H``.  Both pair
    orders group pairs by block first, so block ``b`` is the same pair range
    in both.

    Attributes:
        vocab_size: V.
        block_size: vocabulary rows per block (the last may have fewer).
        pair_bounds: ``count + 1`` ints: block ``b``'s pairs are
            ``pair_bounds[b]:pair_bounds[b + 1]``.
    """

    vocab_size: int
    block_size: int
    pair_bounds: tuple[int, ...]

    @property
    def count(self) -> int:
        """Number of blocks (at least 1)."""
        return len(self.pair_bounds) - 1

    def each(self) -> Iterator[VocabBlock]:
        """The blocks in vocabulary order."""
        for b in range(self.count):
            v0 = b * self.block_size
            yield VocabBlock(b, self.pair_bounds[b], self.pair_bounds[b + 1], v0,
                             min(self.block_size, self.vocab_size - v0))


class PairLayout(NamedTuple):
    """Everything the forward and the backward index with, built once per call.

    Attributes:
        id_major: the pairs in vocabulary order (forward, ``grad_weight``, ``grad_bias``).
        token_major: the pairs in (block, token) order (``grad_hidden``).
        blocks: the vocabulary blocks.
    """

    id_major: IdMajorPairs
    token_major: TokenMajorPairs
    blocks: VocabBlocks


def build_layout(ids: torch.Tensor, offsets: torch.Tensor, seg: torch.Tensor,
                 tok: torch.Tensor, T: int, V: int, chunk: int) -> PairLayout:
    """The :class:`PairLayout` of a (valid) packed mask, ``chunk`` vocabulary rows a block.

    No host synchronisation with one block; one (the block boundaries) with
    several.
    """
    device = ids.device
    N = ids.numel()
    n = N + T
    rows = torch.arange(T, device=device)
    n_blocks = max(1, -(-V // chunk))
    # Token order with each token's sampled id after its support:
    # positions are known in closed form (no sort, no sync).
    pos_support = torch.arange(N, device=device) + seg
    pos_target = offsets[1:] + rows
    cols_tm = torch.empty(n, dtype=torch.int64, device=device)
    segs_tm = torch.empty(n, dtype=torch.int64, device=device)
    cols_tm[pos_support] = ids.to(torch.int64)
    cols_tm[pos_target] = tok
    segs_tm[pos_support] = seg
    segs_tm[pos_target] = rows
    # Id-major order.
    perm = torch.sort(cols_tm, stable=True).indices
    im_of_tm = torch.empty_like(perm)
    im_of_tm[perm] = torch.arange(n, device=device)
    target_pos = im_of_tm[pos_target]
    is_target = torch.zeros(n, dtype=torch.bool, device=device)
    is_target[target_pos] = True
    row_ptr = torch.zeros(V + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(cols_tm, minlength=V), 0, out=row_ptr[1:])
    id_major = IdMajorPairs(vocab_ids=cols_tm[perm], tokens=segs_tm[perm], row_ptr=row_ptr,
                            target_pos=target_pos, is_target=is_target)
    if n_blocks == 1:
        bounds = (0, n)
        token_major = TokenMajorPairs(
            vocab_ids=cols_tm, id_major_pos=im_of_tm,
            row_ptr=(offsets + torch.arange(T + 1, device=device)).unsqueeze(0))
    else:
        starts = torch.arange(0, V, chunk, device=device)
        edges = torch.cat([starts, torch.tensor([V], device=device)])
        bounds = tuple(row_ptr[edges].tolist())                         # the one sync
        key = torch.div(cols_tm, chunk, rounding_mode="floor") * T + segs_tm
        perm_h = torch.sort(key, stable=True).indices
        counts = torch.bincount(key, minlength=n_blocks * T).view(n_blocks, T)
        crow_h = torch.zeros(n_blocks, T + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, dim=1, out=crow_h[:, 1:])
        token_major = TokenMajorPairs(vocab_ids=cols_tm[perm_h], id_major_pos=im_of_tm[perm_h],
                                      row_ptr=crow_h)
    return PairLayout(id_major=id_major, token_major=token_major,
                      blocks=VocabBlocks(vocab_size=V, block_size=chunk, pair_bounds=bounds))


# ---------------------------------------------------------------------------
# SDDMM and the autograd function
# ---------------------------------------------------------------------------

def _kernel(device: torch.device) -> str:
    if _SDDMM_KERNEL is not None:
        return _SDDMM_KERNEL
    return "sparse" if device.type == "cpu" else "gather"


def _sddmm_block(h, w_block, crow, tokens, cols, kernel: str, pair_chunk: int):
    """``out[k] = w_block[row k] . h[tokens[k]]`` for one block's id-major pairs.

    ``crow`` are the block's CSR row pointers (one row per vocabulary id),
    ``cols`` the pairs' vocabulary ids relative to the block (gather kernel).
    """
    n = tokens.numel()
    if kernel == "sparse":
        with warnings.catch_warnings():
            # torch warns that sparse CSR is "beta"; only its sampled_addmm is used.
            warnings.simplefilter("ignore", UserWarning)
            csr = torch.sparse_csr_tensor(
                crow, tokens, torch.zeros(n, dtype=h.dtype, device=h.device),
                size=(w_block.shape[0], h.shape[0]), check_invariants=False)
        return torch.sparse.sampled_addmm(csr, w_block, h.t(), beta=0.0).values()
    out = torch.empty(n, dtype=h.dtype, device=h.device)
    for a in range(0, n, pair_chunk):
        b = min(n, a + pair_chunk)
        out[a:b] = torch.linalg.vecdot(w_block.index_select(0, cols[a:b]),
                                       h.index_select(0, tokens[a:b]))
    return out


class _NucleusFromHidden(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, layout: PairLayout, temp, temp_scalar, kernel: str,
                pair_chunk: int):
        cdt = temp.dtype
        T = hidden.shape[0]
        h = hidden.to(cdt)
        im = layout.id_major
        z = torch.empty(im.vocab_ids.numel(), dtype=cdt, device=hidden.device)
        for blk in layout.blocks.each():
            p0, p1, v0, nv = blk.pair_start, blk.pair_end, blk.vocab_start, blk.vocab_rows
            if p1 == p0:
                continue
            w_block = weight[v0:v0 + nv].to(cdt)
            crow = im.row_ptr[v0:v0 + nv + 1] - p0
            z[p0:p1] = _sddmm_block(h, w_block, crow, im.tokens[p0:p1],
                                    im.vocab_ids[p0:p1] - v0, kernel, pair_chunk)
        if bias is not None:
            z += bias.to(cdt)[im.vocab_ids]
        if temp_scalar is not None:
            z.div_(temp_scalar)
        else:
            z.div_(temp[im.tokens])
        target = z[im.target_pos]
        # The sampled entries take no part in the normaliser (weight 0).
        x = z.masked_fill_(im.is_target, -math.inf)
        lse, e, s = segment_logsumexp(x, im.tokens, T)
        ctx.save_for_backward(hidden, weight, bias, temp, e, s)
        ctx.layout, ctx.kernel = layout, kernel
        return target - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, temp, e, s = ctx.saved_tensors
        layout: PairLayout = ctx.layout
        im, tm = layout.id_major, layout.token_major
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        cdt = temp.dtype
        T, H = hidden.shape
        g = grad_out.to(cdt) / temp
        # d out / d z for every pair (id-major): +g on the sampled entry, -p*g
        # on each support entry.  All sums below run in `cdt`.
        p = e / s[im.tokens]
        coef = (im.is_target.to(cdt) - p).mul_(g[im.tokens])
        coef_h = coef[tm.id_major_pos] if need_h else None
        h = hidden.to(cdt) if need_w else None
        grad_h = grad_w = grad_b = None
        if need_h:
            grad_h = torch.zeros((T, H), dtype=cdt, device=hidden.device)
        in_place_w = layout.blocks.count == 1 and weight.dtype == cdt
        if need_w and not in_place_w:
            grad_w = torch.empty_like(weight)
        for blk in layout.blocks.each():
            b, p0, p1 = blk.index, blk.pair_start, blk.pair_end
            v0, nv = blk.vocab_start, blk.vocab_rows
            w_block = weight[v0:v0 + nv].to(cdt) if (need_h and p1 > p0) else None
            if need_h and p1 > p0:
                # grad_hidden[t] += sum_k coef_k * W[id_k]: one bag per token.
                grad_h += F.embedding_bag(tm.vocab_ids[p0:p1] - v0, w_block, tm.row_ptr[b],
                                          mode="sum", per_sample_weights=coef_h[p0:p1],
                                          include_last_offset=True)
            if need_w:
                # grad_W[v] = sum_k coef_k * hidden[t_k]: one bag per vocabulary id.
                rows = F.embedding_bag(im.tokens[p0:p1], h, im.row_ptr[v0:v0 + nv + 1] - p0,
                                       mode="sum", per_sample_weights=coef[p0:p1],
                                       include_last_offset=True)
                if in_place_w:
                    grad_w = rows
                else:
                    grad_w[v0:v0 + nv].copy_(rows)
        if need_b:
            grad_b = torch.zeros(bias.shape[0], dtype=cdt, device=bias.device)
            grad_b.index_add_(0, im.vocab_ids, coef)
            grad_b = grad_b.to(bias.dtype)
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None


def nucleus_logprobs_from_hidden(hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                                 token_ids, mask: MaskLike,
                                 temperature: Temperature = 1.0,
                                 bias: Optional[torch.Tensor] = None, *,
                                 validate: bool = True,
                                 chunk_size: Optional[int] = None,
                                 empty_support: str = "error") -> torch.Tensor:
    """:func:`nucleus_logprobs` of ``hidden @ lm_head_weight.T (+ bias)``, without the logits.

    Only the logits on each support (and of each sampled token) are computed:
    O(N * H) work and O(N + T * H) memory instead of the ``[T, V]`` matmul.

    Args:
        hidden: ``[T, H]`` final hidden states at the positions that produced
            the T generated tokens.
        lm_head_weight: ``[V, H]`` output projection (tied embeddings work).
        token_ids, mask, temperature, validate, empty_support: as in
            :func:`nucleus_logprobs` (with ``"full"``, the E tokens without a
            mask get their ``[E, V]`` logits formed densely).
        bias: optional ``[V]`` output bias.
        chunk_size: vocabulary rows converted to the compute dtype at once,
            and weight rows gathered per step by the non-CPU kernel.
            Default: 256 MiB of float32, ``256 MiB // (4 * H)`` rows.  On CPU
            a weight already in the compute dtype (float32, float64) is read
            in place as one block unless ``chunk_size`` is given.

    Returns:
        ``[T]`` float32 tensor (float64 for float64 inputs), differentiable
        with respect to ``hidden``, ``lm_head_weight`` and ``bias``.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError("hidden must be a [T, H] tensor")
    if not isinstance(lm_head_weight, torch.Tensor) or lm_head_weight.dim() != 2:
        raise ValueError("lm_head_weight must be a [V, H] tensor")
    if not (hidden.dtype.is_floating_point and lm_head_weight.dtype.is_floating_point):
        raise ValueError("hidden and lm_head_weight must be floating tensors")
    T, H = hidden.shape
    V, H2 = lm_head_weight.shape
    if H2 != H:
        raise ValueError(f"hidden is [T, {H}] but lm_head_weight is [V, {H2}]: "
                         "hidden sizes differ")
    if lm_head_weight.device != hidden.device:
        raise ValueError("hidden and lm_head_weight must be on the same device")
    if bias is not None:
        if bias.shape != (V,):
            raise ValueError(f"bias must be [V]=[{V}] (got {tuple(bias.shape)})")
        if bias.device != hidden.device:
            raise ValueError("bias must be on the same device as hidden")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer (got {chunk_size})")
    device = hidden.device
    cdt = compute_dtype(hidden, lm_head_weight, bias)
    pr = prepare(T, V, token_ids, mask, temperature, device, cdt, validate, empty_support)
    kernel = _kernel(device)
    budget_rows = max(1, _DEFAULT_CHUNK_BYTES // (4 * max(H, 1)))
    if chunk_size is not None:
        chunk = chunk_size
    elif kernel == "sparse" and lm_head_weight.dtype == cdt:
        chunk = max(V, 1)
    else:
        chunk = budget_rows
    layout = build_layout(pr.ids, pr.offsets, pr.seg, pr.tok, T, V, chunk)
    pair_chunk = max(1, min(chunk, budget_rows) // 2)
    out = _NucleusFromHidden.apply(hidden, lm_head_weight, bias, layout, pr.temp,
                                   pr.temp_scalar, kernel, pair_chunk)
    if pr.unmasked is None:
        return out
    rows = pr.unmasked
    z = F.linear(hidden.index_select(0, rows).to(cdt), lm_head_weight.to(cdt),
                 None if bias is None else bias.to(cdt))
    return full_rows(out, rows, z / pr.temp[rows, None], pr.tok)
