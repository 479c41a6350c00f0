"""cuDNN batch attention planners (flashinfer/backends/cudnn/batch_plan.py, batch_support.py,
_batch_graphs.py): buckets, padded metadata, cache keys and Decisions on CPU; on a GPU with
``cudnn``, paged decode / paged prefill / ragged prefill against a float32 oracle written here,
graph reuse across batch compositions, and CUDA-graph capture + replay."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from flashinfer.backends.cudnn import batch_buckets as bp
from flashinfer.backends.cudnn import batch_support, support
from flashinfer.attention.batch_params import BatchPlan, KVInput, RunScales
from flashinfer.capability_db import database
from flashinfer.dispatch import kernel_for
from flashinfer.optional_packages import import_error
from flashinfer.device import simulated
from flashinfer.attention.batch_params import Tail
from flashinfer.dispatch import Problem, clear_cache, select

OPS = ("batch_decode", "batch_prefill_paged", "batch_prefill_ragged")
SMS = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu")


# ---------------------------------------------------------------------------------------------
# helpers: plans, caches, the float32 oracle


def make_plan(op, qo_lens, kv_lens, *, page_size=16, heads=(4, 2), dim=64, causal=False,
              window_left=-1, layout="NHD", dtype=torch.float16, device="cpu", cuda_graph=False,
              fixed=None, seed=0, num_pages=None, dim_vo=None, host_ids=False, reusable=None):
    """A BatchPlan for requests with these lengths; pages are a random permutation of the pool.
    ``fixed``: dict of preallocated device buffers (a CUDA-graph wrapper's) to copy into;
    ``host_ids``: the page ids also on the host (``kv_indices_host``), as a wrapper plans them
    when they are given there."""
    g = torch.Generator().manual_seed(seed)
    b = len(kv_lens)
    qo = torch.tensor([0] + list(qo_lens), dtype=torch.int64).cumsum(0).to(torch.int32)
    kv_lens_t = torch.tensor(kv_lens, dtype=torch.int32)
    if op == bp.RAGGED:
        kv_indptr = torch.tensor([0] + list(kv_lens), dtype=torch.int64).cumsum(0).to(torch.int32)
        indices, last = None, None
    else:
        counts = [max(1, -(-n // page_size)) if n else 0 for n in kv_lens]
        kv_indptr = torch.tensor([0] + counts, dtype=torch.int64).cumsum(0).to(torch.int32)
        pool = num_pages or int(kv_indptr[-1]) + 3
        indices = torch.randperm(pool, generator=g)[:int(kv_indptr[-1])].to(torch.int32)
        last = torch.tensor([(n - 1) % page_size + 1 if n else 0 for n in kv_lens], dtype=torch.int32)
    dev = torch.device(device)

    def on_device(name, t):
        if t is None:
            return None
        if fixed is None:
            return t.to(dev)
        buf = fixed[name]
        buf[:t.numel()].copy_(t)
        return buf[:t.numel()]

    return BatchPlan(
        op=op, device=dev, batch_size=b, num_qo_heads=heads[0], num_kv_heads=heads[1],
        head_dim_qk=dim, head_dim_vo=dim_vo or dim, page_size=0 if op == bp.RAGGED else page_size,
        kv_layout=layout, q_dtype=dtype, kv_dtype=dtype, o_dtype=dtype, causal=causal,
        window_left=window_left, logits_soft_cap=0.0, sm_scale=1 / math.sqrt(dim),
        q_len_per_req=1 if op == bp.DECODE else 0,
        qo_indptr_host=qo, kv_indptr_host=kv_indptr, kv_lens_host=kv_lens_t,
        kv_last_page_len_host=last, qo_indptr=on_device("qo_indptr", qo),
        kv_indptr=on_device("kv_indptr", kv_indptr), kv_indices=on_device("kv_indices", indices),
        kv_lens=on_device("kv_lens", kv_lens_t), kv_last_page_len=on_device("last", last),
        total_qo=int(qo[-1]), max_qo_len=max(qo_lens, default=0),
        max_kv_len=max(kv_lens, default=0), cuda_graph=cuda_graph,
        kv_indices_host=indices if host_ids else None, reusable=reusable)


def gather_kv(plan, kv, b):
    """Request ``b``'s keys and values ``[kv_len, Hkv, D]`` as the contract defines them."""
    n = int(plan.kv_lens_host[b])
    if plan.op == bp.RAGGED:
        lo = int(plan.kv_indptr_host[b])
        return kv.k[lo:lo + n], kv.v[lo:lo + n]
    lo, hi = int(plan.kv_indptr_host[b]), int(plan.kv_indptr_host[b + 1])
    pages = plan.kv_indices.cpu()[lo:hi].long()
    k, v = kv.k.cpu()[pages], kv.v.cpu()[pages]
    if plan.kv_layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    return k.flatten(0, 1)[:n], v.flatten(0, 1)[:n]


def oracle(plan, q, kv):
    """float32 attention per request: bottom-right causal, window, GQA; lse base 2."""
    out = torch.zeros(q.shape[0], plan.num_qo_heads, plan.head_dim_vo)
    lse = torch.full((q.shape[0], plan.num_qo_heads), -math.inf)
    group = plan.num_qo_heads // plan.num_kv_heads
    kv = KVInput(kv.k.cpu(), kv.v.cpu())  # one copy, not one per request
    q = q.cpu()
    for b in range(plan.batch_size):
        lo, hi = int(plan.qo_indptr_host[b]), int(plan.qo_indptr_host[b + 1])
        k, v = (t.float().repeat_interleave(group, dim=1) for t in gather_kv(plan, kv, b))
        n, m = hi - lo, k.shape[0]
        if n == 0 or m == 0:
            continue
        s = torch.einsum("qhd,khd->hqk", q[lo:hi].float().cpu(), k) * plan.sm_scale
        rows = torch.arange(n)[:, None] + (m - n)
        cols = torch.arange(m)[None, :]
        keep = torch.ones(n, m, dtype=torch.bool)
        if plan.causal:
            keep &= cols <= rows
        if plan.window_left >= 0:
            keep &= cols >= rows - plan.window_left
        s = s.masked_fill(~keep, -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # [h, n]
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[lo:hi] = torch.einsum("hqk,khd->qhd", p, v)
        lse[lo:hi] = (row_lse / math.log(2)).t()
    return out, lse


@pytest.fixture
def versions(monkeypatch):
    pinned = {"value": None}
    monkeypatch.setattr(support, "installed_versions", lambda: pinned["value"])
    clear_cache()

    def set_versions(value):
        pinned["value"] = value
        clear_cache()
    yield set_versions
    clear_cache()


# ---------------------------------------------------------------------------------------------
# buckets and cache keys


def test_decode_spec_buckets_batch_and_pages():
    plan = make_plan(bp.DECODE, [1] * 5, [1, 16, 17, 200, 33])
    spec = bp.make_spec(plan, device_index=0, scale=plan.sm_scale)
    assert (spec.batch_bucket, spec.qo_bucket, spec.kv_bucket) == (8, 1, 16)  # 200 -> 13 pages
    assert not spec.ragged_q and spec.max_kv_len == 16 * 16
    assert spec.q_dims() == [8, 4, 1, 64] and spec.q_stride() == [256, 64, 256, 1]
    assert spec.table_dims() == [8, 1, 16, 1]


def test_prefill_spec_buckets_rows_and_is_ragged():
    plan = make_plan(bp.PAGED, [3, 100, 1], [50, 300, 1], causal=True)
    spec = bp.make_spec(plan, device_index=0, scale=plan.sm_scale)
    assert (spec.batch_bucket, spec.qo_bucket, spec.kv_bucket) == (4, 128, 32)
    assert spec.ragged_q and spec.causal and spec.left_bound is None
    assert spec.q_stride() == [128 * 4 * 64, 64, 4 * 64, 1]


def test_ragged_spec_buckets_kv_rows():
    plan = make_plan(bp.RAGGED, [5, 7], [70, 9], causal=True)
    spec = bp.make_spec(plan, device_index=0, scale=plan.sm_scale)
    assert spec.page_size == 0 and spec.kv_bucket == 128 and spec.max_kv_len == 128


def test_new_composition_in_the_same_bucket_has_the_same_key():
    a = make_plan(bp.DECODE, [1] * 50, [100 + 7 * i for i in range(50)], seed=1)
    b = make_plan(bp.DECODE, [1] * 33, [1 + 13 * i for i in range(33)], seed=2)
    ka = bp.make_spec(a, device_index=0, scale=a.sm_scale)
    kb = bp.make_spec(b, device_index=0, scale=b.sm_scale)
    assert ka == kb and hash(ka) == hash(kb)


@pytest.mark.parametrize("change", ["batch", "pages", "causal", "window", "heads", "dtype"])
def test_keys_separate_what_the_graph_depends_on(change):
    base = dict(qo_lens=[4, 4], kv_lens=[40, 40], causal=False)
    other = dict(base)
    if change == "batch":
        other.update(qo_lens=[4] * 3, kv_lens=[40] * 3)
    elif change == "pages":
        other.update(kv_lens=[40, 1000])
    elif change == "causal":
        other.update(causal=True)
    elif change == "window":
        other.update(causal=True, window_left=8)
        base.update(causal=True)
    elif change == "heads":
        other.update(heads=(8, 2))
    else:
        other.update(dtype=torch.bfloat16)
    specs = [bp.make_spec(make_plan(bp.PAGED, **kw), device_index=0, scale=0.125)
             for kw in (base, other)]
    assert specs[0] != specs[1]


def test_decode_window_uses_the_causal_like_band():
    plan = make_plan(bp.DECODE, [1, 1], [40, 9], window_left=7)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    assert spec.causal and spec.left_bound == 8
    assert not bp.make_spec(make_plan(bp.DECODE, [1], [9], causal=True), device_index=0,
                            scale=0.1).causal


def test_min_kv_and_fits():
    plan = make_plan(bp.DECODE, [1] * 3, [20, 40, 60])
    wide = bp.make_spec(plan, device_index=0, scale=0.1, min_kv=100)
    assert wide.kv_bucket == 128 and bp.fits(wide, plan)
    bigger = make_plan(bp.DECODE, [1] * 9, [20] * 9)
    assert not bp.fits(wide, bigger)


def test_kv_key_and_container_views():
    cache = torch.randn(10, 16, 2, 64)  # NHD
    c = bp.container(cache, "NHD")
    assert c.shape == (10, 2, 16, 64) and c.stride() == (2048, 64, 128, 1)
    assert bp.container(cache.transpose(1, 2), "HND").shape == (10, 2, 16, 64)
    assert bp.kv_key(c, c) != bp.kv_key(c.contiguous(), c.contiguous())


# ---------------------------------------------------------------------------------------------
# padded metadata


def test_decode_metadata_pads_with_one_and_page_zero():
    plan = make_plan(bp.DECODE, [1] * 3, [1, 17, 0], seed=3)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    meta = bp.build_metadata(spec, plan)
    assert meta.seq_len_q.view(-1).tolist() == [1, 1, 1, 1]
    assert meta.seq_len_kv.view(-1).tolist() == [1, 17, 1, 1]  # empty request runs on one key
    assert meta.q_offsets is None and meta.k_offsets is None
    assert meta.dead_rows[:3].tolist() == [False, False, True] and meta.num_dead == 1
    table = torch.empty(spec.table_dims(), dtype=torch.int32)
    bp.fill_page_table(table, meta.page_src, plan.kv_indices)
    ids = plan.kv_indices.tolist()
    # each request's pages first; every other entry (padding: past seq_len_kv, never read) is
    # still one of the batch's page ids, so no entry can point outside the cache
    rows = table.view(4, 2).tolist()
    assert rows[0][0] == ids[0] and rows[1] == [ids[1], ids[2]]
    assert all(entry in ids for row in rows for entry in row)


@pytest.mark.parametrize("seed", range(6))
def test_page_table_rows_are_the_requests_pages_then_the_last_page(seed):
    g = torch.Generator().manual_seed(100 + seed)
    b = int(torch.randint(1, 20, (1,), generator=g))
    kv = torch.randint(0, 200, (b,), generator=g).tolist()
    plan = make_plan(bp.DECODE, [1] * b, kv, page_size=8, seed=seed)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    src = bp.build_metadata(spec, plan).page_src.view(spec.batch_bucket, spec.kv_bucket)
    indptr = plan.kv_indptr_host.tolist()
    last = max(indptr[-1] - 1, 0)
    for r in range(b):  # naive: position indptr[r] + j, clipped to the last listed page
        assert src[r].tolist() == [min(indptr[r] + j, last) for j in range(spec.kv_bucket)]
    assert not src[b:].any()  # padded requests: position 0


def assert_gathered_rows(gathered: torch.Tensor, table: torch.Tensor, plan) -> None:
    """A gathered decode page table (:func:`bp.gather_decode_table`) against the metadata
    contract's ``table`` (:func:`bp.fill_page_table`): each request's row equal wherever its
    position names a listed page, page 0 past the last one (never read); every entry, the
    padded requests' rows included, a valid id."""
    b, n, pb = plan.batch_size, int(plan.kv_indptr_host[-1]), table.shape[2]
    pos = plan.kv_indptr_host[:-1, None] + torch.arange(pb)
    rows, want = gathered.reshape(-1, pb)[:b].cpu(), table.reshape(-1, pb)[:b]
    listed = pos < n
    assert torch.equal(rows[listed], want[listed]) and not rows[~listed].any()
    assert set(gathered.view(-1).tolist()) <= set(plan.kv_indices.tolist()) | {0}


@pytest.mark.parametrize("seed", range(6))
def test_decode_arrays_match_the_metadata_contract(seed):
    g = torch.Generator().manual_seed(300 + seed)
    b = int(torch.randint(1, 20, (1,), generator=g))
    kv = torch.randint(0, 200, (b,), generator=g).tolist()
    if seed == 5:
        kv = [0] * b  # no page at all
    elif seed % 2 == 0:
        kv[int(torch.randint(0, b, (1,), generator=g))] = 0
    plan = make_plan(bp.DECODE, [1] * b, kv, page_size=8, seed=seed, host_ids=True)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    host = bp.build_metadata(spec, plan)
    table = torch.empty(spec.table_dims(), dtype=torch.int32)
    bp.fill_page_table(table, host.page_src, plan.kv_indices)
    arrays = bp.decode_arrays(spec, plan)
    assert set(arrays) == {"seq_len_kv", "row_starts"}
    # the wrapper uploads the ids with Prepared.kv_indices_tail = Pb zeros
    padded = Tail(plan.kv_indices_host.numpy(), spec.kv_bucket).joined()
    on_device = Tail(plan.kv_indices, spec.kv_bucket).joined()  # the one-phase planner's form
    assert torch.equal(on_device, torch.from_numpy(padded))
    n = int(plan.kv_indptr_host[-1])
    assert padded.shape == (n + spec.kv_bucket,) and not padded[n:].any()
    assert all(a.dtype == np.int32 and a.ndim == 1
               for a in (arrays["seq_len_kv"], arrays["row_starts"], padded))
    assert np.array_equal(arrays["seq_len_kv"], host.seq_len_kv.view(-1).numpy())
    gathered = torch.full(spec.table_dims(), -1, dtype=torch.int32)
    bp.gather_decode_table(gathered, torch.from_numpy(padded),
                           torch.from_numpy(arrays["row_starts"]))
    assert_gathered_rows(gathered, table, plan)


def test_prefill_metadata_offsets_and_padding():
    plan = make_plan(bp.PAGED, [3, 0, 5], [3, 4, 40], heads=(4, 2), dim=64)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    meta = bp.build_metadata(spec, plan)
    row = 4 * 64
    assert meta.seq_len_q.view(-1).tolist() == [3, 0, 5, 0]
    assert meta.q_offsets.view(-1).tolist() == [0, 3 * row, 3 * row, 8 * row, 8 * row]
    assert meta.o_offsets.dtype == torch.int32 and meta.o_offsets.shape == (5, 1, 1, 1)
    assert meta.stats_b[:8].tolist() == [0, 0, 0, 2, 2, 2, 2, 2]
    assert meta.stats_pos[:8].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert meta.stats_b.numel() == spec.batch_bucket * spec.qo_bucket


def test_causal_rows_before_the_first_key_are_dead():
    plan = make_plan(bp.PAGED, [5, 2], [3, 0], causal=True)
    meta = bp.build_metadata(bp.make_spec(plan, device_index=0, scale=0.1), plan)
    assert meta.dead_rows[:7].tolist() == [True, True, False, False, False, True, True]
    plain = make_plan(bp.PAGED, [5], [3], causal=False)
    assert bp.build_metadata(bp.make_spec(plain, device_index=0, scale=0.1), plain).num_dead == 0


def test_ragged_metadata_kv_offsets():
    plan = make_plan(bp.RAGGED, [2, 2, 1], [5, 0, 7], heads=(4, 2), dim=64, dim_vo=32)
    spec = bp.make_spec(plan, device_index=0, scale=0.1)
    meta = bp.build_metadata(spec, plan)
    assert meta.page_src is None
    assert meta.k_offsets.view(-1).tolist() == [0, 0, 5 * 128, 0, 0]  # empty request -> row 0
    assert meta.v_offsets.view(-1).tolist() == [0, 0, 5 * 64, 0, 0]
    assert meta.seq_len_kv.view(-1).tolist() == [5, 1, 7, 1]


def test_metadata_is_one_aligned_buffer_and_unpacks_to_its_fields():
    plan = make_plan(bp.PAGED, [3, 5, 2], [9, 40, 2], causal=True)
    meta = bp.build_metadata(bp.make_spec(plan, device_index=0, scale=0.1), plan)
    assert meta.flat.dtype == torch.uint8  # every dtype in one upload
    assert {dtype for _, dtype, _ in meta.layout.values()} == {torch.int32, torch.int64, torch.bool}
    assert all(offset % bp.ALIGN_BYTES == 0 for offset, _, _ in meta.layout.values())
    for name, view in bp.unpack(meta.flat.clone(), meta.layout).items():
        field = getattr(meta, name)
        assert view.dtype == field.dtype and torch.equal(view, field)


def interpret(spec, meta, plan, q, kv):
    """What a graph of ``spec`` computes from ``meta`` (the cuDNN padding-mask semantics), then
    the runner's clearing of dead rows: shows the metadata describe the contract."""
    table = None
    if spec.page_size:
        table = torch.empty(spec.table_dims(), dtype=torch.int32)
        bp.fill_page_table(table, meta.page_src, plan.kv_indices)
        table = table.view(spec.batch_bucket, -1)
    group = spec.num_qo_heads // spec.num_kv_heads
    out = torch.zeros(q.shape[0], spec.num_qo_heads, spec.head_dim_vo)
    lse = torch.full((q.shape[0], spec.num_qo_heads), -math.inf)
    row_q = spec.num_qo_heads * spec.head_dim_qk
    for b in range(plan.batch_size):
        n, m = int(meta.seq_len_q.view(-1)[b]), int(meta.seq_len_kv.view(-1)[b])
        lo = int(meta.q_offsets.view(-1)[b]) // row_q if spec.ragged_q else b
        if spec.page_size:
            pages = table[b].long()
            k, v = kv.k[pages], kv.v[pages]
            if plan.kv_layout == "HND":
                k, v = k.transpose(1, 2), v.transpose(1, 2)
            k, v = k.flatten(0, 1)[:m], v.flatten(0, 1)[:m]
        else:
            start = int(meta.k_offsets.view(-1)[b]) // (spec.num_kv_heads * spec.head_dim_qk)
            k, v = kv.k[start:start + m], kv.v[start:start + m]
        k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q[lo:lo + n].float(), k) * spec.sm_scale
        rows = torch.arange(n)[:, None] + (m - n)
        keep = torch.ones(n, m, dtype=torch.bool)
        if spec.causal:
            keep &= torch.arange(m)[None] <= rows
        s = s.masked_fill(~keep, -math.inf)
        lse_b = torch.logsumexp(s, -1)
        out[lo:lo + n] = torch.einsum("hqk,khd->qhd", torch.exp(s - lse_b[..., None]).nan_to_num(0), v)
        lse[lo:lo + n] = (lse_b / math.log(2)).t()
    dead = meta.dead_rows[:q.shape[0]]
    out[dead], lse[dead] = 0.0, -math.inf
    return out, lse


@pytest.mark.parametrize("op,layout,qo,kv,causal", [
    (bp.DECODE, "NHD", [1] * 5, [1, 15, 16, 17, 0], False),
    (bp.DECODE, "HND", [1] * 3, [33, 64, 2], True),
    (bp.PAGED, "NHD", [4, 1, 7], [20, 16, 40], True),
    (bp.PAGED, "HND", [6, 3], [4, 30], True),
    (bp.PAGED, "NHD", [3, 5], [9, 17], False),
    (bp.RAGGED, "NHD", [4, 2, 3], [9, 0, 3], True),
])
def test_metadata_describe_the_contract(op, layout, qo, kv, causal):
    torch.manual_seed(0)
    plan = make_plan(op, qo, kv, causal=causal, layout=layout, page_size=16, heads=(4, 2), dim=32)
    spec = bp.make_spec(plan, device_index=0, scale=plan.sm_scale)
    meta = bp.build_metadata(spec, plan)
    q = torch.randn(plan.total_qo, 4, 32)
    if op == bp.RAGGED:
        total = int(plan.kv_indptr_host[-1])
        kvi = KVInput(torch.randn(total, 2, 32), torch.randn(total, 2, 32))
    else:
        pool = plan.kv_indices.numel() + 3
        shape = (pool, 16, 2, 32) if layout == "NHD" else (pool, 2, 16, 32)
        kvi = KVInput(torch.randn(shape), torch.randn(shape))
    out, lse = interpret(spec, meta, plan, q, kvi)
    ref_out, ref_lse = oracle(plan, q, kvi)
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# records and decisions on simulated SMs


def batch_problem(op="batch_decode", sm="9.0", *, dtype="bfloat16", kv_dtype=None, head_dim=128,
                  features=("gqa", "lse"), layout="NHD", page_size=16):
    shape = {"head_dim_qk": head_dim, "head_dim_vo": head_dim, "num_qo_heads": 32,
             "num_kv_heads": 8, "batch_size": 64, "max_qo_len": 1 if op == "batch_decode" else 4096,
             "max_kv_len": 4096, "total_qo_len": 64, "q_len_per_req": 1 if op == "batch_decode" else 0}
    if op != "batch_prefill_ragged":
        shape["page_size"] = page_size
    return Problem.make(op, simulated(None if sm == "cpu" else sm),
                        dtypes={"q": dtype, "kv": kv_dtype or dtype, "o": dtype},
                        shape=shape, features=features, layout=layout)


def cudnn_candidate(problem):
    return next(c for c in select(problem, assume_installed=True).candidates if c.backend == "cudnn")


@pytest.mark.parametrize("op", OPS)
def test_records_are_verified_on_sm90_and_declare_what_is_implemented(op):
    (rec,) = database().for_backend_op("cudnn", op)
    assert rec.verified and rec.verified_on == ((9, 0),) and rec.requires == ("cudnn",)
    assert {"soft_cap", "sinks", "custom_mask", "fp8_kv", "o_dtype_differs"}.isdisjoint(rec.features)
    assert {"causal", "gqa", "lse", "window", "cuda_graph"} <= rec.features
    assert set(rec.layouts) == {"NHD", "HND"}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op", OPS)
def test_decision_per_sm(versions, sm, op):
    cand = cudnn_candidate(batch_problem(op, sm, features=("gqa", "lse", "causal")))
    if sm == "cpu":
        assert not cand.usable and any(r.field == "device" for r in cand.reasons)
    elif sm == "7.5":
        assert not cand.usable and any(r.field == "sm" for r in cand.reasons)
    else:
        assert cand.usable, [str(r) for r in cand.reasons]


@pytest.mark.parametrize("feature", ["soft_cap", "sinks", "custom_mask", "fp8_kv", "o_dtype_differs"])
def test_undeclared_features_are_rejected(versions, feature):
    cand = cudnn_candidate(batch_problem("batch_prefill_paged", features=("gqa", feature)))
    assert not cand.usable and any(r.actual == feature for r in cand.reasons)


def test_page_size_outside_the_record(versions):
    cand = cudnn_candidate(batch_problem(page_size=8))
    assert not cand.usable and any(r.field == "page_size" for r in cand.reasons)


@pytest.mark.parametrize("sm,op,usable", [
    ("9.0", "batch_decode", True), ("8.0", "batch_decode", False), ("10.0", "batch_decode", False),
    ("9.0", "batch_prefill_paged", True), ("10.0", "batch_prefill_paged", True),
    ("8.0", "batch_prefill_paged", False),
])
def test_head_dim_256_per_sm(versions, sm, op, usable):
    cand = cudnn_candidate(batch_problem(op, sm, head_dim=256))
    assert cand.usable == usable
    if not usable:
        assert any(r.field == "head_dim_qk" for r in cand.reasons)


def test_kv_dtype_must_equal_q_dtype(versions):
    cand = cudnn_candidate(batch_problem(dtype="bfloat16", kv_dtype="float16"))
    assert not cand.usable and any(r.field == "dtypes.kv" for r in cand.reasons)


def test_prefill_window_needs_causal(versions):
    assert not cudnn_candidate(batch_problem("batch_prefill_paged", features=("window",))).usable
    assert cudnn_candidate(batch_problem("batch_prefill_paged", features=("window", "causal"))).usable
    assert cudnn_candidate(batch_problem("batch_decode", features=("window",))).usable


def test_version_gates(versions):
    versions(support.Versions((1, 32, 0), 90400))
    cand = cudnn_candidate(batch_problem("batch_prefill_paged", features=("causal",)))
    fields = {(r.field, r.allowed) for r in cand.reasons}
    assert ("cudnn_version", ">=9.5.0") in fields and ("cudnn_version", ">=9.6.0") in fields
    versions(support.Versions((1, 12, 0), 91900))
    cand = cudnn_candidate(batch_problem())
    assert [r.field for r in cand.reasons] == ["cudnn_frontend"]


def test_no_reasons_off_cuda():
    assert batch_support.reasons(batch_problem(sm="cpu"), None) == []


def test_planners_registered_without_importing_cudnn():
    import subprocess
    import sys

    for op in OPS:
        (rec,) = database().for_backend_op("cudnn", op)
        assert callable(kernel_for("cudnn", op)) and rec.check_ref is not None
    code = ("import sys, flashinfer.backends.cudnn, flashinfer.backends.cudnn.batch_buckets; "
            "print('cudnn' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# GPU: against the float32 oracle


def _gpu_ready():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if import_error("cudnn"):
        return f"cudnn does not import: {import_error('cudnn')}"
    return None


needs_gpu = pytest.mark.skipif(_gpu_ready() is not None, reason=str(_gpu_ready()))


def random_lengths(b, longest, seed, *, at_least=1):
    g = torch.Generator().manual_seed(seed)
    edges = [1, 15, 16, 17, longest]
    return [edges[i] if i < len(edges) else int(torch.randint(at_least, longest + 1, (1,), generator=g))
            for i in range(b)]


def cuda_inputs(plan, *, pool_extra=5, pool=None, seed=0):
    torch.manual_seed(seed)
    dev, dt = plan.device, plan.q_dtype
    q = torch.randn(plan.total_qo, plan.num_qo_heads, plan.head_dim_qk, device=dev, dtype=dt)
    if plan.op == bp.RAGGED:
        total = int(plan.kv_indptr_host[-1])
        k = torch.randn(total, plan.num_kv_heads, plan.head_dim_qk, device=dev, dtype=dt)
        v = torch.randn(total, plan.num_kv_heads, plan.head_dim_vo, device=dev, dtype=dt)
        return q, KVInput(k, v)
    if pool is None:
        pool = int(plan.kv_indices.max()) + pool_extra if plan.kv_indices.numel() else pool_extra
    page = plan.page_size
    shape = (pool, 2, page, plan.num_kv_heads, plan.head_dim_qk) if plan.kv_layout == "NHD" else (
        pool, 2, plan.num_kv_heads, page, plan.head_dim_qk)
    cache = torch.randn(shape, device=dev, dtype=dt)
    return q, KVInput(cache[:, 0], cache[:, 1])  # a 5-D cache split: strided views


def run_and_check(plan, q, kv, *, atol=2e-2):
    from flashinfer.backends import cudnn as adapter

    runner = kernel_for("cudnn", plan.op, "default")(plan)
    out = torch.full((q.shape[0], plan.num_qo_heads, plan.head_dim_vo), math.nan,
                     device=q.device, dtype=plan.o_dtype)
    lse = torch.full((q.shape[0], plan.num_qo_heads), math.nan, device=q.device)
    runner(q, kv, out, lse, RunScales())
    torch.cuda.synchronize()
    ref_out, ref_lse = oracle(plan, q, kv)
    torch.testing.assert_close(out.float().cpu(), ref_out, atol=atol, rtol=atol)
    torch.testing.assert_close(lse.cpu(), ref_lse, atol=atol, rtol=atol)
    return runner


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("b", [1, 7, 16])
def test_gpu_decode(dtype, layout, b):
    kv = random_lengths(b, 300, seed=b)
    plan = make_plan(bp.DECODE, [1] * b, kv, heads=(8, 2), dim=128, layout=layout, dtype=dtype,
                     device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_prefill_paged(layout, causal):
    kv = random_lengths(6, 400, seed=3)
    qo = [max(1, n // 3) for n in kv]
    plan = make_plan(bp.PAGED, qo, kv, heads=(8, 2), dim=128, layout=layout, causal=causal,
                     dtype=torch.bfloat16, device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
def test_gpu_prefill_rows_before_the_first_key():
    plan = make_plan(bp.PAGED, [20, 3], [5, 0], heads=(4, 4), dim=64, causal=True,
                     dtype=torch.float16, device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
def test_gpu_prefill_window():
    plan = make_plan(bp.PAGED, [40, 7], [100, 30], heads=(8, 2), dim=128, causal=True,
                     window_left=24, dtype=torch.bfloat16, device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_prefill_ragged(causal):
    kv = random_lengths(5, 300, seed=4)
    plan = make_plan(bp.RAGGED, [max(1, n // 2) for n in kv], kv, heads=(8, 2), dim=128,
                     causal=causal, dtype=torch.bfloat16, device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
def test_gpu_decode_batch_64_kv_4096():
    plan = make_plan(bp.DECODE, [1] * 64, [4096] * 64, heads=(32, 8), dim=128,
                     dtype=torch.bfloat16, device="cuda")
    run_and_check(plan, *cuda_inputs(plan))


@pytest.mark.gpu
@needs_gpu
def test_gpu_new_composition_reuses_the_graph():
    from flashinfer.backends import cudnn as adapter

    first = make_plan(bp.DECODE, [1] * 12, random_lengths(12, 250, seed=5), heads=(8, 2),
                      dim=128, dtype=torch.bfloat16, device="cuda", num_pages=300)
    q, kv = cuda_inputs(first, pool=300)
    run_and_check(first, q, kv)
    before = adapter.batch_graph_cache_state()
    second = make_plan(bp.DECODE, [1] * 9, random_lengths(9, 240, seed=6), heads=(8, 2),
                       dim=128, dtype=torch.bfloat16, device="cuda", num_pages=300, seed=7)
    run_and_check(second, q[:9], kv)
    after = adapter.batch_graph_cache_state()
    assert after["size"] == before["size"] and after["misses"] == before["misses"]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("seed", range(6))
def test_gpu_decode_planner_writes_the_host_contract(seed):
    """Dense decode's planner (page ids on the host or the device, CUDA-graph or not) leaves on
    the device exactly what build_metadata describes, into poisoned buffers."""
    from flashinfer.backends.cudnn import _batch_graphs as cg

    g = torch.Generator().manual_seed(200 + seed)
    b = int(torch.randint(1, 20, (1,), generator=g))
    kv = torch.randint(0, 200, (b,), generator=g).tolist()
    if seed % 2 == 0:
        kv[int(torch.randint(0, b, (1,), generator=g))] = 0  # a request without keys
    graph = seed >= 4
    kw = dict(page_size=8, seed=seed, device="cuda", cuda_graph=graph, host_ids=seed % 3 == 0,
              reusable={})
    if graph:  # a CUDA-graph wrapper's fixed index buffers (the store's key)
        kw["fixed"] = {n: torch.zeros(4096, dtype=torch.int32, device="cuda")
                       for n in ("qo_indptr", "kv_indptr", "kv_indices", "kv_lens", "last")}
    plan = make_plan(bp.DECODE, [1] * b, kv, **kw)
    first = cg.plan(plan).buffers  # the next plan reuses these buffers: poison what it rewrites
    for t in (first.tensors["seq_len_kv"], first.tensors["dead_rows"], first.page_table):
        t.view(torch.uint8).fill_(0x7F)
    runner = cg.plan(plan)
    assert runner.buffers is first
    torch.cuda.synchronize()
    spec = runner.spec
    host = bp.build_metadata(spec, plan)
    table = torch.empty(spec.table_dims(), dtype=torch.int32)
    bp.fill_page_table(table, host.page_src, plan.kv_indices.cpu())
    assert torch.equal(runner.seq_len_kv.cpu(), host.seq_len_kv)
    assert torch.equal(runner.buffers.tensors["seq_len_q"].cpu(), host.seq_len_q)
    assert_gathered_rows(runner.buffers.page_table, table, plan)
    assert runner.clear_dead == (host.num_dead > 0 or graph)
    if runner.clear_dead:
        assert torch.equal(runner.buffers.tensors["dead_rows"][:b].cpu(), host.dead_rows[:b])


@pytest.mark.gpu
@needs_gpu
def test_gpu_next_plan_of_a_wrapper_refills_its_buffers():
    import dataclasses

    from flashinfer.backends import cudnn as adapter

    reusable: dict = {}
    kept = []
    # 12 and 10 requests share bucket 16 (both padded); 16 requests need unpadded buffers
    for seed, b in ((11, 12), (12, 10), (13, 16)):
        plan = make_plan(bp.DECODE, [1] * b, random_lengths(b, 250, seed=seed), heads=(8, 2),
                         dim=128, dtype=torch.bfloat16, device="cuda", num_pages=300, seed=seed)
        plan = dataclasses.replace(plan, reusable=reusable)
        q, kv = cuda_inputs(plan, pool=300, seed=seed)
        runner = run_and_check(plan, q, kv)
        kept.append(runner.buffers)
        assert reusable["cudnn"] is runner.buffers
    assert kept[0] is kept[1] and kept[2] is not kept[1]
    fresh = kernel_for("cudnn", bp.DECODE, "default")(make_plan(
        bp.DECODE, [1] * 12, [5] * 12, heads=(8, 2), dim=128, dtype=torch.bfloat16, device="cuda"))
    assert fresh.buffers is not kept[2]  # a plan without a wrapper's dict keeps nothing


@pytest.mark.gpu
@needs_gpu
def test_gpu_cuda_graph_capture_and_replay():
    from flashinfer.backends import cudnn as adapter

    b, dev = 8, torch.device("cuda")
    fixed = {name: torch.zeros(n, dtype=torch.int32, device=dev) for name, n in (
        ("qo_indptr", b + 1), ("kv_indptr", b + 1), ("kv_indices", 512), ("kv_lens", b), ("last", b))}
    common = dict(heads=(8, 2), dim=128, dtype=torch.bfloat16, device="cuda", cuda_graph=True,
                  fixed=fixed, num_pages=400)
    plan = make_plan(bp.DECODE, [1] * b, random_lengths(b, 200, seed=8), seed=8, **common)
    q_buf, kv = cuda_inputs(plan, pool=400)
    out = torch.empty(b, 8, 128, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(b, 8, device=dev)
    runner = kernel_for("cudnn", bp.DECODE, "default")(plan)
    runner(q_buf, kv, out, lse, RunScales())  # warm-up: builds the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(q_buf, kv, out, lse, RunScales())
    for seed in (9, 10):
        plan = make_plan(bp.DECODE, [1] * b, random_lengths(b, 380, seed=seed), seed=seed, **common)
        kernel_for("cudnn", bp.DECODE, "default")(plan)  # refills the runner's buffers
        q_buf.copy_(torch.randn_like(q_buf))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = oracle(plan, q_buf, kv)
        torch.testing.assert_close(out.float().cpu(), ref_out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse.cpu(), ref_lse, atol=2e-2, rtol=2e-2)
