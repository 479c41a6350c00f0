"""flashinfer.page: append_paged_kv_cache, get_batch_indices_positions, get_seq_lens, unpacking."""

import pytest
import torch

import flashinfer
from flashinfer.page import unpack_paged_kv_cache


def test_get_seq_lens():
    indptr = torch.tensor([0, 0, 1, 3, 6], dtype=torch.int32)
    last = torch.tensor([3, 5, 1, 16], dtype=torch.int32)
    got = flashinfer.get_seq_lens(indptr, last, 16)
    assert got.tolist() == [3, 5, 17, 48]  # upstream clamps pages - 1 at 0


def test_get_batch_indices_positions():
    append_indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    seq_lens = torch.tensor([10, 4, 3], dtype=torch.int32)
    b, p = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 5)
    assert b.dtype == torch.int32 and p.dtype == torch.int32
    assert b.tolist() == [0, 0, 2, 2, 2]
    assert p.tolist() == [8, 9, 0, 1, 2]
    bb, pp = torch.full((5,), -1, dtype=torch.int32), torch.full((5,), -1, dtype=torch.int32)
    out = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, 5, bb, pp)
    assert out[0] is bb and bb.tolist() == b.tolist() and pp.tolist() == p.tolist()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("form", ["5d", "tuple"])
def test_append_paged_kv_cache(layout, page_size, form):
    torch.manual_seed(0)
    hk, d, total_pages = 2, 8, 24
    old = [3, 0, 5]
    new = [2, 3, 4]
    seq = [o + n for o, n in zip(old, new)]
    pages = [-(-s // page_size) for s in seq]
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.randperm(total_pages)[:sum(pages)].to(torch.int32)
    last = torch.tensor([(s - 1) % page_size + 1 for s in seq], dtype=torch.int32)
    shape = (total_pages, 2, page_size, hk, d) if layout == "NHD" else (total_pages, 2, hk, page_size, d)
    cache = torch.randn(shape)
    before = cache.clone()
    paged = cache if form == "5d" else (cache[:, 0], cache[:, 1])
    k_app, v_app = torch.randn(sum(new), hk, d), torch.randn(sum(new), hk, d)
    append_indptr = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    b, p = flashinfer.get_batch_indices_positions(append_indptr, torch.tensor(seq, dtype=torch.int32), sum(new))
    flashinfer.append_paged_kv_cache(k_app, v_app, b, p, paged, indices, indptr, last, layout)
    k_cache, v_cache = unpack_paged_kv_cache(cache, layout)
    expected = before.clone()
    ek, ev = unpack_paged_kv_cache(expected, layout)
    for t in range(sum(new)):
        bi, pos = int(b[t]), int(p[t])
        page = int(indices[indptr[bi] + pos // page_size])
        slot = pos % page_size
        if layout == "NHD":
            ek[page, slot], ev[page, slot] = k_app[t], v_app[t]
        else:
            ek[page, :, slot], ev[page, :, slot] = k_app[t], v_app[t]
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_unpack_forms_page_size_one(layout):
    c4 = torch.randn(5, 2, 3, 8)
    k, v = unpack_paged_kv_cache(c4, layout)
    assert k.shape == ((5, 1, 3, 8) if layout == "NHD" else (5, 3, 1, 8))
    assert torch.equal(k.flatten(), c4[:, 0].flatten()) and k.data_ptr() == c4.data_ptr()
    k3, v3 = unpack_paged_kv_cache((c4[:, 0], c4[:, 1]), layout)
    assert torch.equal(k3, k) and torch.equal(v3, v)


def test_unpack_rejects_bad_cache():
    with pytest.raises(ValueError, match="paged_kv_cache"):
        unpack_paged_kv_cache(torch.randn(4, 3, 2, 2, 8))
    with pytest.raises(TypeError, match="paged_kv_cache"):
        unpack_paged_kv_cache([1, 2, 3])


def test_append_rejects_shape_mismatch():
    cache = torch.randn(4, 2, 4, 2, 8)
    i32 = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="append_key"):
        flashinfer.append_paged_kv_cache(torch.randn(1, 3, 8), torch.randn(1, 3, 8), i32, i32, cache,
                                         i32, torch.tensor([0, 1], dtype=torch.int32), i32)
