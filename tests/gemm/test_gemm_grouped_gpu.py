"""Grouped / segment GEMM on CUDA: every backend that serves the call vs the reference, with
8 to 256 experts (shapes scaled to fit a test run), imbalanced and empty segments. Skipped
without a GPU."""

import pytest
import torch

from flashinfer.dispatch import BackendUnavailableError
from flashinfer.gemm import SegmentGEMMWrapper, group_gemm_fp8_nt_groupwise
from flashinfer.gemm.grouped import grouped_mm_bf16
from conftest import capture_cuda_graph, poison, rel_error

pytestmark = pytest.mark.gpu

SEGMENT_BACKENDS = ["torch:grouped_mm", "torch:segment_loop", "reference"]
FP8_BACKENDS = ["torch:dequant_loop", "reference"]
# (experts, tokens, n, k): DeepSeek-V3-like (hidden 7168, intermediate 2048) scaled down as the
# expert count grows; LoRA-like small ranks
SHAPES = [(8, 1024, 4096, 7168), (64, 2048, 2048, 1024), (256, 4096, 512, 1024),
          (4, 37, 16, 4096), (16, 300, 136, 520)]
TOL = 1e-2


def _run(call, backend):
    try:
        return call(backend)
    except BackendUnavailableError as exc:
        pytest.skip(f"{backend} cannot run this problem: {str(exc).splitlines()[0]}")


def _imbalanced_lens(experts, tokens):
    """Random expert loads summing to ``tokens``, about a quarter of the experts empty."""
    weights = torch.rand(experts) * (torch.rand(experts) > 0.25)
    weights[0] += 1e-3  # never all empty
    lens = (weights / weights.sum() * tokens).floor().long()
    lens[0] += tokens - int(lens.sum())
    return lens


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts,tokens,n,k", SHAPES)
def test_segment_gemm(backend, dtype, experts, tokens, n, k):
    torch.manual_seed(experts + n)
    lens = _imbalanced_lens(experts, tokens).cuda()
    x = torch.randn(tokens, k, dtype=dtype, device="cuda")
    weights = torch.randn(experts, n, k, dtype=dtype, device="cuda") / k ** 0.5
    out = poison(torch.empty(tokens, n, dtype=dtype, device="cuda"))
    _run(lambda be: SegmentGEMMWrapper(torch.empty(1, device="cuda"), backend=be).run(
        x, weights, experts, True, out=out, seg_lens=lens), backend)
    expected = SegmentGEMMWrapper(torch.empty(1, device="cuda"), backend="reference").run(
        x, weights, experts, True, seg_lens=lens)
    assert rel_error(out, expected) < TOL


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_segment_gemm_lora_weight_indices_row_major(backend):
    torch.manual_seed(1)
    lens = torch.tensor([5, 0, 17, 1, 64, 3], device="cuda")
    idx = torch.tensor([2, 2, 0, 1, 2, 0], device="cuda")
    x = torch.randn(int(lens.sum()), 4096, dtype=torch.bfloat16, device="cuda")
    weights = torch.randn(3, 4096, 16, dtype=torch.bfloat16, device="cuda") / 64
    got = _run(lambda be: SegmentGEMMWrapper(torch.empty(1, device="cuda"), be).run(
        x, weights, 6, False, seg_lens=lens, weight_indices=idx), backend)
    expected = SegmentGEMMWrapper(torch.empty(1, device="cuda"), "reference").run(
        x, weights, 6, False, seg_lens=lens, weight_indices=idx)
    assert rel_error(got, expected) < TOL


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_grouped_mm_bf16(backend, out_dtype):
    torch.manual_seed(2)
    lens = _imbalanced_lens(32, 1000)
    m_indptr = torch.cat([torch.zeros(1), lens.cumsum(0)]).to(torch.int32).cuda()
    a = torch.randn(1000, 1024, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(32, 2048, 1024, dtype=torch.bfloat16, device="cuda") / 32
    out = poison(torch.empty(1000, 2048, dtype=out_dtype, device="cuda"))
    _run(lambda be: grouped_mm_bf16(a, b, m_indptr, out=out, backend=be), backend)
    expected = grouped_mm_bf16(a, b, m_indptr, out_dtype=torch.float32, backend="reference")
    assert rel_error(out, expected) < TOL


def test_grouped_mm_cuda_graph():
    """torch:grouped_mm reads no offsets on the host: a CUDA graph replays new loads."""
    torch.manual_seed(3)
    a = torch.randn(256, 512, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8, 256, 512, dtype=torch.bfloat16, device="cuda") / 16
    m_indptr = torch.tensor([0, 32, 64, 96, 128, 160, 192, 224, 256], dtype=torch.int32,
                            device="cuda")
    out = torch.empty(256, 256, dtype=torch.bfloat16, device="cuda")
    graph = _run(lambda be: capture_cuda_graph(
        lambda: grouped_mm_bf16(a, b, m_indptr, out=out, backend=be)), "torch:grouped_mm")
    m_indptr.copy_(torch.tensor([0, 0, 100, 100, 130, 200, 256, 256, 256], dtype=torch.int32))
    poison(out)
    graph.replay()
    expected = grouped_mm_bf16(a, b, m_indptr, out_dtype=torch.float32, backend="reference")
    assert rel_error(out, expected) < TOL


def _fp8_operands(experts, tokens, n, k, granularity, mode):
    gm, gn, gk = granularity
    lens = _imbalanced_lens(experts, tokens)
    m_indptr = torch.cat([torch.zeros(1), lens.cumsum(0)]).to(torch.int32).cuda()
    a = torch.randn(tokens, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(experts, n, k, device="cuda").to(torch.float8_e4m3fn)
    a_scale = torch.rand(-(-tokens // gm), -(-k // gk), device="cuda") + 0.5
    b_scale = torch.rand(experts, -(-n // gn), -(-k // gk), device="cuda") / k ** 0.5
    if mode == "MN":
        a_scale, b_scale = a_scale.t().contiguous(), b_scale.transpose(1, 2).contiguous()
    return a, b, a_scale, b_scale, m_indptr


@pytest.mark.parametrize("backend", FP8_BACKENDS)
@pytest.mark.parametrize("granularity,mode", [((1, 128, 128), "MN"), ((1, 128, 128), "K"),
                                              ((128, 128, 128), "MN")])
@pytest.mark.parametrize("experts,tokens,n,k", SHAPES[:3])
def test_group_gemm_fp8(backend, granularity, mode, experts, tokens, n, k):
    torch.manual_seed(experts)
    a, b, a_scale, b_scale, m_indptr = _fp8_operands(experts, tokens, n, k, granularity, mode)
    out = poison(torch.empty(tokens, n, dtype=torch.bfloat16, device="cuda"))
    _run(lambda be: group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, granularity,
                                                mode, out=out, backend=be), backend)
    expected = group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, granularity, mode,
                                           out_dtype=torch.float16, backend="reference")
    assert rel_error(out, expected) < TOL


@pytest.mark.parametrize("backend", SEGMENT_BACKENDS)
def test_grouped_mm_bf16_without_out_zeroes_uncovered_rows(backend):
    """No ``out``: torch:grouped_mm hands back torch's own result, its uncovered rows (before
    m_indptr[0], from m_indptr[-1] on) zeroed on the device."""
    torch.manual_seed(5)
    a = torch.randn(700, 512, dtype=torch.bfloat16, device="cuda") + 1.0
    b = torch.randn(6, 384, 512, dtype=torch.bfloat16, device="cuda") / 16
    m_indptr = torch.tensor([37, 100, 100, 300, 450, 640, 651], dtype=torch.int32, device="cuda")
    got = _run(lambda be: grouped_mm_bf16(a, b, m_indptr, backend=be), backend)
    expected = grouped_mm_bf16(a, b, m_indptr, out_dtype=torch.float32, backend="reference")
    assert got.shape == (700, 384) and got.dtype == torch.bfloat16
    assert (got[:37] == 0).all() and (got[651:] == 0).all()
    assert rel_error(got, expected) < TOL
