"""Triton grouped / segment GEMM (backend="triton"): ``segment_gemm`` (SegmentGEMMWrapper,
grouped_mm_bf16) and ``group_gemm_fp8_groupwise``.

On the CPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET) at small
shapes against a float64 per-segment loop written here (fp8: against the reference backend);
decisions on simulated SMs; on a GPU at DeepSeek-V3 expert sizes against the torch backend and
the reference, and under CUDA-graph replay with new offsets.
"""

import pytest
import torch

from flashinfer import overrides
from flashinfer import quantization as Q
from flashinfer.dispatch import kernel_for
from flashinfer.backends.triton import gemm_grouped as triton_grouped
from flashinfer.device import simulated
from flashinfer.dispatch import BackendUnavailableError, Problem, select
from flashinfer.gemm import SegmentGEMMWrapper, group_gemm_fp8_nt_groupwise
from flashinfer import index_checks
from flashinfer.gemm.grouped import FAULTS, grouped_mm_bf16
from conftest import TOLERANCE, capture_cuda_graph, poison, raises_naming, rel_error

pytest.importorskip("triton")
#: small-shape kernel tests: interpreter on CPU, native on a GPU (conftest.kernel_device)
pytestmark = pytest.mark.usefixtures("kernel_device")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
LENS = [0, 1, 17, 40]  # an empty segment, a single row, partial and several 16-row tiles
HEAD, TAIL = 3, 5  # rows before the first segment and after the last: no segment covers them
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]
FP8_TOL = 1e-2


def _indptr(lens, head=0, dtype=torch.int64):
    ends = torch.tensor(lens).cumsum(0) + head
    return torch.cat([torch.tensor([head]), ends]).to(dtype)


def _naive(x, weights, bounds, chosen, column_major, alpha=1.0):
    """float64 ``alpha * x[seg] @ W[chosen[seg]]`` segment by segment, zeros elsewhere."""
    n = weights.shape[1] if column_major else weights.shape[2]
    y = torch.zeros(x.shape[0], n, dtype=torch.float64, device=x.device)
    for seg, w in enumerate(chosen):
        mat = weights[w].double()
        mat = mat.t() if column_major else mat
        for r in range(bounds[seg], bounds[seg + 1]):
            y[r] = alpha * (x[r].double() @ mat)
    return y


def _wrapper():
    return SegmentGEMMWrapper(torch.empty(16, dtype=torch.int8), backend="triton")


def _segment_inputs(dtype, column_major, k=48, n=40, lens=LENS, num_weights=None):
    rows = HEAD + sum(lens) + TAIL
    num_weights = num_weights or len(lens)
    x = torch.randn(rows, k, dtype=dtype)
    shape = (num_weights, n, k) if column_major else (num_weights, k, n)
    return x, torch.randn(*shape, dtype=dtype) * 0.2


# --------------------------------------------------------------------------------------------
# segment_gemm


@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_segment_gemm_vs_float64(dtype, column_major):
    torch.manual_seed(11 + column_major)
    x, w = _segment_inputs(dtype, column_major)
    indptr = _indptr(LENS, HEAD)
    out = poison(torch.empty(x.shape[0], 40, dtype=dtype))
    y = _wrapper().run(x, w, len(LENS), column_major, out=out, seg_indptr=indptr)
    assert y is out
    expected = _naive(x, w, indptr.tolist(), range(len(LENS)), column_major)
    assert rel_error(out, expected) < TOLERANCE[dtype]
    assert torch.equal(out[:HEAD], torch.zeros_like(out[:HEAD]))  # uncovered rows: exact zeros
    assert torch.equal(out[-TAIL:], torch.zeros_like(out[-TAIL:]))


@pytest.mark.parametrize("column_major", [False, True])
def test_segment_gemm_weight_indices_and_int32_offsets(column_major):
    torch.manual_seed(12)
    lens, chosen = [5, 0, 17, 9], [2, 0, 2, 1]  # weight 2 used twice
    x, w = _segment_inputs(torch.bfloat16, column_major, lens=lens, num_weights=3)
    indptr = _indptr(lens, HEAD, torch.int32)
    out = poison(torch.empty(x.shape[0], 40, dtype=torch.bfloat16))
    _wrapper().run(x, w, len(lens), column_major, out=out, seg_indptr=indptr,
                   weight_indices=torch.tensor(chosen))
    expected = _naive(x, w, indptr.tolist(), chosen, column_major)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_segment_gemm_kernel_alpha_and_out_dtype(out_dtype):
    # alpha reaches the kernel through grouped_mm_fp8 only (fp8 x, not served here): call the
    # registered kernel with its canonical signature
    torch.manual_seed(13)
    x, w = _segment_inputs(torch.float16, True)
    indptr = _indptr(LENS, HEAD)
    alpha = torch.tensor([0.75])
    out = poison(torch.empty(x.shape[0], 40, dtype=out_dtype))
    kernel_for("triton", "segment_gemm", "default")(x, w, indptr, None, True, alpha, out,
                                                    FAULTS["grouped_mm_fp8"])
    expected = _naive(x, w, indptr.tolist(), range(len(LENS)), True, alpha=0.75)
    assert rel_error(out, expected) < TOLERANCE[out_dtype if out_dtype != torch.float32
                                                else torch.float16]  # fp16 inputs


def test_segment_gemm_many_segments():
    # 37 segments, many empty: every program scans all 39 pieces for its tile
    torch.manual_seed(14)
    lens = [int(v) for v in torch.randint(0, 4, (37,))]
    x, w = _segment_inputs(torch.bfloat16, False, k=24, n=16, lens=lens, num_weights=5)
    chosen = torch.randint(0, 5, (len(lens),))
    indptr = _indptr(lens, HEAD)
    out = poison(torch.empty(x.shape[0], 16, dtype=torch.bfloat16))
    _wrapper().run(x, w, len(lens), False, out=out, seg_indptr=indptr, weight_indices=chosen)
    expected = _naive(x, w, indptr.tolist(), chosen.tolist(), False)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]
    assert not out[:HEAD].any() and not out[-TAIL:].any()


def test_segment_gemm_refuses_more_segments_than_one_scan(monkeypatch):
    monkeypatch.setattr(triton_grouped, "MAX_PIECES", 16)
    lens = [1] * 20
    x, w = _segment_inputs(torch.bfloat16, False, k=24, n=16, lens=lens, num_weights=2)
    with pytest.raises(ValueError, match="seg_indptr: 20 segments"):
        _wrapper().run(x, w, len(lens), False, seg_indptr=_indptr(lens, HEAD),
                       weight_indices=torch.zeros(20, dtype=torch.int64))


def test_segment_gemm_all_rows_uncovered_are_zero():
    torch.manual_seed(15)
    x, w = _segment_inputs(torch.float16, False, lens=[0, 0])
    out = poison(torch.empty(x.shape[0], 40, dtype=torch.float16))
    _wrapper().run(x, w, 2, False, out=out, seg_indptr=torch.tensor([4, 4, 4]))
    assert torch.equal(out, torch.zeros_like(out))


def test_segment_gemm_bad_weight_index_gives_zero_rows_not_a_stray_read():
    # the kernel itself (the public call checks host arrays first): an index past the weights
    # loads nothing, its rows are zero, the fault is recorded under the caller's name
    torch.manual_seed(16)
    lens = [4, 6]
    x, w = _segment_inputs(torch.float16, False, lens=lens)
    indptr = _indptr(lens)
    out = poison(torch.empty(x.shape[0], w.shape[2], dtype=torch.float16))
    kernel_for("triton", "segment_gemm", "default")(
        x, w, indptr, torch.tensor([1, 7]), False, None, out, FAULTS["seg_indptr"])
    assert (out[4:] == 0).all()
    expected = _naive(x, w, indptr.tolist(), [1], False)
    assert rel_error(out[:4], expected[:4]) < TOLERANCE[torch.float16]
    with raises_naming("SegmentGEMMWrapper.run: weight_indices[1] = 7", "[0, 2)"):
        index_checks.check_errors()


def test_grouped_mm_bf16_triton():
    torch.manual_seed(17)
    lens, k, n = [9, 0, 20, 3], 40, 24
    a = torch.randn(sum(lens), k, dtype=torch.bfloat16)
    b = torch.randn(len(lens), n, k, dtype=torch.bfloat16) * 0.2
    m_indptr = _indptr(lens, dtype=torch.int32)
    out = poison(torch.empty(sum(lens), n, dtype=torch.float32))
    grouped_mm_bf16(a, b, m_indptr, out=out, backend="triton")
    expected = _naive(a, b, m_indptr.tolist(), range(len(lens)), True)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]


# --------------------------------------------------------------------------------------------
# group_gemm_fp8_groupwise


def _fp8_case(rows, n, k, groups, granularity, fp8=E4M3):
    gm, gn, gk = granularity
    a, a_s = Q.quantize_fp8_blockwise(torch.randn(rows, k), (gm, gk), fp8)
    parts = [Q.quantize_fp8_blockwise(torch.randn(n, k) * 0.1, (gn, gk), fp8)
             for _ in range(groups)]
    b = torch.stack([p[0] for p in parts])
    b_s = torch.stack([p[1] for p in parts])
    return a, b, a_s, b_s


@pytest.mark.parametrize("granularity,mode", [((1, 128, 128), "K"), ((1, 128, 128), "MN"),
                                              ((128, 128, 128), "K"), ("rowwise", "K")])
def test_group_gemm_fp8_vs_reference(granularity, mode):
    torch.manual_seed(21)
    n, k = 136, 200  # partial last blocks in N and K
    gran = (1, 1, k) if granularity == "rowwise" else granularity
    m_indptr = torch.tensor([2, 7, 7, 26, 31], dtype=torch.int32)  # head/tail rows, empty group
    rows = 34
    a, b, a_s, b_s = _fp8_case(rows, n, k, 4, gran)
    if mode == "MN":
        a_s, b_s = a_s.t().contiguous(), b_s.transpose(1, 2).contiguous()
    out = poison(torch.empty(rows, n, dtype=torch.bfloat16))
    y = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, gran, mode, out=out,
                                    backend="triton")
    assert y is out
    want = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, gran, mode, backend="reference")
    assert rel_error(out, want) < FP8_TOL
    assert not out[:2].any() and not out[31:].any()


def test_group_gemm_fp8_e5m2_fp16_vs_reference():
    torch.manual_seed(22)
    m_indptr = torch.tensor([0, 3, 20], dtype=torch.int32)
    a, b, a_s, b_s = _fp8_case(20, 64, 128, 2, (1, 128, 128), E5M2)
    got = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, scale_major_mode="K",
                                      out_dtype=torch.float16, backend="triton")
    want = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, scale_major_mode="K",
                                       out_dtype=torch.float16, backend="reference")
    assert got.dtype == torch.float16
    assert rel_error(got, want) < FP8_TOL


def test_group_gemm_fp8_other_granularity_is_refused():
    a, b, a_s, b_s = _fp8_case(8, 16, 64, 2, (1, 16, 32))
    with pytest.raises(BackendUnavailableError):
        group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, torch.tensor([0, 4, 8], dtype=torch.int32),
                                    (1, 16, 32), "K", backend="triton")


# --------------------------------------------------------------------------------------------
# decisions on simulated SMs


def _device(sm):
    return simulated(None if sm == "cpu" else sm)


def _segment_problem(sm, **dtypes):
    d = {"x": "bfloat16", "weights": "bfloat16", "out": "bfloat16", **dtypes}
    return Problem.make("segment_gemm", _device(sm), dtypes=d,
                        shape={"num_groups": 8, "m": 1024, "n": 2048, "k": 7168},
                        features=["weight_indices"], layout="column_major")


def _fp8_problem(sm, feature="scale_1x128", b="float8_e4m3fn"):
    return Problem.make("group_gemm_fp8_groupwise", _device(sm),
                        dtypes={"a": "float8_e4m3fn", "b": b, "out": "bfloat16"},
                        shape={"num_groups": 8, "m": 1024, "n": 2048, "k": 7168},
                        features=[feature])


def _rejections(decision):
    return {r.field for c in decision.candidates if c.backend == "triton" for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op,sm_min", [("segment_gemm", 8.0), ("group_gemm_fp8_groupwise", 8.9)])
def test_triton_is_ranked_where_its_record_allows(op, sm_min, sm):
    """Verified on the H200: from its SM floor, fp8 grouped first (ahead of the dequantising
    loop), segment GEMM after torch's CUTLASS grouped GEMM where that serves (SM 9.0+) and ahead
    of the per-segment loop; below the floor (and on the CPU) it says why not."""
    problem = _segment_problem(sm) if op == "segment_gemm" else _fp8_problem(sm)
    decision = select(problem, assume_installed=True)
    asked = overrides.collect("gemm", "triton")
    if sm != "cpu" and float(sm) >= sm_min:
        assert _rejections(decision) == set()
        grouped_mm = op == "segment_gemm" and float(sm) >= 9.0
        assert decision.backend == ("torch" if grouped_mm else "triton")
        assert decision.order.index("triton") == (1 if grouped_mm else 0)
        assert decision.order[-1] == "reference"
        assert select(problem, asked, assume_installed=True).backend == "triton"
    else:
        assert decision.backend != "triton" and "triton" not in decision.order
        assert _rejections(decision) == ({"device"} if sm == "cpu" else {"sm"})
        with pytest.raises(BackendUnavailableError):
            select(problem, asked, assume_installed=True)


def test_triton_reasons_for_what_it_does_not_serve():
    assert _rejections(select(_segment_problem("9.0", x="float8_e4m3fn",
                                               weights="float8_e4m3fn"),
                              assume_installed=True)) == {"dtype.x", "dtype.weights"}
    assert _rejections(select(_fp8_problem("9.0", "scale_groupwise"),
                              assume_installed=True)) == {"feature"}
    assert _rejections(select(_fp8_problem("9.0", b="float8_e5m2"),
                              assume_installed=True)) == {"dtype.b"}


# --------------------------------------------------------------------------------------------
# GPU: DeepSeek-V3 expert sizes vs torch / the reference; CUDA-graph replay


def _ragged_indptr(experts, per_expert, device="cuda"):
    """Ragged int32 offsets around ``per_expert`` rows each (segment 1 empty), ending at
    ``experts * per_expert``."""
    rows = experts * per_expert
    lens = torch.randint(per_expert // 2, per_expert * 3 // 2 + 1, (experts,), device="cpu")
    lens[1] = 0
    ends = lens.cumsum(0).clamp(max=rows)
    ends[-1] = rows
    zero = torch.zeros(1, dtype=ends.dtype, device="cpu")
    return torch.cat([zero, ends]).to(device, torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("per_expert", [16, 128])
@pytest.mark.parametrize("ragged", [False, True])
def test_gpu_grouped_mm_bf16_vs_torch(per_expert, ragged):
    torch.manual_seed(31 + per_expert)
    experts, n, k = 8, 2048, 7168
    rows = experts * per_expert
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    m_indptr = (_ragged_indptr(experts, per_expert) if ragged else
                torch.arange(0, rows + 1, per_expert, device="cuda", dtype=torch.int32))
    out = poison(torch.empty(rows, n, device="cuda", dtype=torch.bfloat16))
    grouped_mm_bf16(a, b, m_indptr, out=out, backend="triton")
    want = grouped_mm_bf16(a, b, m_indptr, backend="torch")
    assert rel_error(out, want) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("column_major", [False, True])
def test_gpu_segment_gemm_lora_vs_reference(dtype, column_major):
    torch.manual_seed(32)
    lens, k, n = [1, 0, 37, 128, 300, 5], 4096, 64  # LoRA-A shape: d_out = rank
    x = torch.randn(HEAD + sum(lens) + TAIL, k, device="cuda", dtype=dtype)
    shape = (4, n, k) if column_major else (4, k, n)
    w = torch.randn(*shape, device="cuda", dtype=dtype) * 0.02
    indptr = _indptr(lens, HEAD).cuda()
    chosen = torch.tensor([3, 0, 1, 3, 2, 1], device="cuda")
    wrapper = SegmentGEMMWrapper(torch.empty(16, device="cuda"), backend="triton")
    out = poison(torch.empty(x.shape[0], n, device="cuda", dtype=dtype))
    wrapper.run(x, w, len(lens), column_major, out=out, seg_indptr=indptr,
                weight_indices=chosen)
    want = SegmentGEMMWrapper(torch.empty(16), backend="reference").run(
        x, w, len(lens), column_major, seg_indptr=indptr, weight_indices=chosen)
    assert rel_error(out, want) < TOLERANCE[dtype]
    assert not out[:HEAD].any() and not out[-TAIL:].any()


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", [(1, 128, 128), (128, 128, 128)])
@pytest.mark.parametrize("per_expert", [16, 128])
def test_gpu_group_gemm_fp8_vs_reference(granularity, per_expert):
    torch.manual_seed(33)
    experts, n, k = 8, 2048, 7168
    rows = experts * per_expert
    m_indptr = _ragged_indptr(experts, per_expert)
    gm, gn, gk = granularity
    a, a_s = Q.quantize_fp8_blockwise(torch.randn(rows, k, device="cuda"), (gm, gk))
    parts = [Q.quantize_fp8_blockwise(torch.randn(n, k, device="cuda") * 0.02, (gn, gk))
             for _ in range(experts)]
    b, b_s = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    for out_dtype in (torch.bfloat16, torch.float16):
        got = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, granularity, "K",
                                          out_dtype=out_dtype, backend="triton")
        want = group_gemm_fp8_nt_groupwise(a, b, a_s, b_s, m_indptr, granularity, "K",
                                           out_dtype=out_dtype, backend="reference")
        assert rel_error(got, want) < FP8_TOL


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_new_offsets():
    torch.manual_seed(34)
    experts, n, k, rows = 8, 2048, 7168, 1024
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    m_indptr = torch.arange(0, rows + 1, rows // experts, device="cuda", dtype=torch.int32)
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    graph = capture_cuda_graph(lambda: grouped_mm_bf16(a, b, m_indptr, out=out,
                                                       backend="triton"))
    for trial in range(3):
        new = _ragged_indptr(experts, rows // experts)
        new[0] = 5 * trial  # uncovered head rows on later replays
        m_indptr.copy_(torch.maximum(new, new[0]))
        poison(out)
        graph.replay()
        torch.cuda.synchronize()
        want = grouped_mm_bf16(a, b, m_indptr, backend="torch")
        assert rel_error(out, want) < TOLERANCE[torch.bfloat16]
        assert not out[:int(m_indptr[0])].any()

