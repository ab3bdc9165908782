"""The plain-PyTorch CPU kernels (vllm_sampling_mask.worker.cpu_kernels) against plain
references: paged attention against torch's scaled_dot_product_attention over
contiguous keys (GQA, chunked prefill, prefix-cached blocks shared by two sequences,
a sliding window), soft-capping, sinks and ALiBi against the formula written out,
rotary embedding against a complex-number rotation, and the registration that adds a
kernel only where an op has none on CPU. No vLLM needed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vllm_sampling_mask.worker import cpu_kernels as ck

HEAD = 32


def _paged(seqs, kv_heads, block_size, num_blocks=64, shared_prefix_blocks=0, seed=0):
    """Scatter each sequence's keys/values (`[len, kv_heads, d]`) into a paged cache
    of the CPU backend's layout (keys and values in the two halves of each block)
    through `write_kv_cache`, over shuffled blocks. With `shared_prefix_blocks`, every
    sequence's first blocks are the first sequence's (prefix caching): their keys are
    written once, by the first sequence."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.zeros(num_blocks, kv_heads, 2 * block_size, HEAD)
    key_cache, value_cache = cache.chunk(2, dim=2)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(math.ceil(len(k) / block_size) for k, _ in seqs)
    table = torch.full((len(seqs), width + 2), 0, dtype=torch.int32)
    shared = [free.pop() for _ in range(shared_prefix_blocks)]
    for i, (k, v) in enumerate(seqs):
        need = math.ceil(len(k) / block_size)
        own = shared + [free.pop() for _ in range(need - len(shared))]
        table[i, :need] = torch.tensor(own, dtype=torch.int32)
        first = 0 if i == 0 else len(shared) * block_size  # shared rows written once
        positions = torch.arange(first, len(k))
        slots = torch.tensor([own[p // block_size] * block_size + p % block_size
                              for p in positions.tolist()], dtype=torch.int64)
        # padding slots (-1) in the batch are skipped
        slots = torch.cat((slots, torch.tensor([-1, -1])))
        pad = torch.full((2, kv_heads, HEAD), 99.0)
        ck.write_kv_cache(torch.cat((k[first:], pad)), torch.cat((v[first:], pad)),
                          key_cache, value_cache, slots)
    return key_cache, value_cache, table


def _reference(q, k, v, scale, *, window=-1, causal=True):
    """SDPA over one sequence: q `[n, heads, d]` (the last n positions), k/v
    `[len, kv_heads, d]`."""
    n, length = q.shape[0], k.shape[0]
    q_pos = torch.arange(length - n, length)[:, None]
    k_pos = torch.arange(length)[None, :]
    mask = torch.ones(n, length, dtype=torch.bool)
    if causal:
        mask &= k_pos <= q_pos
    if window > 0:
        mask &= k_pos > q_pos - window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _run(seqs, query_lens, heads, kv_heads, block_size, shared=0, **options):
    gen = torch.Generator().manual_seed(1)
    key_cache, value_cache, table = _paged(seqs, kv_heads, block_size,
                                           shared_prefix_blocks=shared)
    queries = [torch.randn(n, heads, HEAD, generator=gen) for n in query_lens]
    query = torch.cat(queries)
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([len(k) for k, _ in seqs], dtype=torch.int32)
    output = torch.full_like(query, float("nan"))
    ck.paged_attention(query, key_cache, value_cache, output, starts, seq_lens, table,
                       HEAD ** -0.5, **options)
    return queries, output.split(list(query_lens))


def _seqs(lengths, kv_heads, seed=2, shared_prefix=0):
    gen = torch.Generator().manual_seed(seed)
    seqs = [(torch.randn(n, kv_heads, HEAD, generator=gen),
             torch.randn(n, kv_heads, HEAD, generator=gen)) for n in lengths]
    if shared_prefix:
        k0, v0 = seqs[0]
        seqs = [(torch.cat((k0[:shared_prefix], k[shared_prefix:])),
                 torch.cat((v0[:shared_prefix], v[shared_prefix:]))) for k, v in seqs]
    return seqs


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_attention_matches_sdpa_over_a_mixed_batch(block_size, heads, kv_heads):
    # a whole prompt, a decode step, and a chunk of a prompt that starts mid-sequence
    seqs = _seqs([37, 70, 45], kv_heads)
    query_lens = [37, 1, 13]
    queries, outputs = _run(seqs, query_lens, heads, kv_heads, block_size)
    for (k, v), q, out in zip(seqs, queries, outputs):
        torch.testing.assert_close(out, _reference(q, k, v, HEAD ** -0.5),
                                   rtol=1e-5, atol=1e-5)


def test_attention_over_prefix_cached_blocks_shared_by_two_sequences():
    # both sequences' first two blocks are the same physical blocks (written once);
    # each computes only its own new tokens
    seqs = _seqs([50, 41], 2, shared_prefix=32)
    queries, outputs = _run(seqs, [18, 9], 8, 2, 16, shared=2)
    for (k, v), q, out in zip(seqs, queries, outputs):
        torch.testing.assert_close(out, _reference(q, k, v, HEAD ** -0.5),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [1, 5, 16, 100])
def test_sliding_window_matches_sdpa_with_the_window_mask(window):
    seqs = _seqs([40, 33], 2)
    queries, outputs = _run(seqs, [40, 6], 4, 2, 16, sliding_window=window)
    for (k, v), q, out in zip(seqs, queries, outputs):
        torch.testing.assert_close(out, _reference(q, k, v, HEAD ** -0.5, window=window),
                                   rtol=1e-5, atol=1e-5)
    if window < 40:  # the window changes the result
        full = _reference(queries[0], *seqs[0], HEAD ** -0.5)
        assert not torch.allclose(outputs[0], full, atol=1e-3)


def _written_out(q, k, v, scale, *, softcap=0.0, sinks=None, alibi=None):
    """The attention formula for one causal sequence, term by term."""
    n, length = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, 1)
    v = v.repeat_interleave(group, 1)
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        for t in range(n):
            pos = length - n + t
            row = []
            for j in range(pos + 1):
                s = float(q[t, h] @ k[j, h]) * scale
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                if alibi is not None:
                    s += float(alibi[h]) * (j - pos)
                row.append(s)
            top = max(row + ([float(sinks[h])] if sinks is not None else []))
            weights = [math.exp(s - top) for s in row]
            total = sum(weights) + (math.exp(float(sinks[h]) - top) if sinks is not None else 0)
            out[t, h] = sum(w / total * v[j, h] for j, w in enumerate(weights))
    return out


def test_softcap_sinks_and_alibi_match_the_formula():
    seqs = _seqs([20, 9], 1)
    sinks = torch.tensor([0.5, -1.0])
    alibi = torch.tensor([0.25, 0.0625])
    for options in ({"softcap": 0.7}, {"sinks": sinks}, {"alibi_slopes": alibi}):
        queries, outputs = _run(seqs, [20, 3], 2, 1, 16, **options)
        written = {"softcap": options.get("softcap", 0.0), "sinks": options.get("sinks"),
                   "alibi": options.get("alibi_slopes")}
        for (k, v), q, out in zip(seqs, queries, outputs):
            torch.testing.assert_close(out, _written_out(q, k, v, HEAD ** -0.5, **written),
                                       rtol=1e-4, atol=1e-5)
            plain = _reference(q, k, v, HEAD ** -0.5)
            assert not torch.allclose(out, plain, atol=1e-3), options


def test_non_causal_and_dynamic_causal():
    seqs = _seqs([24, 24], 2)
    queries, outputs = _run(seqs, [24, 24], 4, 2, 16, causal=False)
    for (k, v), q, out in zip(seqs, queries, outputs):
        torch.testing.assert_close(out, _reference(q, k, v, HEAD ** -0.5, causal=False),
                                   rtol=1e-5, atol=1e-5)
    # per-sequence flags override `causal`
    queries, outputs = _run(seqs, [24, 24], 4, 2, 16, causal=False,
                            dynamic_causal=torch.tensor([True, False]))
    torch.testing.assert_close(outputs[0], _reference(queries[0], *seqs[0], HEAD ** -0.5),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs[1], _reference(queries[1], *seqs[1], HEAD ** -0.5,
                                                      causal=False), rtol=1e-5, atol=1e-5)


def test_bfloat16_cache_and_flat_output():
    seqs = [(k.bfloat16(), v.bfloat16()) for k, v in _seqs([30], 2)]
    key_cache, value_cache, table = _paged(seqs, 2, 16)
    assert key_cache.dtype == torch.float32  # written through a cast: build a bf16 one
    cache = torch.zeros(64, 2, 32, HEAD, dtype=torch.bfloat16)
    kc, vc = cache.chunk(2, dim=2)
    kc.copy_(key_cache), vc.copy_(value_cache)
    q = torch.randn(30, 4, HEAD).bfloat16()
    out = torch.empty(30, 4 * HEAD, dtype=torch.bfloat16)
    ck.paged_attention(q, kc, vc, out, torch.tensor([0, 30]), torch.tensor([30]), table,
                       HEAD ** -0.5)
    ref = _reference(q.float(), seqs[0][0].float(), seqs[0][1].float(), HEAD ** -0.5)
    torch.testing.assert_close(out.view(30, 4, HEAD).float(), ref, rtol=2e-2, atol=2e-2)


def test_fp8_cache_is_refused_with_the_fix():
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='auto'"):
        ck.write_kv_cache(torch.zeros(1, 1, HEAD), torch.zeros(1, 1, HEAD),
                          torch.zeros(1, 1, 16, HEAD), torch.zeros(1, 1, 16, HEAD),
                          torch.tensor([0]), kv_cache_dtype="fp8")


def _rotary_reference(x, positions, rotary_dim, offset, is_neox, base=10000.0):
    """Rotate each pair of dims as a complex number by position * frequency."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    angle = positions.double()[:, None] * inv_freq[None, :]          # [t, rotary/2]
    out = x.double().clone()
    part = out[..., offset:offset + rotary_dim]
    if is_neox:
        pairs = torch.complex(part[..., :rotary_dim // 2], part[..., rotary_dim // 2:])
    else:
        pairs = torch.complex(part[..., 0::2], part[..., 1::2])
    turned = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    if is_neox:
        part.copy_(torch.cat((turned.real, turned.imag), -1))
    else:
        part.copy_(torch.stack((turned.real, turned.imag), -1).flatten(-2))
    return out.float()


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim,offset", [(HEAD, 0), (16, 0), (16, 8)])
def test_rotary_embedding_matches_complex_rotation(is_neox, rotary_dim, offset):
    gen = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads = 7, 4, 2
    positions = torch.tensor([0, 1, 2, 9, 40, 41, 127])
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    angles = torch.arange(128).float()[:, None] * inv_freq[None, :]
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=-1)
    # q and k as vLLM hands them over: views into one fused qkv row
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * HEAD, generator=gen)
    q, k, _ = qkv.split([heads * HEAD, kv_heads * HEAD, kv_heads * HEAD], dim=-1)
    q0, k0 = q.clone(), k.clone()
    ck.rotary_embedding(positions, q, k, HEAD, cos_sin, is_neox, offset)
    for before, after, h in ((q0, q, heads), (k0, k, kv_heads)):
        want = _rotary_reference(before.view(tokens, h, HEAD), positions, rotary_dim, offset,
                                 is_neox)
        torch.testing.assert_close(after.view(tokens, h, HEAD), want, rtol=1e-5, atol=1e-5)
    # inverse turns it back
    ck.rotary_embedding(positions, q, None, HEAD, cos_sin, is_neox, offset, True)
    torch.testing.assert_close(q, q0, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(k, k0)


def test_register_missing_adds_a_kernel_only_where_none_runs_on_cpu():
    ns = "vsm_cpu_kernels_test"
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("has_cpu(Tensor x) -> Tensor")
    lib.impl("has_cpu", lambda x: x + 1, "CPU")
    lib.define("cuda_only(Tensor x) -> Tensor")
    lib.impl("cuda_only", lambda x: x + 2, "CUDA")
    x = torch.zeros(2)

    assert ck.register_missing(ns, "has_cpu", "(Tensor x) -> Tensor", lambda x: x - 1) is None
    assert torch.equal(torch.ops.vsm_cpu_kernels_test.has_cpu(x), x + 1)

    assert ck.has_cpu_kernel(f"{ns}::cuda_only") is False
    assert ck.register_missing(ns, "cuda_only", "(Tensor x) -> Tensor",
                               lambda x: x + 3) == "cpu kernel added"
    assert torch.equal(torch.ops.vsm_cpu_kernels_test.cuda_only(x), x + 3)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::cuda_only", "CUDA")

    assert ck.has_cpu_kernel(f"{ns}::absent") is None
    assert ck.register_missing(ns, "absent", "(int[] ids) -> ()", lambda ids: None,
                               fake=lambda ids: None) == "defined"
    torch.ops.vsm_cpu_kernels_test.absent([0])  # no tensor argument: still dispatched
    assert ck.has_cpu_kernel(f"{ns}::absent")
    # a second call changes nothing
    assert ck.register_missing(ns, "absent", "(int[] ids) -> ()", lambda ids: 1) is None


def test_gumbel_argmax_draws_from_the_softmax_and_repeats_per_seed():
    logits = torch.tensor([[0.0, 1.0, 2.0, float("-inf")]] * 4000)
    seeds = torch.arange(4000)
    draws = ck.gumbel_argmax(logits, seeds)
    assert draws.dtype == torch.int64 and draws.shape == (4000,)
    assert not (draws == 3).any()                       # -inf is never drawn
    freq = torch.bincount(draws, minlength=4).double() / 4000
    want = torch.softmax(logits[0].double(), -1)
    assert (freq - want).abs().max() < 0.03, (freq, want)
    assert torch.equal(ck.gumbel_argmax(logits[:50], seeds[:50]), draws[:50])
    assert not torch.equal(ck.gumbel_argmax(logits[:50], seeds[:50] + 1), draws[:50])


def test_greedy_argmax_is_each_rows_first_largest_id():
    logits = torch.tensor([[0.0, 2.0, 2.0, -1.0], [5.0, float("-inf"), 1.0, 4.0]])
    assert ck.greedy_argmax(logits).tolist() == [1, 0]
    assert ck.greedy_argmax(logits).dtype == torch.int64
