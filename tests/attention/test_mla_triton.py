"""The Triton split-K MLA kernel (backends/triton/mla.py) against the float64 naive MLA of
test_mla.py: one split and several, page sizes 1 / 3 / 16, causal ragged batches, fp8 caches
with both kinds of scale, lse; bad page ids recorded, the CUDA-graph plan contract. Runs in
Triton's interpreter on the CPU (small shapes) and on a GPU."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA, poison, rel_error
import flashinfer
from flashinfer.backends.triton.mla import make_runner
from mla_helpers import E4M3, I32, _assert_lse, _case, _plan, naive

DEV = "cuda:0" if HAS_CUDA else "cpu"


def _on(t: dict, dtype=torch.bfloat16) -> dict:
    return {k: v.to(DEV, dtype) for k, v in t.items()}


def _wrapper(arrays, page_size, causal, *, heads=4, ckv=32, kpe=16, kv_dtype=None, **ctor):
    return _plan(arrays, page_size, causal, dtype=torch.bfloat16, kv_dtype=kv_dtype,
                 heads=heads, ckv=ckv, kpe=kpe, device=DEV, backend="triton", **ctor)


@pytest.mark.parametrize("page_size, splits", [(1, 1), (3, 2), (16, 3)])
@pytest.mark.parametrize("qo_lens, kv_lens, causal", [
    ([1, 1, 1], [1, 17, 40], False),
    ([2, 2], [9, 33], True),
    ([3, 1, 2], [2, 70, 0], True),  # request 0: 3 rows, 2 keys (its first row sees none)
])
def test_matches_the_naive_mla(page_size, splits, qo_lens, kv_lens, causal):
    arrays, t = _case(qo_lens, kv_lens, page_size=page_size, kpe=16, seed=page_size)
    w = _wrapper(arrays, page_size, causal)
    assert w.decision.backend == "triton"
    w._runner = make_runner(w._plan, num_splits=splits)
    t = _on(t)
    out = poison(torch.empty_like(t["q_nope"]))
    got, lse = w.run(**t, out=out, return_lse=True)
    want, want_lse = naive(arrays, {k: v.cpu().float() for k, v in t.items()}, page_size, causal,
                           0.17)
    assert got is out and rel_error(got.cpu().float(), want) < 1e-2
    _assert_lse(lse.cpu(), want_lse)


@pytest.mark.parametrize("per_token", [False, True])
def test_fp8_cache_with_scales(per_token):
    arrays, t = _case([2, 1], [9, 20], ckv=256, kpe=16, seed=5)
    caches = {k: t[k].to(DEV).to(E4M3) for k in ("ckv_cache", "kpe_cache")}
    q = _on({k: t[k] for k in ("q_nope", "q_pe")})
    w = _wrapper(arrays, 4, True, ckv=256, kv_dtype=E4M3)
    if per_token:  # a scale per token and 128-channel group
        g = torch.Generator().manual_seed(6)
        arr = (torch.rand(caches["ckv_cache"].shape[:-1] + (2,), generator=g) + 0.5).to(DEV)
        got = w.run(**q, **caches, ckv_scale_arr=arr, kpe_scale=2.0)
        scaled = caches["ckv_cache"].float() * arr.repeat_interleave(128, -1)
        ref = dict(ckv_cache=scaled.cpu(), kpe_cache=caches["kpe_cache"].float().cpu())
        want, _ = naive(arrays, {**{k: v.float().cpu() for k, v in q.items()}, **ref}, 4, True,
                        0.17, kpe_scale=2.0)
    else:
        got = w.run(**q, **caches, ckv_scale=0.5, kpe_scale=2.0)
        ref = {k: v.float().cpu() for k, v in {**q, **caches}.items()}
        want, _ = naive(arrays, ref, 4, True, 0.17, ckv_scale=0.5, kpe_scale=2.0)
    assert rel_error(got.cpu().float(), want) < 2e-2


def test_bad_page_id_is_recorded_and_skipped():
    """A page id rewritten past the caches after plan() (plan checked the host ids): the kernel
    records it for check_errors() and skips the token; the other requests are exact."""
    arrays, t = _case([1, 1], [9, 7])
    w = _wrapper({k: v.clone() for k, v in arrays.items()}, 4, False, kpe=8)
    flashinfer.check_errors(DEV)
    bad_page = int(arrays["kv_indptr"][1])  # request 1's first page
    w._plan.kv_indices[bad_page] = 99
    t = _on(t)
    out = w.run(**t)
    assert torch.isfinite(out).all()
    want, _ = naive(arrays, {k: v.cpu().float() for k, v in t.items()}, 4, False, 0.17)
    assert rel_error(out[0].cpu().float(), want[0]) < 1e-2
    with pytest.raises(ValueError, match=rf"kv_indices\[{bad_page}\] = 99"):
        flashinfer.check_errors(DEV)


def _graph_buffers():
    return dict(qo_indptr=torch.zeros(4, dtype=I32, device=DEV),
                kv_indptr=torch.zeros(4, dtype=I32, device=DEV),
                kv_indices=torch.zeros(64, dtype=I32, device=DEV),
                kv_len_arr=torch.zeros(3, dtype=I32, device=DEV))


def test_cuda_graph_plans_share_one_launch_and_cached_module_replans():
    """A CUDA-graph wrapper: the runner reads the fixed buffers, the launch (and its scratch in
    the workspace) stays the first plan's, SGLang's ``_cached_module.plan.default`` re-plans
    from host arrays and the ids written into the fixed kv_indices buffer; a later plan with
    another batch or longer queries is refused."""
    bufs = _graph_buffers()
    arrays, t = _case([2, 2, 2], [10, 30, 5], spare=8, seed=21)
    w = _wrapper(arrays, 4, True, kpe=8, use_cuda_graph=True, **bufs)
    first = w._runner
    t = _on(t)
    got = w.run(**t)
    want, _ = naive(arrays, {k: v.cpu().float() for k, v in t.items()}, 4, True, 0.17)
    assert rel_error(got.cpu().float(), want) < 1e-2

    arrays2, _ = _case([1, 2, 1], [25, 3, 17], spare=8, seed=22)
    bufs["kv_indices"][:arrays2["kv_indices"].shape[0]] = arrays2["kv_indices"].to(DEV)
    w._page_size, w._sm_scale = 4, 0.17
    w._cached_module.plan.default(None, None, None, arrays2["qo_indptr"], arrays2["kv_indptr"],
                                  arrays2["kv_len_arr"], 4, 32, True)
    assert w._runner.launch == first.launch and w._plan.max_qo_len == 2
    if first.part_o is not None:
        assert w._runner.part_o.data_ptr() == first.part_o.data_ptr()
    # the old runner on the captured (6-row) tensors is what a replay runs: rows 0-3 are the
    # new batch's
    got = first(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"],
                torch.empty(6, 4, 32, dtype=torch.bfloat16, device=DEV), None,
                w._scales(w._plan, t["ckv_cache"], None, None, None))
    ref = {k: v.cpu().float() for k, v in t.items()}
    ref.update(q_nope=ref["q_nope"][:4], q_pe=ref["q_pe"][:4])
    want, _ = naive(arrays2, ref, 4, True, 0.17)
    assert rel_error(got[:4].cpu().float(), want) < 1e-2
    with pytest.raises(ValueError, match="first planned for 3 requests of at most 2"):
        w.plan(*(a.to(DEV) for a in _case([3, 1, 1], [9, 9, 9])[0].values()), 4, 32, 8, 4, True,
               0.17, torch.bfloat16, torch.bfloat16)


def test_block_table_from_csr_page_ids():
    """fill_block_table (FlashMLA's CUDA-graph table): row b is request b's page ids, at most
    the table's width, the rest of the row untouched; an id past the caches is recorded (its
    entry of kv_indices named) and written as page 0."""
    from flashinfer.attention.mla_params import MLA_PAGE
    from flashinfer.backends.shared.block_table import BLOCK, fill_block_table

    g = torch.Generator().manual_seed(5)
    pages = [3, 0, BLOCK + 5, 1]  # one request spans two of the kernel's steps
    indptr = torch.tensor([0] + pages, dtype=I32).cumsum(0).to(I32)
    ids = torch.randint(0, 1000, (int(indptr[-1]) + 7,), generator=g, dtype=I32)  # (+ spare)
    width = max(pages)
    table = torch.full((len(pages), width), -5, dtype=I32)
    flashinfer.check_errors(DEV)
    dev_table = table.to(DEV)
    fill_block_table(dev_table, indptr.to(DEV), ids.to(DEV), 1000, MLA_PAGE)
    for b, n in enumerate(pages):
        assert torch.equal(dev_table[b, :n].cpu(), ids[indptr[b]:indptr[b] + n])
        assert (dev_table[b, n:] == -5).all()
    flashinfer.check_errors(DEV)  # nothing recorded
    ids[int(indptr[2]) + 7] = 1000
    narrow = torch.full((len(pages), 4), -5, dtype=I32, device=DEV)
    fill_block_table(narrow, indptr.to(DEV), ids.to(DEV), 1000, MLA_PAGE)
    assert torch.equal(narrow[2].cpu(), ids[indptr[2]:indptr[2] + 4])  # the first 4 of 261
    full = torch.full((len(pages), width), -5, dtype=I32, device=DEV)
    fill_block_table(full, indptr.to(DEV), ids.to(DEV), 1000, MLA_PAGE)
    assert int(full[2, 7]) == 0
    with pytest.raises(ValueError, match=rf"kv_indices\[{int(indptr[2]) + 7}\] = 1000"):
        flashinfer.check_errors(DEV)


def _latent_case(lens, page, num_pages, dtype, seed):
    """``(kv_lens, kv_indptr, kv_indices, cache [num_pages, page, 48])`` of requests of
    ``lens`` tokens on random distinct pages (ckv 32 + kpe 16 per token)."""
    kv_lens = torch.tensor(lens, dtype=I32)
    pages = (kv_lens + page - 1) // page
    indptr = torch.cat([torch.zeros(1, dtype=I32), pages.cumsum(0).to(I32)])
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(num_pages, generator=g)[:int(indptr[-1])].to(I32)
    return kv_lens, indptr, ids, torch.randn(num_pages, page, 48, generator=g).to(dtype)


@pytest.mark.parametrize("kv_dtype", [E4M3, torch.bfloat16])
def test_latent_gather_into_pages_of_64(kv_dtype):
    """gather_latent (flashmla:dequant's first step): request b's tokens, in order, fill the
    output pages gathered_layout gives it, times their scales, rows past its length 0; separate
    ckv / kpe caches of page 3; a bad page id recorded (its entry named) and its token 0."""
    from flashinfer.attention.mla_params import MLA_PAGE
    from flashinfer.backends.shared.latent_gather import gather_latent, gathered_layout

    page = 3
    kv_lens, indptr, ids, cache = _latent_case([5, 0, 130], page, 60, kv_dtype, seed=8)
    ckv, kpe = cache[..., :32], cache[..., 32:]
    page_indptr, req, first = gathered_layout(kv_lens.numpy())
    assert page_indptr.tolist() == [0, 1, 1, 4] and req.tolist() == [0, 2, 2, 2]
    out = poison(torch.empty(int(page_indptr[-1]), 64, 48, dtype=torch.bfloat16, device=DEV))
    dev = lambda a: torch.as_tensor(a).to(DEV)  # noqa: E731
    flashinfer.check_errors(DEV)
    gather_latent(out, ckv.to(DEV), kpe.to(DEV), dev(req), dev(first), dev(indptr), dev(ids),
                  dev(kv_lens), 0.5, 2.0, MLA_PAGE)
    for b, n in enumerate(kv_lens.tolist()):
        toks = [ids[int(indptr[b]) + t // page] for t in range(n)]
        want = torch.stack([torch.cat([ckv[p, t % page].float() * 0.5, kpe[p, t % page].float()
                                       * 2.0]) for t, p in enumerate(toks)]) if n else None
        rows = out.cpu().float()[int(page_indptr[b]):int(page_indptr[b + 1])].reshape(-1, 48)
        if n:
            torch.testing.assert_close(rows[:n], want.to(torch.bfloat16).float())
        assert (rows[n:] == 0).all()
    flashinfer.check_errors(DEV)  # nothing recorded
    ids[int(indptr[2]) + 1] = 60
    gather_latent(out, ckv.to(DEV), kpe.to(DEV), dev(req), dev(first), dev(indptr), dev(ids),
                  dev(kv_lens), 0.5, 2.0, MLA_PAGE)
    assert (out.cpu()[1, 3:6] == 0).all()  # request 2's tokens 3..5: the bad page's
    with pytest.raises(ValueError, match=rf"kv_indices\[{int(indptr[2]) + 1}\] = 60"):
        flashinfer.check_errors(DEV)


def test_latent_gather_layout_made_on_the_device():
    """fill_gathered_table (the CUDA-graph form of gathered_layout) and the gather driven by
    its starts: the same pages as the host layout; output pages past the total are not
    written (a graph's capacity-sized buffer); table rows capped at their width."""
    from flashinfer.attention.mla_params import MLA_PAGE
    from flashinfer.backends.shared.latent_gather import (fill_gathered_table, gather_latent,
                                                          gathered_layout)

    page = 4
    kv_lens, indptr, ids, cache = _latent_case([5, 0, 130, 64], page, 80, E4M3, seed=9)
    page_indptr, req, first = gathered_layout(kv_lens.numpy())
    dev = lambda a: torch.as_tensor(a).to(DEV)  # noqa: E731
    starts = torch.full((5,), -1, dtype=I32, device=DEV)
    table = torch.full((4, 2), -7, dtype=I32, device=DEV)
    fill_gathered_table(dev(kv_lens), starts, table)
    assert starts.cpu().tolist() == page_indptr.tolist()  # [0, 1, 1, 4, 5]
    assert table.cpu().tolist() == [[0, -7], [-7, -7], [1, 2], [4, -7]]
    n = int(page_indptr[-1])
    want = torch.empty(n, 64, 48, dtype=torch.bfloat16, device=DEV)
    args = (dev(indptr), dev(ids), dev(kv_lens), 0.5, 2.0, MLA_PAGE)
    flashinfer.check_errors(DEV)
    gather_latent(want, cache[..., :32].to(DEV), cache[..., 32:].to(DEV), dev(req), dev(first),
                  *args)
    got = poison(torch.empty(n + 2, 64, 48, dtype=torch.bfloat16, device=DEV))
    gather_latent(got, cache[..., :32].to(DEV), cache[..., 32:].to(DEV), None, None, *args,
                  starts=starts)
    assert torch.equal(got[:n].cpu(), want.cpu())
    assert got[n:].float().isnan().all()  # the spare pages: untouched
    flashinfer.check_errors(DEV)
