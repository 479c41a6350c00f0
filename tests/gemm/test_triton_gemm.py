"""Triton fp8 GEMMs (backend="triton"): block-scaled groupwise GEMM and per-tensor bmm_fp8.

On the CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET) at small
shapes, against float64 math on the same quantised values; decisions on simulated SMs; on a GPU
at Llama / DeepSeek-V3 layer sizes against the reference.
"""

import pytest
import torch

from flashinfer import overrides

from flashinfer import quantization as Q
from flashinfer.device import simulated
from flashinfer.dispatch import BackendUnavailableError, Problem, select
from flashinfer.gemm import bmm_fp8, gemm_fp8_nt_blockscaled, gemm_fp8_nt_groupwise
from conftest import TOLERANCE, poison, rel_error

pytest.importorskip("triton")
#: small-shape kernel tests: interpreter on CPU, native on a GPU (conftest.kernel_device)
pytestmark = pytest.mark.usefixtures("kernel_device")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
MS = [1, 7, 33]
#: (n, k): whole 128-blocks, then partial last blocks in N and K
NK = [(256, 256), (200, 300)]
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


def _naive_block_dequant(q, scale, gr, gc):
    """float64 ``q[i, j] * scale[i // gr, j // gc]`` by explicit indices."""
    rows = torch.arange(q.shape[0], device=q.device)[:, None] // gr
    cols = torch.arange(q.shape[1], device=q.device)[None, :] // gc
    return q.double() * scale.double()[rows, cols]


def _quantised(m, n, k, granularity, fp8=E4M3, device=None):
    gm, gn, gk = granularity
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) * 0.05
    a, a_s = Q.quantize_fp8_blockwise(x, (gm, gk), fp8)
    b, b_s = Q.quantize_fp8_blockwise(w, (gn, gk), fp8)
    return a, b, a_s, b_s


# --------------------------------------------------------------------------------------------
# gemm_fp8_nt_groupwise


@pytest.mark.parametrize("granularity", [(1, 128, 128), (128, 128, 128), "rowwise"])
@pytest.mark.parametrize("n,k", NK)
@pytest.mark.parametrize("m", MS)
def test_groupwise_vs_float64(m, n, k, granularity):
    torch.manual_seed(m * 1000 + n + k)
    gran = (1, 1, k) if granularity == "rowwise" else granularity
    a, b, a_s, b_s = _quantised(m, n, k, gran)
    out = poison(torch.empty(m, n, dtype=torch.bfloat16))
    result = gemm_fp8_nt_groupwise(a, b, a_s, b_s, "K", 1, gran, out=out, backend="triton")
    assert result is out
    gm, gn, gk = gran
    expected = _naive_block_dequant(a, a_s, gm, gk) @ _naive_block_dequant(b, b_s, gn, gk).t()
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_groupwise_dtypes_and_mn_major_scales(fp8, out_dtype):
    torch.manual_seed(3)
    m, n, k = 7, 136, 264
    a, b, a_s, b_s = _quantised(m, n, k, (1, 128, 128), fp8)
    # scale_major_mode="MN": scales arrive transposed, the kernel reads them through strides
    out = gemm_fp8_nt_groupwise(a, b, a_s.t().contiguous(), b_s.t().contiguous(), "MN", 1,
                                (1, 128, 128), out_dtype=out_dtype, backend="triton")
    assert out.dtype == out_dtype
    expected = _naive_block_dequant(a, a_s, 1, 128) @ _naive_block_dequant(b, b_s, 128, 128).t()
    assert rel_error(out, expected) < TOLERANCE[out_dtype]


def test_groupwise_strided_operands_match_reference():
    torch.manual_seed(5)
    m, n, k = 33, 130, 256
    a, b, a_s, b_s = _quantised(m, n, k, (128, 128, 128))
    a_t = a.t().contiguous().t()  # column-major a: same values, other strides
    got = gemm_fp8_nt_blockscaled(a_t, b, a_s, b_s, "K", backend="triton")
    want = gemm_fp8_nt_blockscaled(a, b, a_s, b_s, "K", backend="reference")
    assert rel_error(got, want) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("m,n", [(200, 300), (17, 520)])
def test_groupwise_many_tiles(m, n):
    # several tile rows and columns: the grouped tile order must still cover every output once
    torch.manual_seed(m + n)
    a, b, a_s, b_s = _quantised(m, n, 160, (1, 128, 128))
    out = poison(torch.empty(m, n, dtype=torch.float16))
    gemm_fp8_nt_groupwise(a, b, a_s, b_s, "K", out=out, backend="triton")
    expected = _naive_block_dequant(a, a_s, 1, 128) @ _naive_block_dequant(b, b_s, 128, 128).t()
    assert rel_error(out, expected) < TOLERANCE[torch.float16]


# --------------------------------------------------------------------------------------------
# bmm_fp8


@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("n,k", [(128, 128), (72, 200)])
@pytest.mark.parametrize("m", MS)
def test_bmm_fp8_vs_float64(m, n, k, b_layout):
    torch.manual_seed(m * 100 + n + k)
    batch = 2
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(batch, m, k))
    Bf = torch.randn(batch, k, n) if b_layout == "row" else torch.randn(batch, n, k).transpose(1, 2)
    B, B_s = Q.quantize_fp8_per_tensor(Bf)
    if b_layout == "col":
        assert B.stride(1) == 1  # upstream's column-major B
    out = poison(torch.empty(batch, m, n, dtype=torch.float16))
    result = bmm_fp8(A, B, A_s, B_s, torch.float16, out=out, backend="triton")
    assert result is out
    expected = torch.bmm(A.double(), B.double()) * A_s.double() * B_s.double()
    assert rel_error(out, expected) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_bmm_fp8_bf16_out_matches_reference(fp8):
    torch.manual_seed(8)
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(3, 7, 96), fp8)
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(3, 96, 40), fp8)
    got = bmm_fp8(A, B, A_s.reshape(1), B_s.reshape(1), torch.bfloat16, backend="triton")
    want = bmm_fp8(A, B, A_s.reshape(1), B_s.reshape(1), torch.bfloat16, backend="reference")
    assert rel_error(got, want) < TOLERANCE[torch.bfloat16]


def test_bmm_fp8_128_row_tiles():
    torch.manual_seed(9)
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(1, 260, 64))
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(1, 64, 136))
    out = poison(torch.empty(1, 260, 136, dtype=torch.float16))
    bmm_fp8(A, B, A_s, B_s, torch.float16, out=out, backend="triton")
    expected = torch.bmm(A.double(), B.double()) * A_s.double() * B_s.double()
    assert rel_error(out, expected) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("launch", [(16, 64, 256, 4, 1), (16, 32, 512, 2, 1), (16, 64, 64, 4, 1)])
def test_bmm_fp8_other_launch_shapes(monkeypatch, launch):
    """The tile shapes ``benchmarks/tune_bmm_fp8.py`` tries: K steps past K (masked), 64-deep
    steps, and column tiles narrower than N."""
    from flashinfer.backends.triton import gemm as tgemm

    torch.manual_seed(10)
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(3, 5, 200))
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(3, 72, 200).transpose(1, 2))
    monkeypatch.setattr(tgemm, "bmm_fp8_launch", lambda *a: launch)
    out = poison(torch.empty(3, 5, 72, dtype=torch.float16))
    bmm_fp8(A, B, A_s, B_s, torch.float16, out=out, backend="triton")
    expected = torch.bmm(A.double(), B.double()) * A_s.double() * B_s.double()
    assert rel_error(out, expected) < TOLERANCE[torch.float16]


def test_bmm_fp8_launch_narrows_tiles_for_decode_size_m():
    """64-wide column tiles for decode-size M (3 stages when K is one step), 128 beyond."""
    from flashinfer.backends.triton import gemm as tgemm

    gpu = torch.device("cuda")
    assert tgemm.bmm_fp8_launch(1, 128, 512, gpu) == (16, 64, 128, 4, 4)
    assert tgemm.bmm_fp8_launch(16, 512, 128, gpu) == (16, 64, 128, 4, 3)
    assert tgemm.bmm_fp8_launch(64, 128, 512, gpu)[:3] == (64, 128, 128)


def test_mixed_fp8_pair_is_refused_with_reason():
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(1, 4, 32), E4M3)
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(1, 32, 16), E5M2)
    with pytest.raises(BackendUnavailableError, match="one fp8 dtype for both operands"):
        bmm_fp8(A, B, A_s, B_s, torch.bfloat16, backend="triton")


# --------------------------------------------------------------------------------------------
# decisions on simulated SMs


def _device(sm):
    return simulated(None if sm == "cpu" else sm)


def _groupwise(sm, feature, a="float8_e4m3fn", b="float8_e4m3fn", **shape):
    facts = {"m": 16, "n": 7168, "k": 2048, **shape}
    return Problem.make("gemm_fp8_groupwise", _device(sm), dtypes={"a": a, "b": b,
                                                                   "out": "bfloat16"},
                        shape=facts, features=[feature])


def _rejections(decision, name):
    return {r.field for c in decision.candidates if c.name == name for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
def test_auto_picks_triton_for_128x128_from_sm89(sm):
    """Verified on the H200: torch has no 128x128-activation recipe, so from SM 8.9 ``auto``
    chooses triton ahead of the reference; below SM 8.9 (and on the CPU) triton says why not,
    and asking for it explicitly is refused with that reason."""
    decision = select(_groupwise(sm, "scale_128x128"), assume_installed=True)
    asked = overrides.collect("gemm", "triton")
    if sm in ("8.9", "9.0", "10.0", "12.0"):
        assert decision.backend == "triton"
        assert decision.order == ("triton", "reference")
        assert _rejections(decision, "triton") == set()
        assert next(c for c in decision.candidates if c.name == "triton").verified == (
            sm == "9.0")
        assert select(_groupwise(sm, "scale_128x128"), asked,
                      assume_installed=True).backend == "triton"
    else:
        assert decision.backend == "reference"
        assert _rejections(decision, "triton") == ({"device"} if sm == "cpu" else {"sm"})
        with pytest.raises(BackendUnavailableError):
            select(_groupwise(sm, "scale_128x128"), asked, assume_installed=True)


@pytest.mark.parametrize("sm", ["9.0", "10.0", "12.0"])
def test_torch_leads_where_it_serves(sm):
    """Where cuBLASLt serves (row-wise from SM 9.0, 1x128 block-wise on SM 9.0) torch stays
    first and triton is the next choice, ahead of the reference."""
    rowwise = select(_groupwise(sm, "scale_rowwise"), assume_installed=True)
    assert rowwise.order == ("torch:scaled_mm_rowwise", "triton", "reference")
    blockwise = select(_groupwise(sm, "scale_1x128"), assume_installed=True)
    if sm == "9.0":
        assert blockwise.order == ("torch:scaled_mm_blockwise", "triton", "reference")
    else:
        assert blockwise.order == ("triton", "reference")


def test_triton_rejects_other_granularities_and_mixed_pairs():
    decision = select(_groupwise("9.0", "scale_groupwise"), assume_installed=True)
    assert _rejections(decision, "triton") == {"feature"}
    decision = select(_groupwise("9.0", "scale_128x128", b="float8_e5m2"), assume_installed=True)
    assert _rejections(decision, "triton") == {"dtype.b"}


# --------------------------------------------------------------------------------------------
# GPU: model-sized layers vs the reference

GPU_SHAPES = [(7168, 2048), (2048, 7168), (8192, 8192), (28672, 8192)]  # DeepSeek-V3, Llama-70B


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", [(1, 128, 128), (128, 128, 128), "rowwise"])
@pytest.mark.parametrize("n,k", GPU_SHAPES)
@pytest.mark.parametrize("m", [1, 7, 128, 4096])
def test_gpu_groupwise_vs_reference(m, n, k, granularity):
    torch.manual_seed(m + n + k)
    gran = (1, 1, k) if granularity == "rowwise" else granularity
    a, b, a_s, b_s = _quantised(m, n, k, gran, device="cuda")
    for out_dtype in (torch.bfloat16, torch.float16):
        out = poison(torch.empty(m, n, dtype=out_dtype, device="cuda"))
        gemm_fp8_nt_groupwise(a, b, a_s, b_s, "K", 1, gran, out=out, backend="triton")
        want = gemm_fp8_nt_groupwise(a, b, a_s, b_s, "K", 1, gran, out_dtype=out_dtype,
                                     backend="reference")
        assert rel_error(out, want) < TOLERANCE[out_dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 1, 4096, 4096), (4, 128, 4096, 4096),
                                   (2, 333, 1000, 520), (16, 64, 512, 128), (8, 16, 512, 128),
                                   (3, 5, 200, 72)])
def test_gpu_bmm_fp8_vs_reference(shape):
    """(8, 16, 512, 128), (3, 5, 200, 72) and (1, 1, 4096, 4096): decode-size M, 64-wide column
    tiles."""
    batch, m, k, n = shape
    torch.manual_seed(m + k)
    A, A_s = Q.quantize_fp8_per_tensor(torch.randn(batch, m, k, device="cuda"))
    B, B_s = Q.quantize_fp8_per_tensor(torch.randn(batch, n, k, device="cuda").transpose(1, 2))
    for out_dtype in (torch.bfloat16, torch.float16):
        out = poison(torch.empty(batch, m, n, dtype=out_dtype, device="cuda"))
        bmm_fp8(A, B, A_s, B_s, out_dtype, out=out, backend="triton")
        want = bmm_fp8(A, B, A_s, B_s, out_dtype, backend="reference")
        assert rel_error(out, want) < TOLERANCE[out_dtype]


_COMPILES_PER_TILE = """
import torch, flashinfer
one = torch.ones(1, device="cuda")
for m in (16, 5, 1, 13):  # one tile height (16 rows): M = 1 and M off a multiple of 16 included
    A = torch.randn(2, m, 128, device="cuda").to(torch.float8_e4m3fn)
    B = torch.randn(2, 256, 128, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
    flashinfer.bmm_fp8(A, B, one, one, torch.bfloat16, backend="triton")
torch.cuda.synchronize()
"""


@pytest.mark.gpu
def test_gpu_bmm_fp8_compiles_once_per_tile_height(tmp_path):
    """The kernel does not specialise on M: a fresh process calling four M of one tile height
    compiles one kernel (Triton compiled again for M = 1 and for M not a multiple of 16)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path), "FLASHINFER_KERNEL_PACK_DIR": "off",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", _COMPILES_PER_TILE], env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = [p for p in tmp_path.glob("*/bmm_fp8_kernel.ttir")]
    assert len(compiled) == 1, sorted(str(p) for p in tmp_path.glob("*/*"))
