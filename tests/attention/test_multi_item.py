"""Multi-item scoring in the paged prefill wrapper (flashinfer.attention.multi_item): the mask
upstream's four plan() arguments define, against a per-element oracle and a worked example, the
wrapper's result against the same mask given as custom_mask, and the refusals."""

from __future__ import annotations

import pytest
import torch

from attention_helpers import make_paged, ws
import flashinfer
from flashinfer.attention.multi_item import multi_item_mask

U16, U32, I32 = torch.uint16, torch.uint32, torch.int32


def oracle(qo_len, kv_len, prefix, positions):
    """Per element: prefix rows are causal; an item row sees the prefix and the keys after the
    delimiter that opens its item, up to itself; a delimiter row (position 0) the prefix."""
    mask = torch.zeros(qo_len, kv_len, dtype=torch.bool)
    for r in range(qo_len):
        p = r + kv_len - qo_len
        for j in range(p + 1):
            if p < prefix:
                mask[r, j] = True
            else:
                opener = p - positions[p - prefix]  # the delimiter before the item (or p itself)
                mask[r, j] = j < prefix or opener < j
    return mask


def test_the_worked_example():
    # P0 P1 P2 | D A1 A2 D B1 D
    mask = multi_item_mask(torch.tensor([3], dtype=U32), torch.tensor([0, 1, 2, 0, 1, 0], dtype=U16),
                           6, torch.tensor([2], dtype=U16), torch.tensor([9]), torch.tensor([9]))
    rows = {"A1": 4, "A2": 5, "B1": 7, "D": 3}
    got = mask.view(9, 9)
    assert got[rows["A1"]].nonzero().flatten().tolist() == [0, 1, 2, 4]
    assert got[rows["A2"]].nonzero().flatten().tolist() == [0, 1, 2, 4, 5]
    assert got[rows["B1"]].nonzero().flatten().tolist() == [0, 1, 2, 7]
    for d in (3, 6, 8):
        assert got[d].nonzero().flatten().tolist() == [0, 1, 2]
    assert torch.equal(got, oracle(9, 9, 3, [0, 1, 2, 0, 1, 0]))


def test_batched_rows_with_a_cached_prefix_and_padding_match_the_oracle():
    torch.manual_seed(0)
    qo, kv, prefix = [7, 12, 5], [9, 12, 20], [4, 2, 20]  # request 2: all prefix (plain causal)
    width = 11
    table = torch.zeros(3, width, dtype=torch.int64)
    rows = []
    for b in range(3):
        n_items = kv[b] - prefix[b]
        is_delim = torch.rand(n_items) < 0.3
        is_delim[:1] = True
        pos, run = [], 0
        for d in is_delim.tolist():
            run = 0 if d else run + 1
            pos.append(run)
        table[b, :n_items] = torch.tensor(pos, dtype=torch.int64)
        rows.append(pos)
    mask = multi_item_mask(torch.tensor(prefix), table.flatten().to(U16), width,
                           table.max(1).values.to(U16), torch.tensor(qo), torch.tensor(kv))
    want = torch.cat([oracle(qo[b], kv[b], prefix[b], rows[b]).flatten() for b in range(3)])
    assert torch.equal(mask, want)


@pytest.mark.parametrize("window_left", [-1, 5])
def test_paged_wrapper_runs_the_multi_item_mask(window_left):
    torch.manual_seed(1)
    hq, hk, d, ps = 4, 2, 16, 4
    kv_lens, qo_lens, prefix = [14, 9], [10, 9], [6, 3]
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, "NHD")
    qo_indptr = torch.tensor([0, 10, 19], dtype=I32)
    width = 12
    table = torch.zeros(2, width, dtype=torch.int64)
    table[0, :8] = torch.tensor([0, 1, 2, 0, 1, 2, 3, 0])
    table[1, :6] = torch.tensor([0, 1, 0, 1, 2, 0])
    args = dict(prefix_len_ptr=torch.tensor(prefix, dtype=U32),
                token_pos_in_items_ptr=table.flatten().to(U16), token_pos_in_items_len=width,
                max_item_len_ptr=torch.tensor([3, 2], dtype=U16))
    q = torch.randn(19, hq, d)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    w.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, causal=False, window_left=window_left,
           q_data_type=torch.float32, **args)  # upstream: always causal in this mode
    got, lse = w.run(q, cache, return_lse=True)
    mask = torch.cat([oracle(qo_lens[b], kv_lens[b], prefix[b], table[b].tolist()).flatten()
                      for b in range(2)])
    ref = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    ref.plan(qo_indptr, indptr, indices, last, hq, hk, d, ps, custom_mask=mask,
             window_left=window_left, q_data_type=torch.float32)
    want, want_lse = ref.run(q, cache, return_lse=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)


@pytest.mark.parametrize("change, words", [
    (dict(max_item_len_ptr=None), "together"),
    (dict(token_pos_in_items_len=3), "token_pos_in_items_len is 3"),
    (dict(max_item_len_ptr=torch.tensor([1, 2], dtype=U16)), "max_item_len_ptr\\[0\\]=1"),
    (dict(token_pos_in_items_ptr=torch.zeros(24)), "integer tensor"),
    (dict(custom_mask=torch.ones(1, dtype=torch.bool)), "defines the mask itself"),
])
def test_refusals(change, words):
    cache, indptr, indices, last, _, _ = make_paged([8, 8], 4, 2, 16, "NHD")
    args = dict(prefix_len_ptr=torch.tensor([2, 2], dtype=U32),
                token_pos_in_items_ptr=torch.tensor([0, 1, 2, 0, 1, 0] + [0] * 6 + [0, 1] * 3 + [0] * 6,
                                                    dtype=U16),
                token_pos_in_items_len=12, max_item_len_ptr=torch.tensor([2, 1], dtype=U16))
    args.update(change)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws())
    with pytest.raises((ValueError, TypeError), match=words):
        w.plan(torch.tensor([0, 8, 16], dtype=I32), indptr, indices, last, 4, 2, 16, 4,
               q_data_type=torch.float32, **args)


def test_the_ragged_wrapper_refuses_it():
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws())
    ip = torch.tensor([0, 4], dtype=I32)
    with pytest.raises(NotImplementedError, match="BatchPrefillWithPagedKVCacheWrapper"):
        w.plan(ip, ip, 2, 2, 16, prefix_len_ptr=torch.tensor([1], dtype=U32))


@pytest.mark.gpu
@pytest.mark.parametrize("ids_on_device", [False, True])
def test_gpu_multi_item_scoring_matches_the_cpu_result(ids_on_device):
    """Serving sizes on CUDA (bf16, upstream's four arguments as device tensors, as SGLang
    passes them, or host tensors): the result equals the CPU wrapper's on the same mask."""
    torch.manual_seed(2)
    hq, hk, d, ps = 8, 2, 128, 16
    prefix, n_items, item_len = [120, 37], [5, 9], [20, 7]
    kv_lens = [p + n * (l + 1) for p, n, l in zip(prefix, n_items, item_len)]
    qo_lens = [kv_lens[0] - 64, kv_lens[1]]  # request 0: 64 prefix tokens already cached
    width = max(k - p for k, p in zip(kv_lens, prefix))
    table = torch.zeros(2, width, dtype=torch.int64)
    for b in range(2):
        table[b, :kv_lens[b] - prefix[b]] = torch.arange(item_len[b] + 1).repeat(n_items[b])
    cache, indptr, indices, last, _, _ = make_paged(kv_lens, ps, hk, d, "NHD")
    qo_indptr = torch.tensor([0, qo_lens[0], sum(qo_lens)], dtype=I32)
    q = torch.randn(sum(qo_lens), hq, d)
    dev = "cuda" if ids_on_device else "cpu"
    args = dict(prefix_len_ptr=torch.tensor(prefix, dtype=U32, device=dev),
                token_pos_in_items_ptr=table.flatten().to(U16).to(dev), token_pos_in_items_len=width,
                max_item_len_ptr=torch.tensor(item_len, dtype=U16, device=dev))
    results = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(128 << 20, dtype=torch.uint8, device=device))
        w.plan(qo_indptr.to(device), indptr.to(device), indices.to(device), last.to(device), hq,
               hk, d, ps, q_data_type=dtype, kv_data_type=dtype, **args)
        if device == "cuda":  # the custom mask it defines: the Triton prefill kernel
            assert w.decision.backend == "triton", w.decision.explain()
        out = torch.full((sum(qo_lens), hq, d), float("nan"), dtype=dtype, device=device)
        w.run(q.to(device, dtype), cache.to(device, dtype), out=out)
        results.append(out.float().cpu())
    torch.testing.assert_close(results[1], results[0], rtol=2e-2, atol=2e-2)
