"""Upstream's block-table calling conventions (flashinfer.attention.functional):
trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache and
trtllm_batch_context_with_kv_cache, against planned wrappers on the same pages."""

from __future__ import annotations

import pytest
import torch

from attention_helpers import make_paged, ws
from conftest import rel_error
import flashinfer
from flashinfer.attention.functional import page_table

I32 = torch.int32


def _block_table(indptr, indices, max_pages, junk=-7):
    """[batch, max_pages] page ids from a page indptr/indices; padding is junk (never read)."""
    batch = indptr.shape[0] - 1
    table = torch.full((batch, max_pages), junk, dtype=I32)
    for b in range(batch):
        ids = indices[indptr[b]:indptr[b + 1]]
        table[b, :ids.shape[0]] = ids
    return table


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("as_tuple", [False, True])
def test_trtllm_and_xqa_decode_match_a_planned_wrapper(layout, as_tuple):
    torch.manual_seed(0)
    kv_lens, ps, hq, hk, d = [9, 1, 0, 33], 8, 4, 2, 16
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, layout)
    table = _block_table(indptr, indices, 6)
    q = torch.randn(4, hq, d)
    want = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), layout)
    want.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32, sm_scale=0.3)
    expected = want.run(q, cache, v_scale=0.5)
    kv = tuple(cache.unbind(1)) if as_tuple else cache
    seq_lens = torch.tensor(kv_lens, dtype=I32)
    got = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv, workspace_buffer=ws(), block_tables=table, seq_lens=seq_lens,
        max_seq_len=40, bmm1_scale=torch.tensor(0.3), bmm2_scale=0.5, kv_layout=layout)
    assert rel_error(got, expected) < 1e-6
    got = flashinfer.decode.xqa_batch_decode_with_kv_cache(
        q, kv, ws(), table, seq_lens, 40, bmm1_scale=0.3, bmm2_scale=0.5, kv_layout=layout)
    assert rel_error(got, expected) < 1e-6


KV_LENS, QO_LENS, QO_INDPTR = [12, 5, 30], [3, 5, 1], torch.tensor([0, 3, 8, 9], dtype=I32)


def _prefill_case(seed: int, hk: int, sm_scale: float, ps=4, hq=4, d=16):
    """A paged HND cache of three requests, their queries and a planned causal prefill."""
    torch.manual_seed(seed)
    cache, indptr, indices, last, ks, vs = make_paged(KV_LENS, ps, hk, d, "HND")
    q = torch.randn(9, hq, d)
    want = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), "HND")
    want.plan(QO_INDPTR, indptr, indices, last, hq, hk, d, ps, causal=True, sm_scale=sm_scale,
              q_data_type=torch.float32)
    return cache, indptr, indices, ks, vs, q, want


def test_trtllm_context_matches_a_planned_prefill_wrapper():
    hq, d = 4, 16
    cache, indptr, indices, _, _, q, want = _prefill_case(1, 4, 0.25)
    kv_lens, qo_lens, qo_indptr = KV_LENS, QO_LENS, QO_INDPTR
    out = torch.empty(9, hq, d)
    got = flashinfer.prefill.trtllm_batch_context_with_kv_cache(
        q, cache, ws(), _block_table(indptr, indices, 8), torch.tensor(kv_lens, dtype=I32),
        max(qo_lens), max(kv_lens), 0.25, 1.0, 3, qo_indptr, None, out=out)
    assert got is out and rel_error(got, want.run(q, cache)) < 1e-6


@pytest.mark.parametrize("give_buffer", [False, True])
def test_trtllm_conventions_return_the_wrappers_lse(give_buffer):
    """return_lse: ``(out, lse)``, lse float32 [tokens, H_qo] base 2 as the planned wrappers';
    a given lse buffer is written (and returned) whether or not return_lse is set."""
    torch.manual_seed(5)
    kv_lens, ps, hq, hk, d = [9, 1, 0, 33], 8, 4, 2, 16
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, "HND")
    q = torch.randn(4, hq, d)
    want = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), "HND")
    want.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32, sm_scale=0.3)
    expected, expected_lse = want.run(q, cache, return_lse=True)
    lse = torch.full((4, hq), float("nan")) if give_buffer else None
    args = (q, cache, ws(), _block_table(indptr, indices, 6), torch.tensor(kv_lens, dtype=I32), 40)
    out, got_lse = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
        *args, bmm1_scale=0.3, return_lse=True, lse=lse)
    assert rel_error(out, expected) < 1e-6 and torch.equal(got_lse, expected_lse)
    if give_buffer:
        assert got_lse is lse
        lse.fill_(float("nan"))
        only_out = flashinfer.decode.trtllm_batch_decode_with_kv_cache(*args, bmm1_scale=0.3, lse=lse)
        assert isinstance(only_out, torch.Tensor) and torch.equal(lse, expected_lse)
    cache, indptr, indices, _, _, q, planned = _prefill_case(1, 4, 0.25)
    ctx_out, ctx_lse = flashinfer.prefill.trtllm_batch_context_with_kv_cache(
        q, cache, ws(), _block_table(indptr, indices, 8), torch.tensor(KV_LENS, dtype=I32),
        max(QO_LENS), max(KV_LENS), 0.25, 1.0, 3, QO_INDPTR, None, return_lse=True)
    want_out, want_lse = planned.run(q, cache, return_lse=True)
    assert rel_error(ctx_out, want_out) < 1e-6 and torch.equal(ctx_lse, want_lse)


def test_page_table_reads_only_the_pages_a_request_needs():
    table = torch.tensor([[4, 9, -1, 77], [2, -5, -5, -5], [8, 3, 1, 0]], dtype=I32)
    indptr, indices, last, lens = page_table(table, torch.tensor([5, 0, 16], dtype=I32), 4)
    assert indptr.tolist() == [0, 2, 2, 6] and indices.tolist() == [4, 9, 8, 3, 1, 0]
    assert last.tolist() == [1, 0, 4] and lens.tolist() == [5, 0, 16]


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(seq_lens=torch.tensor([9, 40], dtype=I32)), ValueError, "needs 5 pages"),
    (dict(seq_lens=torch.tensor([9, -1], dtype=I32)), ValueError, ">= 0"),
    (dict(block_tables=torch.zeros(2, 4, dtype=torch.int64)), TypeError, "int32"),
    (dict(o_sf_scale=1.0), NotImplementedError, "o_sf_scale"),
    (dict(out_dtype="nvfp4"), NotImplementedError, "out_dtype"),
    (dict(bmm1_scale="x"), TypeError, "bmm1_scale"),
    (dict(uses_shared_paged_kv_idx=False), NotImplementedError, "uses_shared_paged_kv_idx"),
])
def test_decode_refuses_what_it_does_not_serve(kwargs, exc, words):
    cache, indptr, indices, last, _, _ = make_paged([9, 3], 8, 2, 16, "HND")
    args = dict(query=torch.randn(2, 4, 16), kv_cache=cache, workspace_buffer=ws(),
                block_tables=_block_table(indptr, indices, 4), seq_lens=torch.tensor([9, 3], dtype=I32),
                max_seq_len=9)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        flashinfer.trtllm_batch_decode_with_kv_cache(**args)


def test_cudnn_decode_convention_and_its_natural_log_lse():
    torch.manual_seed(2)
    kv_lens, ps, hq, hk, d = [9, 16, 1], 8, 4, 2, 16
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, "HND")
    k_cache, v_cache = cache.unbind(1)
    q = torch.randn(3, hq, d)
    want = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), "HND")
    want.plan(indptr, indices, last, hq, hk, d, ps, q_data_type=torch.float32, sm_scale=0.2)
    o2, lse2 = want.run(q, cache, return_lse=True)
    lse = torch.empty(3, hq)
    o, got_lse = flashinfer.cudnn_batch_decode_with_kv_cache(
        q, k_cache, v_cache, 0.2, ws(), max_sequence_kv=16,
        actual_seq_lens_kv=torch.tensor(kv_lens, dtype=I32).view(3, 1, 1, 1),
        block_tables=_block_table(indptr, indices, 2), return_lse=True, lse=lse)
    assert got_lse is lse and rel_error(o, o2) < 1e-6
    torch.testing.assert_close(lse, lse2 * 0.6931471805599453)
    with pytest.raises(NotImplementedError, match="block_tables"):
        flashinfer.cudnn.cudnn_batch_decode_with_kv_cache(q, k_cache, v_cache, 0.2, ws(),
                                                          max_sequence_kv=16)


@pytest.mark.parametrize("paged", [True, False])
def test_cudnn_prefill_convention_paged_and_dense(paged):
    hq, hk, d = 4, 2, 16
    cache, indptr, indices, ks, vs, q, want = _prefill_case(3, hk, 0.3)
    kv_lens, qo_lens, qo_indptr = KV_LENS, QO_LENS, QO_INDPTR
    eo, el = want.run(q, cache, return_lse=True)
    lens_q = torch.tensor(qo_lens, dtype=I32).view(3, 1, 1, 1)
    lens_kv = torch.tensor(kv_lens, dtype=I32).view(3, 1, 1, 1)
    if paged:
        k_cache, v_cache = cache.unbind(1)
        extra = dict(block_tables=_block_table(indptr, indices, 8))
    else:  # the same keys, packed rows
        k_cache, v_cache = torch.cat(ks), torch.cat(vs)
        extra = dict(batch_offsets_k=torch.tensor([0, 12, 17, 47], dtype=I32) * hk * d)
    o, lse = flashinfer.cudnn.cudnn_batch_prefill_with_kv_cache(
        q, k_cache, v_cache, 0.3, ws(), max_token_per_sequence=6, max_sequence_kv=30,
        actual_seq_lens_q=lens_q, actual_seq_lens_kv=lens_kv, causal=True, return_lse=True,
        batch_offsets_q=qo_indptr * hq * d, **extra)
    assert rel_error(o, eo) < 1e-6 and lse.shape == (3, 6, hq)
    rows = [(0, 0, 3), (1, 3, 5), (2, 8, 1)]
    for b, start, n in rows:
        torch.testing.assert_close(lse[b, :n], el[start:start + n] * 0.6931471805599453)
        assert bool(torch.isinf(lse[b, n:]).all())
    with pytest.raises(NotImplementedError, match="packed"):
        flashinfer.cudnn.cudnn_batch_prefill_with_kv_cache(
            q, k_cache, v_cache, 0.3, ws(), max_token_per_sequence=6, max_sequence_kv=30,
            actual_seq_lens_q=lens_q, actual_seq_lens_kv=lens_kv, causal=True, return_lse=False,
            batch_offsets_q=torch.tensor([0, 6, 12, 18], dtype=I32) * hq * d, **extra)
