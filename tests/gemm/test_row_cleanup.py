"""zero_rows_outside: rows of a segmented GEMM's result outside [indptr[0], indptr[-1]) become
zero, found on the device; the Triton kernel (natively on a GPU, in Triton's interpreter on the
CPU: conftest.kernel_device) and the masked-fill fallback agree bit for bit, rows inside are
untouched. The torch grouped-GEMM kernel's ``out=None`` form (torch._grouped_mm runs on CPU too)
against the reference."""

import pytest
import torch

from flashinfer.backends.shared import row_cleanup
from flashinfer.backends.reference.gemm_grouped import segment_gemm as reference_segment_gemm
from flashinfer.gemm.grouped import FAULTS


pytestmark = pytest.mark.usefixtures("kernel_device")

CASES = [(130, 300, (5, 40, 40, 90)), (64, 256, (0, 64)), (7, 9, (3, 3)), (200, 70, (0, 0, 150)),
         (1, 16, (0, 1))]


@pytest.mark.parametrize("rows,cols,offsets", CASES)
@pytest.mark.parametrize("path", ["triton", "masked_fill"])
def test_rows_outside_become_zero_and_inside_rows_are_untouched(monkeypatch, rows, cols, offsets,
                                                                path):
    g = torch.Generator().manual_seed(rows + cols)
    y = torch.randn(rows, cols, generator=g, device="cpu") + 3.0  # never zero
    y = y.to(torch.empty(0).device)
    before = y.clone()
    indptr = torch.tensor(offsets, dtype=torch.int64 if rows % 2 else torch.int32)
    if path == "triton":
        pytest.importorskip("triton")
    else:
        monkeypatch.setattr(row_cleanup, "_triton_kernel", lambda: None)
    row_cleanup.zero_rows_outside(y, indptr)
    start, end = offsets[0], offsets[-1]
    assert (y[:start] == 0).all() and (y[end:] == 0).all()
    assert torch.equal(y[start:end], before[start:end])


def test_torch_grouped_kernel_returns_its_own_zeroed_result():
    from flashinfer.backends.torch.gemm_grouped import segment_gemm_grouped

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch without _grouped_mm")
    g = torch.Generator().manual_seed(4)
    dev = torch.empty(0).device
    x = torch.randn(40, 32, generator=g, device="cpu").to(dev, torch.bfloat16)
    w = torch.randn(3, 16, 32, generator=g, device="cpu") / 6  # column-major [W, n, k]
    w = w.to(dev, torch.bfloat16)
    indptr = torch.tensor([4, 10, 10, 31], dtype=torch.int32)  # rows 0-3 and 31-39 uncovered
    alpha = torch.tensor([0.5])
    try:
        y = segment_gemm_grouped(x, w, indptr, None, True, alpha, None, FAULTS["grouped_mm_fp8"])
    except RuntimeError as exc:  # a CPU build whose _grouped_mm lacks this dtype
        pytest.skip(f"torch._grouped_mm on CPU: {exc}")
    assert segment_gemm_grouped.returns_output and y.shape == (40, 16)
    want = torch.empty(40, 16, dtype=torch.float32, device="cpu")
    y = y.cpu()
    reference_segment_gemm(x.cpu(), w.cpu(), indptr.cpu(), None, True, alpha.cpu(), want,
                           FAULTS["grouped_mm_fp8"])
    assert (y[:4] == 0).all() and (y[31:] == 0).all()
    assert torch.allclose(y.float(), want, atol=2e-2, rtol=2e-2)
