"""`support_coverage` against a direct dense computation (CPU, no engine, a second)."""

from __future__ import annotations

import pytest
import torch

from vllm_sampling_mask.frontend.sampling_mask import SamplingMask
from vllm_sampling_mask.training import pack_masks, support_coverage


def _case(T=37, V=211, H=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    bias = torch.randn(V, generator=gen, dtype=torch.float64)
    rows = []
    for t in range(T):
        k = 0 if t % 9 == 4 else int(torch.randint(1, 40, (1,), generator=gen))
        rows.append(sorted(torch.randperm(V, generator=gen)[:k].tolist()))
    return hidden, weight, bias, rows


def _dense(logits, rows, temperature):
    """Mass outside by a [T, V] keep-mask and a full softmax (float64)."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    out = []
    for t, r in enumerate(rows):
        out.append(0.0 if not r else 1.0 - p[t, r].sum().item())
    entropy = -(p * p.log()).sum(dim=-1)
    return torch.tensor(out, dtype=torch.float64), entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_from_logits_and_from_hidden_match_the_dense_softmax(temperature):
    hidden, weight, bias, rows = _case()
    logits = hidden @ weight.T + bias
    want, want_entropy = _dense(logits, rows, temperature)
    mask = SamplingMask.from_lists(rows)
    a = support_coverage(logits.float(), mask, temperature, chunk_rows=5)
    b = support_coverage(hidden.float(), mask, temperature, lm_head_weight=weight.float(),
                         bias=bias.float(), entropy=True, chunk_rows=8)
    for got in (a, b):
        assert got.mass_outside.dtype == torch.float32
        assert (got.mass_outside.double() - want).abs().max().item() < 1e-5
        assert got.sizes.tolist() == [len(r) for r in rows]
    assert a.entropy is None
    assert (b.entropy.double() - want_entropy).abs().max().item() < 1e-4
    # the case has real mass outside (not a vacuous 0) and tokens without a mask
    assert want.max().item() > 0.3 and (b.sizes == 0).sum().item() == 4


def test_totals_sum_the_tokens_with_a_support_and_where_asked():
    hidden, weight, _, rows = _case()
    logits = hidden @ weight.T
    want, _ = _dense(logits, rows, 1.0)
    got = support_coverage(logits.float(), SamplingMask.from_lists(rows))
    where = torch.arange(len(rows)) % 3 != 0
    for keep, total in ((None, got.totals()), (where, got.totals(where))):
        picked = [t for t, r in enumerate(rows) if r and (keep is None or keep[t])]
        mass, size, count = total.tolist()
        assert total.dtype == torch.float64 and total.shape == (3,)
        assert count == len(picked) and size == sum(len(rows[t]) for t in picked)
        assert abs(mass - want[picked].sum().item()) < 1e-4
    # the rows without a support (4 of them) and the unkept ones are left out
    assert got.totals()[2].item() == len(rows) - 4 > got.totals(where)[2].item()


def test_full_support_has_no_mass_outside_and_packs_like_the_ops():
    hidden, weight, _, rows = _case(T=6, V=50)
    logits = hidden @ weight.T
    full = [list(range(50))] * 3
    masks = [SamplingMask.from_lists(full), SamplingMask.from_lists(rows[3:])]
    got = support_coverage(logits, pack_masks(masks), 1.3)
    assert got.mass_outside.dtype == torch.float64
    assert got.mass_outside[:3].abs().max().item() < 1e-12
    want, _ = _dense(logits, full + rows[3:], 1.3)
    assert (got.mass_outside - want).abs().max().item() < 1e-12


def test_bad_inputs_name_the_parameter():
    hidden, weight, bias, rows = _case(T=4, V=30)
    mask = SamplingMask.from_lists(rows)
    with pytest.raises(ValueError, match="supports for 3 rows"):
        support_coverage(hidden[:3] @ weight.T, mask)
    with pytest.raises(ValueError, match="lm_head_weight must be"):
        support_coverage(hidden, mask, lm_head_weight=weight[:, :5])
    with pytest.raises(ValueError, match="mask ids must lie in"):
        support_coverage(hidden @ weight[:10].T, SamplingMask.from_lists([[29]] * 4))
    with pytest.raises(ValueError, match="temperature"):
        support_coverage(hidden @ weight.T, mask, 0.0)
    with pytest.raises(ValueError, match="chunk_rows"):
        support_coverage(hidden @ weight.T, mask, chunk_rows=0)
