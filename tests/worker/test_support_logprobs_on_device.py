"""`support_logprobs`: the processed logprob of every support id (mask order) and
log S, gathered on the device, against an independent float64 reference built
here from the definitions (temperature, top-k, top-p, min-p), narrow and wide rows
(ties past the compaction width), row subsets, fp32 and bf16 inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_sampling_mask.worker.extraction import ExtractionSettings, extract_support, plan_layout
from vllm_sampling_mask.worker.support_logprobs import align_row, gather_support_logprobs
from vllm_sampling_mask.worker.transport import decode


def reference(logits64, temperature, top_k, top_p, min_p):
    """float64: (scaled logits, keep mask) of one row, from the definitions."""
    scaled = logits64 / temperature
    probs = torch.softmax(scaled, -1)
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if min_p:
        keep &= probs >= min_p * probs.max()
    if top_k:
        kth = torch.sort(scaled, descending=True).values[top_k - 1]
        keep &= scaled >= kth
    if top_p < 1:
        masked = torch.where(keep, scaled, torch.tensor(-np.inf, dtype=scaled.dtype))
        p = torch.softmax(masked, -1)
        order = torch.argsort(p, descending=True)
        before = torch.cumsum(p[order], 0) - p[order]   # mass strictly above each id
        cut = torch.zeros_like(keep)
        cut[order] = before >= top_p
        keep &= ~cut
    return scaled, keep


def make_batch(rows, vocab, seed, dtype, ties=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 3
    params = []
    for r in range(rows):
        t = [0.7, 1.0, 1.3][r % 3]
        k = [8, 5, 20, 50, 30][r % 5]
        p = [1.0, 0.9, 0.6][r % 3]
        m = [0.0, 0.0, 0.05][r % 3]
        params.append((t, k, p, m))
    if ties:   # row 0: 70 ids tied at the top with top_k 8: wide past W
        logits[0, :70] = 50.0
        params[0] = (1.0, 8, 1.0, 0.0)
    logits = logits.to(dtype).double()      # the values the engine would hold
    scaled, keep = zip(*(reference(logits[r], *params[r]) for r in range(rows)))
    scaled, keep = torch.stack(scaled), torch.stack(keep)
    processed = torch.where(keep, scaled, torch.tensor(-np.inf, dtype=torch.float64))
    processed = torch.log_softmax(processed, -1)
    top_k = np.array([k for _, k, _, _ in params])
    return logits, scaled, keep, processed, top_k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("subset", [False, True])
def test_values_and_log_kept_match_the_reference(dtype, subset):
    rows, vocab = 11, 3000
    _, scaled, keep, processed, top_k = make_batch(rows, vocab, 1, dtype, ties=True)
    settings = ExtractionSettings(tie_margin=4)
    mask_rows = np.array([0, 2, 3, 5, 7, 8, 10]) if subset else None
    picked = np.arange(rows) if mask_rows is None else mask_rows
    layout = plan_layout(top_k[picked], vocab, max_size=4096, settings=settings)
    assert layout.slots > 0 and layout.width < 70     # row 0 goes wide
    mask = extract_support(processed.float(), layout, mask_rows, settings=settings)
    asked = np.ones(layout.rows, bool)
    asked[1] = False                                   # a row that did not ask
    out = gather_support_logprobs(processed.float(), scaled.float(), mask, asked)
    assert out.values.dtype == torch.float32 and out.values.shape == (asked.sum(),
                                                                       layout.width)
    assert list(out.rows) == list(np.flatnonzero(asked))
    row_of = mask.row_of()
    supports = decode(mask.block.numpy(), layout, row_of)
    meta = mask.block.numpy()[: layout.ids_offset].reshape(layout.rows, 3)
    values, tail = out.values.numpy(), out.tail.numpy()
    for a, block_row in enumerate(out.rows):
        batch_row = int(picked[block_row])
        support = supports.row(batch_row)
        assert np.array_equal(support, np.flatnonzero(keep[batch_row].numpy()))
        count, slot = int(meta[block_row, 0]), int(meta[block_row, 1])
        got = align_row(values[a], tail, count, slot, support)
        assert got.dtype == np.float32 and len(got) == len(support)
        want = processed[batch_row, support].numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)
        assert abs(float(torch.logsumexp(torch.from_numpy(got).float(), 0))) < 1e-5
        log_s = torch.logsumexp(torch.log_softmax(scaled[batch_row], -1)[keep[batch_row]], 0)
        assert abs(float(out.log_kept[a]) - float(log_s)) < 5e-5
    wide = [a for a, b in enumerate(out.rows) if int(meta[b, 1]) >= 0]
    assert wide, "a wide row must be exercised"


def test_an_untruncated_row_keeps_everything_and_nobody_asked_costs_nothing():
    vocab = 500
    logits = torch.randn(2, vocab, dtype=torch.float64)
    processed = torch.log_softmax(logits, -1)
    layout = plan_layout(np.array([vocab, vocab]), vocab, max_size=vocab)
    mask = extract_support(processed.float(), layout)
    out = gather_support_logprobs(processed.float(), logits.float(), mask,
                                  np.array([True, True]))
    assert torch.allclose(out.log_kept, torch.zeros(2), atol=1e-6)
    none = gather_support_logprobs(processed.float(), logits.float(), mask,
                                   np.array([False, False]))
    assert none.values.shape == (0, layout.width) and len(none.rows) == 0


def test_refuses_mismatched_inputs():
    processed = torch.log_softmax(torch.randn(2, 100), -1)
    layout = plan_layout(np.array([5, 5]), 100, max_size=100)
    mask = extract_support(processed, layout)
    with pytest.raises(ValueError, match="asked flags"):
        gather_support_logprobs(processed, processed, mask, np.array([True]))
    with pytest.raises(ValueError, match="differ in shape"):
        gather_support_logprobs(processed, processed[:, :50], mask, np.array([True, True]))


def test_nan_logits_end_only_their_row_and_asking_is_not_read_from_the_values():
    """A row whose logits hold a NaN (outside its finite support) gets NaN support
    logprobs: the host still knows it asked, and `problem` ends that request; the
    row beside it, which asked too, is served; a row that did not ask has none."""
    vocab = 300
    logits = torch.randn(3, vocab, dtype=torch.float64)
    processed = torch.log_softmax(logits, -1)
    processed[0, 7] = float("nan")
    layout = plan_layout(np.array([vocab] * 3), vocab, max_size=vocab)
    mask = extract_support(processed.float(), layout)
    asked = np.array([True, True, False])
    out = gather_support_logprobs(processed.float(), None, mask, asked,
                                  scaled_top=torch.zeros(3))
    host = decode(mask.block.numpy(), layout, mask.row_of(), support_logprobs=out)
    assert [host.asked(i) for i in range(3)] == [True, True, False]
    token = int(host.row(0)[0])
    assert "NaN" in host.problem(0, token)
    assert host.problem(1, int(host.row(1)[0])) is None
    assert np.isfinite(host.row_logprobs(1)).all()
    # the scheduler's vectorised check flags the NaN row, and only it
    tokens = [int(host.row(i)[0]) for i in range(3)]
    assert host.suspects(np.arange(3), np.array(tokens)).tolist() == [True, False, False]


@pytest.mark.parametrize("subset", [False, True])
def test_the_host_path_gives_what_the_torch_path_gives(subset):
    """On a CPU host the sampler's float32 logprobs are read with numpy
    (`_gather_on_host`, `scaled_top_logprob`'s host branch); the same inputs with
    rows that are not contiguous take the torch path. Both give the same values,
    log S and wide-row tails, and the same scaled top logprobs."""
    from vllm_sampling_mask.worker.support_logprobs import scaled_top_logprob

    rows, vocab = 11, 3000
    _, scaled, keep, processed, top_k = make_batch(rows, vocab, 2, torch.float32, ties=True)
    scaled, processed = scaled.float(), processed.float()
    settings = ExtractionSettings(tie_margin=4)
    mask_rows = np.array([0, 2, 3, 5, 7, 8, 10]) if subset else None
    picked = np.arange(rows) if mask_rows is None else mask_rows
    layout = plan_layout(top_k[picked], vocab, max_size=4096, settings=settings)
    mask = extract_support(processed, layout, mask_rows, settings=settings)
    asked = np.ones(layout.rows, bool)
    asked[1] = False

    def strided(x):   # the same values, each row's entries not contiguous
        return x.t().contiguous().t()

    asked_rows = picked[np.flatnonzero(asked)]
    top_host = scaled_top_logprob(scaled, asked_rows)
    top_torch = scaled_top_logprob(strided(scaled), asked_rows)
    torch.testing.assert_close(top_host, top_torch, rtol=0, atol=2e-6)
    host = gather_support_logprobs(processed, None, mask, asked, scaled_top=top_host)
    other = gather_support_logprobs(strided(processed), None, mask, asked,
                                    scaled_top=top_host)
    assert list(host.rows) == list(other.rows)
    torch.testing.assert_close(host.values, other.values, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(host.log_kept, other.log_kept, rtol=0, atol=2e-6)
    assert host.tail.shape == other.tail.shape and host.tail.shape[0] > 0
    torch.testing.assert_close(host.tail, other.tail, rtol=0, atol=0)
    for a, block_row in enumerate(host.rows):   # and log S is the reference's
        batch_row = int(picked[block_row])
        log_s = torch.logsumexp(torch.log_softmax(scaled[batch_row].double(), -1)
                                [keep[batch_row]], 0)
        assert abs(float(host.log_kept[a]) - float(log_s)) < 5e-5


def test_an_untruncated_rows_log_s_is_exactly_zero_on_every_path():
    """The V1 sampler's processed logprobs of a row no filter touched are the
    log-softmax of its scaled logits; log S of such a row is 0 exactly (not a
    rounding error either side of it), on the CPU host's path and the torch path,
    while a truncated row's is its reference."""
    from vllm_sampling_mask.worker.extraction import extract_on_host
    from vllm_sampling_mask.worker.support_logprobs import on_host, scaled_top_logprob

    generator = torch.Generator().manual_seed(3)
    scaled = torch.randn(16, 4096, generator=generator) * 3
    truncated = scaled.clone()
    truncated[1::2][truncated[1::2] < truncated[1::2].topk(50, dim=1).values[:, -1:]] = \
        float("-inf")
    processed = truncated.log_softmax(dim=1)      # even rows: untouched
    every = np.arange(16)
    top = scaled_top_logprob(scaled, every)
    mask = extract_on_host(processed, None, 4096)
    on_host(mask, np.ones(16, bool), top, processed)
    strided = processed.t().contiguous().t()
    layout = plan_layout(np.full(16, 4096), 4096, max_size=4096)
    device = gather_support_logprobs(strided, None, extract_support(strided, layout),
                                     np.ones(16, bool), scaled_top=top)
    for log_kept in (mask.host.log_kept, device.log_kept.numpy()):
        assert log_kept[0::2].tolist() == [0.0] * 8
        reference = [float(torch.logsumexp(scaled[r].double().log_softmax(0)
                                           [processed[r] > -np.inf], 0))
                     for r in range(1, 16, 2)]
        np.testing.assert_allclose(log_kept[1::2], reference, atol=5e-6)
        assert (log_kept[1::2] < -1e-3).all()


def test_every_row_asked_on_the_host_nan_rows_describe_no_draw():
    """The host path's all-rows case (`_every_row_on_host`): the support logprobs
    are the values read at the ids, and a row whose processed or scaled logits
    hold a NaN gets NaN log S and `drawn` -1 (the scheduler then ends only it);
    the other rows keep their token."""
    from vllm_sampling_mask.worker.extraction import extract_on_host
    from vllm_sampling_mask.worker.support_logprobs import on_host, scaled_top_logprob

    generator = torch.Generator().manual_seed(5)
    scaled = torch.randn(4, 300, generator=generator)
    processed = scaled.log_softmax(dim=1)
    processed[0, 11] = float("nan")                 # NaN reached the processed row
    scaled[1, 3] = float("nan")                     # NaN in the scaled logits only
    sampled = processed.nan_to_num(-1e9).argmax(dim=1)
    mask = extract_on_host(processed, None, 300, sampled)
    assert mask.host.drawn.tolist() == sampled.tolist()
    on_host(mask, np.ones(4, bool), scaled_top_logprob(scaled, np.arange(4)), processed)
    host = mask.host
    assert host.drawn.tolist() == [-1, -1, *sampled[2:].tolist()]
    assert np.isnan(host.log_kept[:2]).all() and (host.log_kept[2:] == 0.0).all()
    np.testing.assert_array_equal(host.logprobs, processed.numpy()[
        np.repeat(np.arange(4), np.diff(host.offsets)), host.ids])


@pytest.mark.parametrize("rows,vocab", [(3, 151_936), (70, 4096)])
def test_a_large_host_batchs_scaled_top_is_taken_in_blocks_and_matches_float64(rows, vocab):
    """Past `_BLOCK_LOGITS` CPU float32 logits the scaled top is reduced a block of
    rows at a time (one row per block at V = 151,936; 64 rows, then a part block
    of 6, at 4,096) through a reused buffer: the same value as float64's
    log-softmax maximum, within 1e-6, for the rows asked and 0 in the others,
    and NaN where a row holds a NaN."""
    from vllm_sampling_mask.worker.support_logprobs import _BLOCK_LOGITS, scaled_top_logprob

    assert rows * vocab > _BLOCK_LOGITS
    generator = torch.Generator().manual_seed(11)
    scaled = torch.randn(rows, vocab, generator=generator) * 4
    scaled[1, 7] = float("nan")
    every = np.arange(rows)
    top = scaled_top_logprob(scaled, every)
    reference = scaled.double().log_softmax(dim=1).amax(dim=1)
    finite = np.arange(rows) != 1
    np.testing.assert_allclose(top.numpy()[finite], reference.numpy()[finite], rtol=0,
                               atol=1e-6)
    assert np.isnan(top[1].item())
    subset = np.arange(0, rows, 2)
    picked = scaled_top_logprob(scaled, subset)
    assert picked.numpy()[1::2].tolist() == [0.0] * len(picked[1::2])
    np.testing.assert_allclose(picked.numpy()[subset], reference.numpy()[subset], rtol=0,
                               atol=2e-6)        # 35 x 4,096 logits: the fused kernel


def test_a_whole_row_keeps_log_s_zero_at_a_large_vocabulary_on_the_host():
    """At V = 151,936 the scaled top is the blocked one and the processed
    logprobs the sampler's fused `log_softmax`: the two round differently, yet a
    row nothing filtered has log S = 0 exactly (`log_kept_of`), a truncated
    row its float64 reference, and a row whose scaled logits hold a NaN stays NaN
    and describes no draw."""
    from vllm_sampling_mask.worker.extraction import extract_on_host
    from vllm_sampling_mask.worker.support_logprobs import on_host, scaled_top_logprob

    vocab = 151_936
    generator = torch.Generator().manual_seed(13)
    scaled = torch.randn(4, vocab, generator=generator) * 3
    truncated = scaled.clone()
    cut = truncated[1] < truncated[1].topk(50).values[-1]
    truncated[1][cut] = float("-inf")
    processed = truncated.log_softmax(dim=1)     # rows 0, 2, 3: untouched
    scaled[3, 5] = float("nan")                  # NaN in the scaled logits only
    sampled = processed.argmax(dim=1)
    mask = extract_on_host(processed, None, vocab, sampled)
    for asked in (np.ones(4, bool), np.array([True, True, False, True])):
        on_host(mask, asked, scaled_top_logprob(scaled, np.flatnonzero(asked)), processed)
        log_kept = mask.host.log_kept
        assert log_kept[0] == 0.0
        reference = torch.logsumexp(scaled[1].double().log_softmax(0)[~cut], 0)
        assert abs(float(log_kept[1]) - float(reference)) < 5e-6
        assert np.isnan(log_kept[3]) and mask.host.drawn[3] == -1
