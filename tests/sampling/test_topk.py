"""flashinfer.top_k (module flashinfer.topk) against float64 selection written here: the k largest
per row, tie-break modes at the boundary, deterministic and sorted output, argument checks; the
sparse-attention transforms; on CUDA (marker ``gpu``), the same calls against the CPU."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer.topk import TopKTieBreak


def _as_sets(values, indices):
    return [sorted(zip(v.tolist(), i.tolist())) for v, i in zip(values, indices)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sorted_", [False, True])
def test_top_k_selects_the_largest(dtype, sorted_):
    torch.manual_seed(0)
    x = torch.randn(5, 300).to(dtype)  # fp16/bf16 rounding gives ties too: compare value sets
    values, indices = flashinfer.top_k(x, 17, sorted=sorted_)
    assert values.dtype == dtype and indices.dtype == torch.int64 and values.shape == (5, 17)
    torch.testing.assert_close(x.gather(1, indices), values, rtol=0, atol=0)
    want = torch.sort(x.double(), dim=1, descending=True).values[:, :17]
    torch.testing.assert_close(torch.sort(values.double(), dim=1, descending=True).values, want,
                               rtol=0, atol=0)
    if sorted_:
        assert bool((values[:, :-1] >= values[:, 1:]).all())


def test_tie_break_modes_choose_among_equal_values_by_index():
    x = torch.tensor([[5.0, 1.0, 3.0, 3.0, 3.0, 0.0]])
    for mode, want in ((TopKTieBreak.SMALL, [0, 2, 3]), (TopKTieBreak.LARGE, [0, 4, 3]),
                       (1, [0, 2, 3]), (2, [0, 4, 3])):
        values, indices = flashinfer.top_k(x, 3, tie_break=mode)
        assert indices.tolist() == [want] and values.tolist() == [[5.0, 3.0, 3.0]]
    _, first = flashinfer.top_k(x, 3, deterministic=True)
    _, again = flashinfer.top_k(x, 3, deterministic=True)
    assert first.tolist() == again.tolist() == [[0, 2, 3]]


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(input=torch.randn(4), k=1), ValueError, "2-D"),
    (dict(input=torch.randn(2, 4, dtype=torch.float64), k=1), TypeError, "float64"),
    (dict(input=torch.randn(2, 4), k=5), ValueError, "k=5"),
    (dict(input=torch.randn(2, 4), k=0), ValueError, "k=0"),
    (dict(input=torch.randn(2, 4), k=1.5), TypeError, "k must be an int"),
    (dict(input=torch.randn(2, 4), k=1, tie_break=3), ValueError, "tie_break"),
    (dict(input=torch.randn(2, 4), k=1, sorted=1), TypeError, "sorted"),
])
def test_bad_arguments_are_named(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        flashinfer.top_k(**kwargs)


def test_module_and_alias():
    assert flashinfer.topk.topk is flashinfer.topk.top_k is flashinfer.top_k


def _naive_local(row, start, length, k):
    """The window's top-k positions (a set: upstream's order is unspecified), or 0..L-1."""
    if length <= k:
        return list(range(length))
    window = row[start:start + length].double()
    return sorted(torch.topk(window, k).indices.tolist())


@pytest.mark.parametrize("page_size", [1, 4])
def test_page_table_transform_matches_naive(page_size):
    torch.manual_seed(5)
    rows, width, k = 6, 40, 5
    scores = torch.randn(rows, width)
    lengths = torch.tensor([40, 3, 0, 17, 5, 22], dtype=torch.int32)
    starts = torch.tensor([0, 10, 2, 20, 30, 8], dtype=torch.int32)
    lengths[0] = 40
    starts[0] = 0
    table = torch.randint(0, 1000, (3, 48), dtype=torch.int32)
    row_to_batch = torch.tensor([0, 1, 2, 0, 1, 2], dtype=torch.int32)
    pt_starts = torch.tensor([0, 2, 1, 3, 0, 4], dtype=torch.int32) if page_size > 1 else None
    raw = torch.empty(rows, k, dtype=torch.int32)
    got = flashinfer.topk.top_k_page_table_transform(
        scores, table, lengths, k, row_to_batch, True, row_starts=starts,
        page_table_row_starts=pt_starts, page_size=page_size, out_raw_indices=raw)
    assert got.dtype == torch.int32 and got.shape == (rows, k)
    for i in range(rows):
        local = _naive_local(scores[i], int(starts[i]), int(lengths[i]), k)
        ps = int(starts[i]) if pt_starts is None else int(pt_starts[i])
        b = int(row_to_batch[i])
        want = [int(table[b, ps + idx // page_size]) * page_size + idx % page_size for idx in local]
        assert got[i].tolist() == want + [-1] * (k - len(want))  # deterministic: ascending
        assert raw[i].tolist() == local + [-1] * (k - len(local))


def test_ragged_transform_and_tie_breaks():
    scores = torch.tensor([[1.0, 5.0, 5.0, 0.0, 5.0, 2.0]])
    offsets, lengths = torch.tensor([100], dtype=torch.int32), torch.tensor([6], dtype=torch.int32)
    small = flashinfer.topk.top_k_ragged_transform(scores, offsets, lengths, 2, True, TopKTieBreak.SMALL)
    large = flashinfer.topk.top_k_ragged_transform(scores, offsets, lengths, 2, True, TopKTieBreak.LARGE)
    assert small.tolist() == [[101, 102]] and large.tolist() == [[102, 104]]
    short = flashinfer.topk.top_k_ragged_transform(scores, offsets, torch.tensor([1], dtype=torch.int32), 3)
    assert short.tolist() == [[100, -1, -1]]


@pytest.mark.parametrize("change, words", [
    (dict(lengths=torch.tensor([41], dtype=torch.int32)), "lengths"),
    (dict(row_to_batch=torch.tensor([3], dtype=torch.int32)), "row_to_batch"),
    (dict(lengths=torch.tensor([40], dtype=torch.int64)), "int32"),
    (dict(page_size=3), "power of two"),
])
def test_page_table_transform_refuses_bad_indices_on_the_cpu(change, words):
    args = dict(input=torch.randn(1, 40), src_page_table=torch.zeros(3, 40, dtype=torch.int32),
                lengths=torch.tensor([40], dtype=torch.int32), k=4)
    args.update(change)
    with pytest.raises(ValueError, match=words):
        flashinfer.topk.top_k_page_table_transform(**args)


def test_a_window_needing_more_pages_than_the_table_row_names_lengths():
    with pytest.raises(ValueError, match="lengths.*src_page_table's row"):
        flashinfer.topk.top_k_page_table_transform(
            torch.randn(1, 40), torch.zeros(1, 8, dtype=torch.int32),
            torch.tensor([40], dtype=torch.int32), 4, page_size=4)


# --- GPU: the same calls on CUDA tensors vs their CPU copies ------------------------------------
# (top_k runs on torch's kernels on both devices and dispatches nothing: no Decision to check;
# the plain unsorted float32 top_k on CUDA: tests/attention/test_compat_gpu.py::test_top_k_on_cuda)

DEV = "cuda"
SENTINEL = -7  # pre-filled into int32 output buffers: an unwritten slot shows


def _coarse_bf16(rows, width, seed):
    """Seeded bf16 scores on a grid of 80 values: many equal values at every top-k boundary."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-40, 40, (rows, width), generator=g) * 0.25).to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("kwargs", [dict(tie_break=TopKTieBreak.SMALL),
                                    dict(tie_break=TopKTieBreak.LARGE),
                                    dict(deterministic=True)], ids=["small", "large", "det"])
def test_gpu_top_k_tie_breaks_equal_the_cpu(kwargs):
    """top_k on CUDA, tie-break or deterministic, rows full of ties: exactly the CPU's output."""
    # (the mode fixes which of equal values are kept, so indices compare exactly too)
    x = _coarse_bf16(6, 4096, seed=30)
    got_v, got_i = flashinfer.top_k(x.to(DEV), 100, **kwargs)
    want_v, want_i = flashinfer.top_k(x, 100, **kwargs)
    assert got_v.device.type == torch.device(DEV).type and got_i.dtype == torch.int64
    assert torch.equal(got_v.cpu(), want_v) and torch.equal(got_i.cpu(), want_i)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_top_k_sorted_half_precision(dtype):
    """top_k(sorted=True) of fp16 / bf16 on CUDA: the CPU's values, descending, indices to them."""
    # ties may pick other equal elements than the CPU: the indices are checked by what they hold
    g = torch.Generator().manual_seed(31)
    x = torch.randn(8, 32768, generator=g).to(dtype)
    values, indices = flashinfer.top_k(x.to(DEV), 100, sorted=True)
    want, _ = flashinfer.top_k(x, 100, sorted=True)
    values, indices = values.cpu(), indices.cpu()
    assert torch.equal(values, want) and bool((values[:, :-1] >= values[:, 1:]).all())
    assert torch.equal(x.gather(1, indices), values)
    ordered = indices.sort(1).values
    assert bool((ordered[:, 1:] > ordered[:, :-1]).all())


ROWS, WIDTH, K = 8, 2048, 64
LENGTHS = [2048, 64, 0, 1000, 5, 1500, 700, 63]  # full, exactly k, empty, short, under k
STARTS = [0, 100, 7, 1000, 2000, 300, 1348, 0]    # start + length <= WIDTH


def _window_args():
    """int32 ``(lengths, row_starts)`` of the transform tests, on the CPU."""
    return (torch.tensor(LENGTHS, dtype=torch.int32), torch.tensor(STARTS, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("deterministic", [True, False])
def test_gpu_page_table_transform_matches_the_cpu(page_size, deterministic):
    """top_k_page_table_transform on CUDA, sentinel-filled outputs: exactly the CPU's selection."""
    # distinct scores; rows compared as sets unless deterministic (the order is unspecified then)
    g = torch.Generator().manual_seed(32)
    scores = torch.randperm(ROWS * WIDTH, generator=g).view(ROWS, WIDTH).float() * 1e-3
    lengths, starts = _window_args()
    pages = WIDTH if page_size == 1 else 160
    table = torch.randint(0, 50000, (3, pages), generator=g, dtype=torch.int32)
    row_to_batch = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1], dtype=torch.int32)
    pt_starts = (None if page_size == 1 else  # start + ceil(length / 16) <= 160 pages
                 torch.tensor([0, 10, 3, 50, 100, 20, 116, 156], dtype=torch.int32))
    args = dict(k=K, deterministic=deterministic, page_size=page_size)
    want_raw = torch.empty(ROWS, K, dtype=torch.int32)
    want = flashinfer.topk.top_k_page_table_transform(
        scores, table, lengths, row_to_batch=row_to_batch, row_starts=starts,
        page_table_row_starts=pt_starts, out_raw_indices=want_raw, **args)
    out = torch.full((ROWS, K), SENTINEL, dtype=torch.int32, device=DEV)
    raw = torch.full((ROWS, K), SENTINEL, dtype=torch.int32, device=DEV)
    got = flashinfer.topk.top_k_page_table_transform(
        scores.to(DEV), table.to(DEV), lengths.to(DEV), row_to_batch=row_to_batch.to(DEV),
        row_starts=starts.to(DEV),
        page_table_row_starts=None if pt_starts is None else pt_starts.to(DEV),
        out=out, out_raw_indices=raw, **args)
    flashinfer.check_errors()
    assert got is out
    got, raw = got.cpu(), raw.cpu()
    if not deterministic:
        got, raw, want, want_raw = (t.sort(1).values for t in (got, raw, want, want_raw))
    assert torch.equal(got, want) and torch.equal(raw, want_raw)
    assert not bool((got == SENTINEL).any())
    assert (want == -1).sum(1).tolist() == [max(K - n, 0) for n in LENGTHS]


@pytest.mark.gpu
@pytest.mark.parametrize("tie_break", [TopKTieBreak.SMALL, TopKTieBreak.LARGE, TopKTieBreak.NONE],
                         ids=["small", "large", "none"])
def test_gpu_ragged_transform_matches_the_cpu(tie_break):
    """top_k_ragged_transform on CUDA on rows full of ties vs the CPU (exact with a tie-break)."""
    # without a tie-break the choice among equal values is free: the same -1 padding, distinct
    # positions inside each window and the same multiset of selected values
    scores = _coarse_bf16(ROWS, WIDTH, seed=33)
    lengths, starts = _window_args()
    offsets = torch.tensor([0, 5000, 9000, 12000, 20000, 21000, 30000, 40000], dtype=torch.int32)
    args = dict(k=K, deterministic=True, tie_break=tie_break)
    want = flashinfer.topk.top_k_ragged_transform(scores, offsets, lengths, row_starts=starts,
                                                  **args)
    got = flashinfer.topk.top_k_ragged_transform(scores.to(DEV), offsets.to(DEV),
                                                 lengths.to(DEV), row_starts=starts.to(DEV),
                                                 **args)
    flashinfer.check_errors()
    got = got.cpu()
    assert got.dtype == torch.int32 and got.shape == (ROWS, K)
    if tie_break != TopKTieBreak.NONE:
        assert torch.equal(got, want)
        return
    assert torch.equal(got == -1, want == -1)
    for i in range(ROWS):
        kept = got[i][got[i] >= 0].long() - int(offsets[i])
        want_kept = want[i][want[i] >= 0].long() - int(offsets[i])
        assert kept.unique().numel() == kept.numel()
        assert bool(((kept >= 0) & (kept < LENGTHS[i])).all())
        row = scores[i, STARTS[i]:STARTS[i] + LENGTHS[i]]
        assert torch.equal(row[kept].sort().values, row[want_kept].sort().values)
