"""Block-sparse attention (flashinfer/attention/block_sparse.py, flashinfer.sparse) against float64
dense attention under the same mask: BSR maps of densities 0 / 10 / 50 / 100 %, partial last row
blocks, masks inside blocks (bool and packed), causal block patterns, GQA, the per-KV-head
variable form; the mask layout helper against its definition; bad input refused. CPU: the
batch prefill's reference backend; on a GPU the suite's ``auto``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import HAS_CUDA, poison, rel_error
import flashinfer
from flashinfer.sparse import convert_bsr_mask_layout

DEV = "cuda:0" if HAS_CUDA else "cpu"
DTYPE = torch.bfloat16 if HAS_CUDA else torch.float32
TOL = 2e-2 if HAS_CUDA else 1e-5
I32 = torch.int32


def _ws():
    return torch.empty(16 << 20, dtype=torch.uint8, device=DEV)


def naive(q, k, v, allowed, sm_scale):
    """float64 attention of ``q [M, Hq, D]`` over ``k / v [N, Hk, D]`` where ``allowed [Hq or 1,
    M, N]`` (rows with no key: 0 and lse -inf); returns ``(out, lse base 2)``."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("mhd,nhd->hmn", q, k) * sm_scale
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.where(allowed, torch.exp(s - lse.clamp_min(-1e30)[..., None]), 0.0)
    out = torch.einsum("hmn,nhd->mhd", p, v)
    return out, (lse / math.log(2.0)).transpose(0, 1)


def _bsr(mb, nb, density, seed, causal=False):
    """A random BSR map (int32 host indptr / indices) and its dense block matrix."""
    g = np.random.default_rng(seed)
    blocks = g.random((mb, nb)) < density
    if causal:  # lower triangle, diagonal always present (the usual causal pattern)
        blocks = np.tril(blocks, 0) | np.eye(mb, nb, dtype=bool)
    indptr = np.concatenate([[0], np.cumsum(blocks.sum(1))]).astype(np.int32)
    indices = np.nonzero(blocks)[1].astype(np.int32)
    return torch.from_numpy(indptr), torch.from_numpy(indices), blocks


def _qkv(m, n, hq, hk, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, h, d, generator=g).to(DEV, DTYPE)
            for rows, h in ((m, hq), (n, hk), (n, hk))]


def _dense_allowed(blocks, r, c, m, n, inner=None, indptr=None):
    """``[1, M, N]`` bool: the blocks of the map, each masked by ``inner [nnz, R, C]``."""
    allowed = torch.zeros(blocks.shape[0] * r, blocks.shape[1] * c, dtype=torch.bool)
    e = 0
    for i, j in zip(*np.nonzero(blocks)):
        allowed[i * r:(i + 1) * r, j * c:(j + 1) * c] = True if inner is None else inner[e]
        e += 1
    return allowed[None, :m, :n]


#: the paged mapping (auto), flex_attention (eager on the CPU, compiled on a GPU), and the
#: mapping with each KV head's query heads packed into rows (through the reference)
BACKENDS = ["auto", "torch:flex"]
PLAIN_BACKENDS = BACKENDS + ["reference:packed_gqa"]  # (packed: no causal, no custom mask)


@pytest.mark.parametrize("backend", PLAIN_BACKENDS)
@pytest.mark.parametrize("density", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("r,c", [(16, 16), (8, 32), (16, 128)])  # 128: two pages of 64 a block
def test_matches_dense_attention_under_the_block_mask(density, r, c, backend):
    if backend == "torch:flex" and r % 16:
        pytest.skip("flex takes blocks of multiples of 16 (its record)")
    m, n, hq, hk, d = 60, max(128, 3 * c), 4, 2, 32  # M % R != 0: a partial last row block
    indptr, indices, blocks = _bsr(-(-m // r), n // c, density, seed=int(density * 10) + r)
    q, k, v = _qkv(m, n, hq, hk, d, seed=1)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend=backend)
    w.plan(indptr.to(DEV), indices.to(DEV), m, n, r, c, hq, hk, d, q_data_type=DTYPE,
           o_data_type=DTYPE)
    out = poison(torch.empty(m, hq, d, dtype=DTYPE, device=DEV))
    got, lse = w.run(q, k, v, out=out, return_lse=True)
    assert got is out
    want, want_lse = naive(q.cpu(), k.cpu(), v.cpu(), _dense_allowed(blocks, r, c, m, n), d ** -0.5)
    if density == 0.0:
        assert torch.equal(got.cpu().float(), torch.zeros(m, hq, d))
        assert torch.isneginf(lse).all()
        return
    assert rel_error(got.cpu(), want) < TOL
    seen = ~torch.isneginf(want_lse)
    assert torch.equal(~torch.isneginf(lse.cpu()), seen)
    assert rel_error(lse.cpu()[seen], want_lse[seen]) < TOL


def test_o_data_type_defaults_to_float16_as_upstream():
    indptr, indices, _ = _bsr(2, 2, 1.0, seed=0)
    w = flashinfer.BlockSparseAttentionWrapper(_ws())
    w.plan(indptr, indices, 32, 32, 16, 16, 2, 2, 16, q_data_type=DTYPE)
    q, k, v = _qkv(32, 32, 2, 2, 16, seed=2)
    assert w.run(q, k, v).dtype == torch.float16


@pytest.mark.parametrize("packed,backend", [(False, "auto"), (True, "auto"),
                                            (False, "torch:flex")])
def test_masks_inside_blocks(packed, backend):
    m, n, r, c, h, d = 32, 64, 16, 16, 2, 16
    indptr, indices, blocks = _bsr(m // r, n // c, 0.6, seed=5)
    nnz = int(indptr[-1])
    inner = torch.rand(nnz, r, c, generator=torch.Generator().manual_seed(6)) < 0.7
    q, k, v = _qkv(m, n, h, h, d, seed=3)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend=backend)
    if packed:
        flat = convert_bsr_mask_layout(inner, indptr)
        sizes = (r * (indptr[1:] - indptr[:-1]) * c).tolist()
        packed_mask = torch.cat([flashinfer.packbits(part, bitorder="little")
                                 for part in flat.split(sizes) if part.numel()])
        w.plan(indptr, indices, m, n, r, c, h, h, d, packed_mask=packed_mask.to(DEV),
               q_data_type=DTYPE, o_data_type=DTYPE)
    else:
        w.plan(indptr, indices, m, n, r, c, h, h, d, mask=inner.to(DEV), q_data_type=DTYPE,
               o_data_type=DTYPE)
    want, _ = naive(q.cpu(), k.cpu(), v.cpu(), _dense_allowed(blocks, r, c, m, n, inner),
                    d ** -0.5)
    assert rel_error(w.run(q, k, v).cpu(), want) < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_block_pattern_is_global_causality(backend):
    """Row blocks that end with their diagonal block: causal equals the global causal mask
    intersected with the block map."""
    m = n = 64
    r = c = 16
    indptr, indices, blocks = _bsr(4, 4, 0.5, seed=7, causal=True)
    q, k, v = _qkv(m, n, 4, 4, 16, seed=4)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend=backend)
    w.plan(indptr, indices, m, n, r, c, 4, 4, 16, causal=True, q_data_type=DTYPE,
           o_data_type=DTYPE)
    allowed = _dense_allowed(blocks, r, c, m, n) & torch.ones(m, n, dtype=torch.bool).tril()
    want, _ = naive(q.cpu(), k.cpu(), v.cpu(), allowed, 16 ** -0.5)
    assert rel_error(w.run(q, k, v).cpu(), want) < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_rows_align_with_the_last_selected_key(backend):
    """A row block whose blocks end before its diagonal (and a partial last row block): query r
    of n_r rows sees the first n_keys - n_r + r + 1 selected keys, as upstream aligns them."""
    m, n, r, c, h, d = 40, 64, 16, 16, 2, 16
    indptr = torch.tensor([0, 1, 3, 5], dtype=I32)
    indices = torch.tensor([2, 0, 3, 1, 2], dtype=I32)
    q, k, v = _qkv(m, n, h, h, d, seed=8)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend=backend)
    w.plan(indptr, indices, m, n, r, c, h, h, d, causal=True, q_data_type=DTYPE,
           o_data_type=DTYPE)
    got, lse = w.run(q, k, v, return_lse=True)
    allowed = torch.zeros(1, m, n, dtype=torch.bool)
    for i in range(3):
        keys = [j * c + t for j in indices[indptr[i]:indptr[i + 1]].tolist() for t in range(c)]
        rows = list(range(i * r, min(m, (i + 1) * r)))
        for qi, row in enumerate(rows):
            allowed[0, row, keys[:max(0, len(keys) - len(rows) + qi + 1)]] = True
    want, want_lse = naive(q.cpu(), k.cpu(), v.cpu(), allowed, d ** -0.5)
    assert rel_error(got.cpu(), want) < TOL
    assert torch.equal(torch.isneginf(lse.cpu()), torch.isneginf(want_lse))


def test_flex_soft_cap_and_its_decision():
    """flex's score_mod soft cap against the capped float64 scores; the Decision names
    torch:flex (and auto on the CPU names the reference mapping)."""
    m = n = 64
    r = c = 16
    cap = 4.0
    indptr, indices, blocks = _bsr(4, 4, 0.5, seed=11)
    q, k, v = _qkv(m, n, 4, 2, 32, seed=12)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend="torch:flex")
    w.plan(indptr, indices, m, n, r, c, 4, 2, 32, logits_soft_cap=cap, q_data_type=DTYPE,
           o_data_type=DTYPE)
    assert w.decision.name == "torch:flex" and w.prefill_decision is None
    got = w.run(q * 4, k, v)
    qd, kd, vd = (t.cpu().double() for t in (q * 4, k, v))
    s = torch.einsum("mhd,nhd->hmn", qd, kd.repeat_interleave(2, 1)) * 32 ** -0.5
    s = cap * torch.tanh(s / cap)
    s = s.masked_fill(~_dense_allowed(blocks, r, c, m, n), -math.inf)
    p = torch.softmax(s, -1).nan_to_num()
    want = torch.einsum("hmn,nhd->mhd", p, vd.repeat_interleave(2, 1))
    assert rel_error(got.cpu(), want) < TOL
    if not HAS_CUDA:
        auto = flashinfer.BlockSparseAttentionWrapper(_ws())
        auto.plan(indptr, indices, m, n, r, c, 4, 2, 32, q_data_type=DTYPE)
        assert auto.decision.name == "reference" and auto.prefill_decision.name == "reference"


def test_block_sparse_decisions_on_simulated_sms():
    """Every SM family has a usable kernel for a plain bf16 map; flex stays behind the mapping
    until a benchmark ranks it; fp8 K/V or a packed mask leave flex out."""
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem, select

    def problem(sm, features=("lse", "o_dtype_differs"), kv="bfloat16"):
        return Problem.make("block_sparse_attention", simulated(sm),
                            dtypes={"q": "bfloat16", "kv": kv, "o": "float16"},
                            shape={"num_qo_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                                   "block_rows": 64, "block_cols": 64, "num_rows": 8192,
                                   "num_cols": 8192}, features=set(features) | {"gqa"})
    for sm in ("7.5", "8.0", "8.9", "9.0", "10.0", "12.0"):
        d = select(problem(sm), assume_installed=True)
        assert d.name != "torch:flex"
        assert ("torch:flex" in d.order) == (sm != "7.5")
    assert select(problem("9.0"), assume_installed=True).name == "flash_attn:fa3"
    d = select(problem("9.0", ("lse", "packed_mask")), assume_installed=True)
    assert d.name == "triton" and "torch:flex" not in d.order
    assert "torch:flex" not in select(problem("9.0", kv="float8_e4m3fn"),
                                      assume_installed=True).order


def test_packed_gqa_refuses_what_it_cannot_serve_and_fills_given_buffers():
    """The packed mapping has no causal and no custom mask (its record): asked for with one, the
    plan is refused naming the feature (never run packed); a given out / lse are filled in the
    heads' order."""
    from flashinfer.dispatch import NoBackendError

    m, n, r, c, hq, hk, d = 32, 64, 16, 16, 4, 2, 16
    indptr, indices, blocks = _bsr(m // r, n // c, 0.6, seed=13)
    q, k, v = _qkv(m, n, hq, hk, d, seed=14)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend="reference:packed_gqa")
    with pytest.raises(NoBackendError, match="causal"):
        w.plan(indptr, indices, m, n, r, c, hq, hk, d, causal=True, q_data_type=DTYPE)
    w.plan(indptr, indices, m, n, r, c, hq, hk, d, q_data_type=DTYPE, o_data_type=DTYPE)
    out = poison(torch.empty(m, hq, d, dtype=DTYPE, device=DEV))
    lse = poison(torch.empty(m, hq, dtype=torch.float32, device=DEV))
    assert w.decision.name == "reference:packed_gqa" and w._group == 2
    got, got_lse = w.run(q, k, v, out=out, lse=lse, return_lse=True)
    assert got is out and got_lse is lse
    want, want_lse = naive(q.cpu(), k.cpu(), v.cpu(), _dense_allowed(blocks, r, c, m, n), d ** -0.5)
    assert rel_error(out.cpu(), want) < TOL
    seen = ~torch.isneginf(want_lse)
    assert rel_error(lse.cpu()[seen], want_lse[seen]) < TOL


def test_a_named_backend_runs_the_mapping_on_it():
    indptr, indices, _ = _bsr(2, 2, 1.0, seed=0)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend="reference")
    w.plan(indptr, indices, 32, 32, 16, 16, 2, 2, 16, q_data_type=DTYPE)
    assert w.decision.name == "reference"


def test_convert_bsr_mask_layout_is_the_row_blocks_flattened():
    indptr = torch.tensor([0, 2, 2, 3], dtype=I32)
    mask = torch.rand(3, 2, 4, generator=torch.Generator().manual_seed(0)) < 0.5
    flat = convert_bsr_mask_layout(mask, indptr)
    want = torch.cat([mask[0:2].transpose(0, 1).reshape(-1), mask[2:3].transpose(0, 1).reshape(-1)])
    assert torch.equal(flat, want)


@pytest.mark.parametrize("causal", [False, True])
def test_variable_block_sparse_per_kv_head(causal):
    hk, g, d = 2, 2, 16
    rows = torch.tensor([[8, 24, 16], [16, 16, 16]], dtype=I32)  # qo_len 48 for both heads
    cols = torch.tensor([[32, 16, 16], [8, 40, 16]], dtype=I32)  # kv_len 64
    gen = torch.Generator().manual_seed(9)
    block_map = torch.rand(hk, 3, 3, generator=gen) < 0.6
    block_map[0, 1] = False  # a row block that sees nothing
    if causal:  # every row block sees its diagonal block last
        block_map = block_map.tril() | torch.eye(3, dtype=torch.bool)
        block_map[0, 1] = False
    q = torch.randn(hk * g, 48, d, generator=gen).to(DEV, DTYPE)
    k = torch.randn(hk, 64, d, generator=gen).to(DEV, DTYPE)
    v = torch.randn(hk, 64, d, generator=gen).to(DEV, DTYPE)
    w = flashinfer.VariableBlockSparseAttentionWrapper(_ws())
    w.plan(block_map, rows, cols, hk * g, hk, d, causal=causal, q_data_type=DTYPE)
    got, lse = w.run(q, k, v, return_lse=True)
    for h in range(hk):
        allowed = torch.zeros(48, 64, dtype=torch.bool)
        r0 = np.concatenate([[0], np.cumsum(rows[h].numpy())])
        c0 = np.concatenate([[0], np.cumsum(cols[h].numpy())])
        for i in range(3):
            keys = [t for j in range(3) if block_map[h, i, j] for t in range(c0[j], c0[j + 1])]
            for qi, row in enumerate(range(r0[i], r0[i + 1])):
                n_rows = r0[i + 1] - r0[i]
                seen = keys[:max(0, len(keys) - n_rows + qi + 1)] if causal else keys
                allowed[row, seen] = True
        heads = slice(h * g, (h + 1) * g)
        want, want_lse = naive(q[heads].transpose(0, 1).cpu(), k[h:h + 1].transpose(0, 1).cpu(),
                               v[h:h + 1].transpose(0, 1).cpu(), allowed[None], d ** -0.5)
        assert rel_error(got[heads].transpose(0, 1).cpu(), want) < TOL
        empty = torch.isneginf(want_lse)
        assert torch.equal(torch.isneginf(lse[heads].transpose(0, 1).cpu()), empty)


@pytest.mark.parametrize("change,words", [
    (dict(indices=[0, 4]), r"indices\[1\] = 4 is outside \[0, N / C = 4\)"),
    (dict(indices=[2, 1]), r"row block 0 must be strictly increasing.*indices\[1\] = 1"),
    (dict(indices=[1, 1]), "strictly increasing"),
    (dict(indptr=[0, 2]), "indptr must have length 3"),
    (dict(indptr=[0, 2, 1]), "non-decreasing"),
    (dict(N=60), r"N \(60\) must be a multiple of the block width C \(16\)"),
    (dict(heads=(3, 2)), r"num_qo_heads \(3\) must be a multiple of num_kv_heads \(2\)"),
    (dict(mask=torch.ones(2, 16, 8, dtype=torch.bool)), r"mask must be a bool tensor \[nnz, R, C\]"),
    (dict(block_mask=torch.ones(1, 2, 4, dtype=torch.bool)), "block_mask"),
])
def test_bad_plans_are_refused(change, words):
    args = dict(indptr=[0, 2, 2], indices=[0, 3], N=64, heads=(2, 2), mask=None, block_mask=None)
    args.update(change)
    w = flashinfer.BlockSparseAttentionWrapper(_ws())
    with pytest.raises((ValueError, NotImplementedError), match=words):
        w.plan(torch.tensor(args["indptr"], dtype=I32), torch.tensor(args["indices"], dtype=I32),
               32, args["N"], 16, 16, *args["heads"], 16, mask=args["mask"],
               block_mask=args["block_mask"])


def test_bad_runs_are_refused():
    w = flashinfer.BlockSparseAttentionWrapper(_ws())
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(*_qkv(32, 64, 2, 2, 16, seed=0))
    w.plan(torch.tensor([0, 1, 2], dtype=I32), torch.tensor([0, 3], dtype=I32), 32, 64, 16, 16,
           2, 2, 16, q_data_type=DTYPE, o_data_type=DTYPE)
    q, k, v = _qkv(32, 64, 2, 2, 16, seed=0)
    with pytest.raises(ValueError, match=r"k must be \[64, 2, 16\]"):
        w.run(q, k[:48], v)
    vw = flashinfer.VariableBlockSparseAttentionWrapper(_ws())
    with pytest.raises(ValueError, match="must sum to the same length"):
        vw.plan(torch.ones(2, 2, 2, dtype=torch.bool), torch.tensor([[8, 8], [8, 4]]),
                torch.tensor([[8, 8], [8, 8]]), 2, 2, 16)
    with pytest.raises(ValueError, match="agree with num_kv_heads=1"):
        vw.plan(torch.ones(2, 2, 2, dtype=torch.bool), torch.tensor([[8, 8], [8, 8]]),
                torch.tensor([[8, 8], [8, 8]]), 2, 1, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flash_attn:fa3", "cudnn", "triton", "torch:flex",
                                     "cudnn:packed_gqa"])
@pytest.mark.parametrize("r,c,density", [(64, 64, 0.25), (128, 128, 0.5)])
def test_gpu_each_block_sparse_kernel(backend, r, c, density):
    """Each block_sparse_attention record, asked for by name on the GPU, against float64
    attention under the map (bf16, GQA 8 / 2, head dim 128, a partial last row block)."""
    from flashinfer.dispatch import NoBackendError

    m, n, hq, hk, d = 500, 1024, 8, 2, 128
    indptr, indices, blocks = _bsr(-(-m // r), n // c, density, seed=r + 3)
    q, k, v = _qkv(m, n, hq, hk, d, seed=r)
    w = flashinfer.BlockSparseAttentionWrapper(_ws(), backend=backend)
    try:
        w.plan(indptr, indices, m, n, r, c, hq, hk, d, q_data_type=DTYPE, o_data_type=DTYPE)
    except NoBackendError as err:
        pytest.skip(f"{backend} not usable here: {str(err)[:120]}")
    assert w.decision.name == backend
    out = poison(torch.empty(m, hq, d, dtype=DTYPE, device=DEV))
    got, lse = w.run(q, k, v, out=out, return_lse=True)
    want, want_lse = naive(q.cpu(), k.cpu(), v.cpu(), _dense_allowed(blocks, r, c, m, n), d ** -0.5)
    assert rel_error(got.cpu(), want) < TOL
    seen = ~torch.isneginf(want_lse)
    assert torch.equal(~torch.isneginf(lse.cpu()), seen)
    assert rel_error(lse.cpu()[seen], want_lse[seen]) < TOL
