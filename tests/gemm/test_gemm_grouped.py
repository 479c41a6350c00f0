"""Grouped / segment GEMM on the CPU: reference and torch loops vs a float64 naive computation
(empty segments, weight_indices reuse, column-major weights, poisoned out=), validation (one
test per rule, the message names the argument), backend spellings, torch.compile."""

import pytest
import torch

import flashinfer
from flashinfer.dispatch import BackendUnavailableError, record_decisions
from flashinfer.gemm import SegmentGEMMWrapper, group_gemm_fp8_nt_groupwise
from flashinfer.gemm.grouped import FAULTS, grouped_mm_bf16, grouped_mm_fp8
from conftest import TOLERANCE, poison, raises_naming, rel_error

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SEGMENT_BACKENDS = ["reference", "torch:segment_loop"]
FP8_BACKENDS = ["reference", "torch:dequant_loop"]
FP8_TOL = 1e-2  # bf16 output rounding; the products of fp8 values are exact in fp32


def _wrapper(backend="auto"):
    return SegmentGEMMWrapper(torch.empty(1024, dtype=torch.int8), backend=backend)


def _naive_segments(x, weights, bounds, chosen, column_major):
    """float64 y[seg] = x[seg] @ W[chosen[seg]], zeros outside the segments."""
    y = torch.zeros(x.shape[0], weights.shape[1] if column_major else weights.shape[2],
                    dtype=torch.float64)
    for seg, w in enumerate(chosen):
        s, e = bounds[seg], bounds[seg + 1]
        for r in range(s, e):
            mat = weights[w].double()
            y[r] = x[r].double() @ (mat.t() if column_major else mat)
    return y


def _indptr(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)


# --------------------------------------------------------------------------------------------
# SegmentGEMMWrapper


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("column_major", [False, True])
def test_segment_gemm_matches_naive(backend, dtype, column_major):
    torch.manual_seed(1)
    lens, d_in, d_out = [3, 0, 5, 1, 0, 7], 24, 40  # empty segments included
    x = torch.randn(sum(lens), d_in, dtype=dtype)
    shape = (len(lens), d_out, d_in) if column_major else (len(lens), d_in, d_out)
    weights = torch.randn(*shape, dtype=dtype)
    out = poison(torch.empty(sum(lens), d_out, dtype=dtype))
    y = _wrapper(backend).run(x, weights, len(lens), column_major, out=out,
                              seg_lens=torch.tensor(lens))
    assert y is out
    expected = _naive_segments(x, weights, _indptr(lens).tolist(), range(len(lens)), column_major)
    assert rel_error(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_segment_gemm_weight_indices_reuse(backend):
    torch.manual_seed(2)
    lens, chosen = [2, 4, 0, 3, 5], [1, 0, 1, 1, 2]
    x = torch.randn(sum(lens), 16, dtype=torch.bfloat16)
    weights = torch.randn(3, 16, 8, dtype=torch.bfloat16)
    y = _wrapper(backend).run(x, weights, len(lens), False, seg_indptr=_indptr(lens),
                              weight_indices=torch.tensor(chosen))
    expected = _naive_segments(x, weights, _indptr(lens).tolist(), chosen, False)
    assert rel_error(y, expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_segment_gemm_seg_indptr_wins_and_uncovered_rows_are_zero(backend):
    torch.manual_seed(3)
    x = torch.randn(10, 16, dtype=torch.float16)
    weights = torch.randn(2, 16, 8, dtype=torch.float16)
    indptr = torch.tensor([2, 5, 8])  # rows 0..1 and 8..9 belong to no segment
    out = poison(torch.empty(10, 8, dtype=torch.float16))
    _wrapper(backend).forward(x, weights, 2, False, out=out, seg_lens=torch.tensor([9, 9]),
                              seg_indptr=indptr)
    expected = _naive_segments(x, weights, [2, 5, 8], [0, 1], False)
    assert rel_error(out, expected) < TOLERANCE[torch.float16]
    assert (out[:2] == 0).all() and (out[8:] == 0).all()


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_segment_gemm_fp8_defaults_to_bf16(backend):
    torch.manual_seed(4)
    lens = [4, 0, 3]
    x = torch.randn(7, 32).to(E4M3)
    weights = torch.randn(3, 16, 32).to(E4M3)
    y = _wrapper(backend).run(x, weights, 3, True, seg_lens=torch.tensor(lens))
    assert y.dtype == torch.bfloat16
    expected = _naive_segments(x, weights, _indptr(lens).tolist(), range(3), True)
    assert rel_error(y, expected) < FP8_TOL


def test_segment_gemm_upstream_backend_names():
    torch.manual_seed(5)
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    weights = torch.randn(2, 16, 8, dtype=torch.bfloat16)
    for name in ("sm80", "sm90"):
        with record_decisions() as log:
            _wrapper(name).run(x, weights, 2, False, seg_lens=torch.tensor([2, 4]))
        assert log[-1].backend == "torch"
    with pytest.raises(BackendUnavailableError):
        _wrapper("torch:grouped_mm").run(x, weights, 2, False, seg_lens=torch.tensor([2, 4]))


@pytest.mark.parametrize("column_major", [False, True])
def test_grouped_mm_kernel_on_cpu(column_major):
    """The torch:grouped_mm kernel (declared for CUDA) called directly on CPU tensors, where
    torch 2.13 also has torch._grouped_mm: offsets, gathered weights, masked rows."""
    from flashinfer.backends.torch.gemm_grouped import segment_gemm_grouped

    torch.manual_seed(12)
    bounds, chosen = [1, 4, 4, 11], [2, 0, 2]  # row 0 and rows 11.. belong to no segment
    x = torch.randn(13, 16, dtype=torch.bfloat16)
    weights = torch.randn(3, *((24, 16) if column_major else (16, 24)), dtype=torch.bfloat16)
    out = poison(torch.empty(13, 24, dtype=torch.bfloat16))
    try:
        segment_gemm_grouped(x, weights, torch.tensor(bounds), torch.tensor(chosen),
                             column_major, None, out, FAULTS["seg_indptr"])
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"torch._grouped_mm does not run on this CPU build: {exc}")
    expected = _naive_segments(x, weights, bounds, chosen, column_major)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]
    assert (out[0] == 0).all() and (out[11:] == 0).all()


def test_segment_gemm_no_segments_is_zero():
    x = torch.randn(3, 8, dtype=torch.float16)
    y = _wrapper().run(x, torch.randn(1, 8, 4, dtype=torch.float16), 0, False,
                       seg_indptr=torch.tensor([0]))
    assert (y == 0).all()


def _x(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=dtype)


def _run(**overrides):
    args = dict(x=_x(6, 8), weights=_x(2, 8, 4), batch_size=2, weight_column_major=False,
                seg_lens=torch.tensor([2, 4]))
    args.update(overrides)
    return _wrapper().run(**args)


SEGMENT_BAD = [
    ("x", TypeError, lambda: _run(x=[[1.0]])),
    ("x", ValueError, lambda: _run(x=_x(6, 8, dtype=torch.float32))),
    ("x", ValueError, lambda: _run(x=_x(1, 6, 8))),
    ("weights", ValueError, lambda: _run(weights=_x(2, 8, 4, dtype=torch.bfloat16))),
    ("weights", ValueError, lambda: _run(weights=_x(8, 4))),
    ("weights", ValueError, lambda: _run(weights=_x(2, 4, 8))),
    ("weights", ValueError, lambda: _run(weights=_x(2, 8, 4), weight_column_major=True)),
    ("batch_size", ValueError, lambda: _run(batch_size=-1)),
    ("batch_size", ValueError, lambda: _run(batch_size=2.0)),
    ("weight_column_major", TypeError, lambda: _run(weight_column_major=1)),
    ("either seg_lens or seg_indptr", ValueError, lambda: _run(seg_lens=None)),
    ("seg_lens", ValueError, lambda: _run(seg_lens=torch.tensor([2.0, 4.0]))),
    ("seg_lens", ValueError, lambda: _run(seg_lens=torch.tensor([6]))),
    ("seg_lens", TypeError, lambda: _run(seg_lens=[2, 4])),
    ("seg_indptr", ValueError, lambda: _run(seg_indptr=torch.tensor([0, 6]))),
    # bad entries: the message names the function and the caller's argument
    ("SegmentGEMMWrapper.run: seg_indptr", ValueError,
     lambda: _run(seg_indptr=torch.tensor([0, 4, 7]))),
    ("SegmentGEMMWrapper.run: seg_indptr", ValueError,
     lambda: _run(seg_indptr=torch.tensor([0, 4, 3]))),
    ("SegmentGEMMWrapper.run: seg_lens", ValueError, lambda: _run(seg_lens=torch.tensor([4, -1]))),
    ("weight_indices", ValueError, lambda: _run(weight_indices=torch.tensor([0]))),
    ("SegmentGEMMWrapper.run: weight_indices", ValueError,
     lambda: _run(weight_indices=torch.tensor([0, 2]))),
    ("out", ValueError, lambda: _run(out=_x(6, 5))),
    ("out", ValueError, lambda: _run(out=_x(6, 4, dtype=torch.bfloat16))),
    ("out", ValueError, lambda: _run(out=_x(4, 6).t())),
    ("out.dtype", ValueError, lambda: _run(x=_x(6, 8).to(E4M3), weights=_x(2, 8, 4).to(E4M3),
                                           out=_x(6, 4, dtype=torch.float32))),
    ("backend", ValueError, lambda: SegmentGEMMWrapper(torch.empty(8), backend="cutile")),
    ("backend", TypeError, lambda: SegmentGEMMWrapper(torch.empty(8), backend=None)),
    ("float_workspace_buffer", TypeError, lambda: SegmentGEMMWrapper(None)),
]


@pytest.mark.parametrize("name,exc,call", SEGMENT_BAD,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(SEGMENT_BAD)])
def test_segment_gemm_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_segment_gemm_loop_kernels_check_offsets(backend):
    # CPU offsets are checked before any kernel runs, the message names the caller's argument
    with raises_naming("SegmentGEMMWrapper.run: seg_indptr[2] = 2", "non-decreasing"):
        _wrapper(backend).run(_x(6, 8), _x(2, 8, 4), 2, False, seg_indptr=torch.tensor([0, 5, 2]))


# --------------------------------------------------------------------------------------------
# grouped_mm_bf16 / grouped_mm_fp8


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_grouped_mm_bf16(backend, out_dtype):
    torch.manual_seed(6)
    lens = [5, 0, 9, 2]
    a = torch.randn(sum(lens), 32, dtype=torch.bfloat16)
    b = torch.randn(4, 24, 32, dtype=torch.bfloat16)
    m_indptr = _indptr(lens).to(torch.int32)
    out = poison(torch.empty(sum(lens), 24, dtype=out_dtype))
    y = grouped_mm_bf16(a, b, m_indptr, out=out, backend=backend)
    assert y is out
    expected = _naive_segments(a, b, m_indptr.tolist(), range(4), True)
    assert rel_error(out, expected) < (1e-5 if out_dtype == torch.float32 else 1e-2)
    assert grouped_mm_bf16(a, b, m_indptr, out_dtype=out_dtype).dtype == out_dtype


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_grouped_mm_fp8_alpha(backend):
    torch.manual_seed(7)
    lens = [3, 6, 0]
    a = torch.randn(9, 32).to(E4M3)
    b = torch.randn(3, 16, 32).to(E4M3)
    alpha = torch.tensor([0.25])
    y = grouped_mm_fp8(a, b, _indptr(lens).to(torch.int32), alpha, backend=backend)
    expected = 0.25 * _naive_segments(a, b, _indptr(lens).tolist(), range(3), True)
    assert y.dtype == torch.bfloat16 and rel_error(y, expected) < FP8_TOL


def _bf16(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


GROUPED_BAD = [
    ("a", ValueError, lambda: grouped_mm_bf16(_x(4, 8), _x(2, 4, 8), _i32(0, 2, 4))),
    ("b", ValueError, lambda: grouped_mm_bf16(_bf16(4, 8), _bf16(2, 4, 6), _i32(0, 2, 4))),
    ("m_indptr", ValueError, lambda: grouped_mm_bf16(_bf16(4, 8), _bf16(2, 4, 8),
                                                     torch.tensor([0, 2, 4]))),
    ("m_indptr", ValueError, lambda: grouped_mm_bf16(_bf16(4, 8), _bf16(2, 4, 8), _i32(0, 4))),
    ("out_dtype", ValueError, lambda: grouped_mm_bf16(_bf16(4, 8), _bf16(2, 4, 8), _i32(0, 2, 4),
                                                      out_dtype=torch.int8)),
    ("backend", ValueError, lambda: grouped_mm_bf16(_bf16(4, 8), _bf16(2, 4, 8), _i32(0, 2, 4),
                                                    backend="cake")),
    ("alpha", ValueError, lambda: grouped_mm_fp8(_x(4, 8).to(E4M3), _x(2, 4, 8).to(E4M3),
                                                 _i32(0, 2, 4), torch.tensor([1.0, 2.0]))),
    ("b", ValueError, lambda: grouped_mm_fp8(_x(4, 8).to(E4M3), _x(2, 4, 8).to(E5M2),
                                             _i32(0, 2, 4))),
]


@pytest.mark.parametrize("name,exc,call", GROUPED_BAD,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(GROUPED_BAD)])
def test_grouped_mm_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_grouped_mm_cudnn_name_is_strict(monkeypatch):
    a, b = _x(4, 8, dtype=torch.bfloat16), _x(2, 4, 8, dtype=torch.bfloat16)
    monkeypatch.setenv("FLASHINFER_STRICT", "1")  # else upstream's kernel names fall through
    with pytest.raises(BackendUnavailableError):
        grouped_mm_bf16(a, b, _i32(0, 2, 4), backend="cudnn")


def test_top_level_exports():
    assert flashinfer.SegmentGEMMWrapper is SegmentGEMMWrapper
    assert flashinfer.grouped_mm_bf16 is grouped_mm_bf16
    assert flashinfer.gemm.group_gemm_fp8_nt_groupwise is group_gemm_fp8_nt_groupwise


# --------------------------------------------------------------------------------------------
# group_gemm_fp8_nt_groupwise


def _quantise_groupwise(m_indptr, n, k, groups, gm, gn, gk, mode, dtype=E4M3):
    """Random fp8 a/b with random positive block scales in upstream's layout, plus the float64
    dequantised operands (computed element by element from the definition)."""
    cum_m = int(m_indptr[-1])
    a = torch.randn(cum_m, k).to(dtype)
    b = torch.randn(groups, n, k).to(dtype)
    a_scale = torch.rand(-(-cum_m // gm), -(-k // gk)) + 0.5
    b_scale = torch.rand(groups, -(-n // gn), -(-k // gk)) + 0.5
    a_deq = torch.empty(cum_m, k, dtype=torch.float64)
    bounds = m_indptr.tolist()
    for g in range(groups):
        for r in range(bounds[g], bounds[g + 1]):
            row = bounds[g] // gm + (r - bounds[g]) // gm
            for c in range(k):
                a_deq[r, c] = a[r, c].double() * a_scale[row, c // gk].double()
    rows = torch.arange(n)[:, None] // gn
    cols = torch.arange(k)[None, :] // gk
    b_deq = torch.stack([b[g].double() * b_scale[g][rows, cols].double() for g in range(groups)])
    if mode == "MN":
        a_scale, b_scale = a_scale.t().contiguous(), b_scale.transpose(1, 2).contiguous()
    return a, b, a_scale, b_scale, a_deq, b_deq


def _naive_grouped(a_deq, b_deq, bounds):
    y = torch.zeros(a_deq.shape[0], b_deq.shape[1], dtype=torch.float64)
    for g in range(b_deq.shape[0]):
        s, e = bounds[g], bounds[g + 1]
        y[s:e] = a_deq[s:e] @ b_deq[g].t()
    return y


@pytest.mark.parametrize("backend", FP8_BACKENDS)
@pytest.mark.parametrize("granularity,mode", [((1, 128, 128), "MN"), ((1, 128, 128), "K"),
                                              ((128, 128, 128), "MN"), ((1, 16, 32), "K")])
def test_group_gemm_fp8_matches_naive(backend, granularity, mode):
    torch.manual_seed(8)
    m_indptr = torch.tensor([0, 4, 4, 12, 20], dtype=torch.int32)  # an empty group
    n, k = 48, 160  # partial scale blocks in n and k
    a, b, a_scale, b_scale, a_deq, b_deq = _quantise_groupwise(m_indptr, n, k, 4, *granularity,
                                                              mode)
    out = poison(torch.empty(20, n, dtype=torch.bfloat16))
    y = group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, granularity, mode,
                                    out=out, backend=backend)
    assert y is out
    assert rel_error(out, _naive_grouped(a_deq, b_deq, m_indptr.tolist())) < FP8_TOL


@pytest.mark.parametrize("backend", FP8_BACKENDS)
def test_group_gemm_fp8_e5m2_fp16(backend):
    torch.manual_seed(9)
    m_indptr = torch.tensor([0, 3, 8], dtype=torch.int32)
    a, b, a_scale, b_scale, a_deq, b_deq = _quantise_groupwise(m_indptr, 16, 128, 2, 1, 128, 128,
                                                              "MN", E5M2)
    y = group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, out_dtype=torch.float16,
                                    backend=backend)
    assert y.dtype == torch.float16
    assert rel_error(y, _naive_grouped(a_deq, b_deq, m_indptr.tolist())) < FP8_TOL


def _fp8_call(**overrides):
    args = dict(a=_x(8, 128).to(E4M3), b=_x(2, 16, 128).to(E4M3), a_scale=torch.ones(1, 8),
                b_scale=torch.ones(2, 1, 1), m_indptr=torch.tensor([0, 4, 8], dtype=torch.int32))
    args.update(overrides)
    return group_gemm_fp8_nt_groupwise(**args)


FP8_BAD = [
    ("a", ValueError, lambda: _fp8_call(a=_x(8, 128))),
    ("b", ValueError, lambda: _fp8_call(b=_x(2, 16, 64).to(E4M3))),
    ("m_indptr", ValueError, lambda: _fp8_call(m_indptr=torch.tensor([0, 4, 8]))),
    ("m_indptr", ValueError, lambda: _fp8_call(m_indptr=_i32(0, 8))),
    ("group_gemm_fp8_nt_groupwise: m_indptr", ValueError,
     lambda: _fp8_call(m_indptr=_i32(0, 4, 9))),
    ("a_scale", ValueError, lambda: _fp8_call(a_scale=torch.ones(8, 1))),
    ("a_scale", ValueError, lambda: _fp8_call(a_scale=torch.ones(1, 8, dtype=torch.float16))),
    ("b_scale", ValueError, lambda: _fp8_call(b_scale=torch.ones(1, 1))),
    ("scale_major_mode", ValueError, lambda: _fp8_call(scale_major_mode=None)),
    ("scale_granularity_mnk", ValueError, lambda: _fp8_call(scale_granularity_mnk=(1, 128))),
    ("mma_sm", ValueError, lambda: _fp8_call(mma_sm=3)),
    ("segment_alignment", ValueError, lambda: _fp8_call(segment_alignment=0)),
    ("out_dtype", ValueError, lambda: _fp8_call(out_dtype=torch.float32)),
    ("out dtype mismatch", ValueError, lambda: _fp8_call(out=_bf16(8, 16),
                                                         out_dtype=torch.float16)),
    ("out", ValueError, lambda: _fp8_call(out=torch.empty(8, 15, dtype=torch.bfloat16))),
    ("backend", ValueError, lambda: _fp8_call(backend="cutile")),
]


@pytest.mark.parametrize("name,exc,call", FP8_BAD,
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(FP8_BAD)])
def test_group_gemm_fp8_rejects(name, exc, call):
    with pytest.raises(exc, match=rf"^{name}\b"):
        call()


def test_group_gemm_fp8_trtllm_name_is_strict(monkeypatch):
    monkeypatch.setenv("FLASHINFER_STRICT", "1")  # else upstream's kernel names fall through
    with pytest.raises(BackendUnavailableError):
        _fp8_call(backend="trtllm")


# --------------------------------------------------------------------------------------------
# torch.compile


def test_segment_gemm_compiles_fullgraph():
    torch.manual_seed(10)
    wrapper = _wrapper()
    x, weights = _x(9, 16, dtype=torch.bfloat16), _x(3, 8, 16, dtype=torch.bfloat16)
    lens, idx = torch.tensor([2, 0, 7]), torch.tensor([2, 2, 0])

    def fn(x, w, lens, idx):
        return wrapper.run(x, w, 3, True, seg_lens=lens, weight_indices=idx)

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, weights, lens, idx), fn(x, weights, lens, idx))


def test_group_gemm_fp8_compiles_fullgraph():
    torch.manual_seed(11)
    m_indptr = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    a, b, a_scale, b_scale, _, _ = _quantise_groupwise(m_indptr, 16, 128, 3, 1, 128, 128, "MN")
    compiled = torch.compile(group_gemm_fp8_nt_groupwise, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(a, b, a_scale, b_scale, m_indptr),
                               group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr))
