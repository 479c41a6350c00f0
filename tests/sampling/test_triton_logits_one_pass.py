"""Sampling from logits in one pass (variant ``triton:one_pass`` of sampling_from_logits,
``_logits_draw_kernels.py``): every draw equal to a float64 inverse CDF of ``softmax(logits)``
in position-major order at the kernel's own uniforms (three dtypes, ``-inf`` entries, block
sizes), rows that give token 0 (NaN, +inf, only ``-inf``, an index outside the rows), the index
mapping and its dtype, determinism; ``gpu``: a chi-square test and 128k rows."""

import pytest
import torch

from sampling_helpers import chi_square_p_value, logits

triton = pytest.importorskip("triton")

from flashinfer.dispatch import kernel_for  # noqa: E402
from triton_draws import uniform_kernel  # noqa: E402  (the same counter)

pytestmark = [pytest.mark.usefixtures("kernel_device"),
              # the interpreter's numpy evaluates exp(-inf - -inf) before the kernel masks it
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def one_pass():
    return kernel_for("triton", "sampling_from_logits", "one_pass")


def _launch(x, block, seed=9, indices=None, out_dtype=torch.int32):
    from flashinfer.backends.triton import _logits_draw_kernels as KL

    n = x.shape[0] if indices is None else indices.numel()
    out = torch.full((n,), -7, dtype=out_dtype, device=x.device)
    KL.logits_draw_kernel[(n,)](x, out, indices if indices is not None else out, out, out, seed,
                                0, 0, 0, x.shape[0], x.shape[1], x.stride(0),
                                HAS_IDX=indices is not None, SEED_T=False, OFF_T=False,
                                BLOCK=block, COL=4, PHILOX_ROUNDS=7)
    return out.long()


def _expected(x, block, seed):
    """float64 inverse CDF of softmax(x) in position-major order, at the kernel's uniforms."""
    rows, vocab = x.shape
    u = torch.empty(rows, dtype=torch.float32, device=x.device)
    uniform_kernel[(rows,)](u, seed)
    w = torch.softmax(x.double().cpu(), -1)
    order = torch.tensor([t for j in range(block) for t in range(j, vocab, block)], device="cpu")
    cdf = w[:, order].cumsum(-1)
    pos = torch.searchsorted(cdf, (u.cpu().double() * cdf[:, -1]).unsqueeze(-1), right=True)
    return order[pos.squeeze(-1).clamp_max(vocab - 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [16, 64, 512])
def test_draw_is_the_inverse_cdf_in_position_major_order(dtype, block):
    x = logits(6, 300, seed=block, dtype=dtype)
    x[2, ::3] = float("-inf")
    assert torch.equal(_launch(x, block).cpu(), _expected(x, block, seed=9))


def test_rows_that_give_token_0():
    x = logits(5, 40, seed=3)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    x[3] = float("-inf")
    idx = torch.tensor([0, 1, 2, 3, 4, -1, 5], dtype=torch.int32, device=x.device)
    got = _launch(x, 16, indices=idx).cpu()
    want = _expected(x, 16, seed=9)
    assert got[1:4].tolist() == [0, 0, 0] and got[5:].tolist() == [0, 0]
    assert got[0] == want[0]  # output row 0 draws from row 0 with its own uniform


def test_adapter_index_dtype_and_determinism():
    x = logits(3, 200, seed=4)
    idx = torch.tensor([2, 0, 2, 1], dtype=torch.int64, device=x.device)
    runs = []
    for offset in (0, 0, 4):
        out = torch.full((4,), -7, dtype=torch.int64, device=x.device)
        one_pass()(x, out, idx, True, 11, offset)
        assert ((out >= 0) & (out < 200)).all()
        runs.append(out.cpu())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


@pytest.mark.gpu
def test_gpu_chi_square():
    x = logits(1, 40, seed=15).cuda() * 0.7
    n = 200_000
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    one_pass()(x, out, torch.zeros(n, dtype=torch.int32, device="cuda"), True, 21, 0)
    counts = torch.bincount(out.long().cpu(), minlength=40).double()
    assert chi_square_p_value(counts, torch.softmax(x.cpu().double()[0], -1)) > 1e-6


@pytest.mark.gpu
def test_gpu_large_vocab_draws_are_in_range_and_match_the_reference():
    x = logits(8, 128256, seed=16, dtype=torch.bfloat16).cuda()
    from flashinfer.backends.triton.sampling import _launch_shape

    block = 4 * _launch_shape(128256, 8)[0]
    out = torch.empty(8, dtype=torch.int32, device="cuda")
    one_pass()(x, out, None, True, 9, 0)
    assert torch.equal(out.long().cpu(), _expected(x, block, seed=9))
