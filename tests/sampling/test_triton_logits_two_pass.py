"""Top-k / top-p sampling from logits in the two-pass sampler (variant ``triton:two_pass`` of
top_k_top_p_sampling_from_logits: ``_sampling_two_pass_kernels.py`` with LOGITS, weights
``exp(x - max)``): every draw equal to a float64 inverse CDF of the contract's keep set of
``softmax(logits)`` in position-major order at the kernel's own uniforms (three dtypes, the
exact full-pass path and overflowing candidate slots included), rows that give token 0, the
index mapping, per-row top-p, the calls it hands to the softmax-then-sampler variant, and the
other backends of the op; ``gpu``: a chi-square test and 128k rows."""

import pytest
import torch

from sampling_helpers import chi_square_p_value, keep_set, logits

triton = pytest.importorskip("triton")

from flashinfer import sampling  # noqa: E402
from flashinfer.dispatch import kernel_for  # noqa: E402
from triton_draws import expected_draws  # noqa: E402  (float64 inverse CDF)

pytestmark = [pytest.mark.usefixtures("kernel_device"),
              # the interpreter's numpy evaluates exp(-inf - -inf) before the kernel masks it
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

OP = "top_k_top_p_sampling_from_logits"


def fused():
    return kernel_for("triton", OP, "two_pass")


def softmax64(x):
    return torch.softmax(x.double(), -1)


def _launch(x, top_k, top_p, block, seed=9, cap=None, indices=None):
    """The kernel in its logits mode with a chosen block and candidate slots (a narrow block or
    too few slots force the exact full-pass path)."""
    from flashinfer.backends.triton import _sampling_two_pass_kernels as K2
    from flashinfer.backends.triton.sampling import two_pass_groups

    n = x.shape[0] if indices is None else indices.numel()
    out = torch.full((n,), -7, dtype=torch.int32, device=x.device)
    valid = torch.zeros(n, dtype=torch.bool, device=x.device)
    groups, default_cap = two_pass_groups(top_k, block, x.shape[1])
    scratch = torch.full((n, cap or default_cap), float("nan"), device=x.device)
    K2.two_pass_sample_kernel[(n,)](
        x, out, valid, out if indices is None else indices, out, out, top_k, top_p, 0.0, out,
        out, seed, 0, 0, 0, x.shape[0], x.shape[1], x.stride(0), scratch, MODE=2,
        HAS_IDX=indices is not None, HAS_P=True, P_T=False, MP_T=False, JOINT=0, LOGITS=True,
        SEED_T=False, OFF_T=False, BLOCK=block, G=groups, CAP=cap or default_cap, COL=4,
        PHILOX_ROUNDS=7)
    return out.long(), valid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k,top_p", [(5, 0.6), (12, 0.95), (3, 0.0), (7, 1.0)])
def test_draw_is_the_inverse_cdf_of_the_softmax_keep_set(dtype, top_k, top_p):
    x = logits(4, 300, seed=21, dtype=dtype)
    x[1, 10:40] = float("-inf")  # masked logits take no mass
    got, ok = _launch(x, top_k, top_p, block=64)
    assert ok.all()
    expected = expected_draws(softmax64(x), top_k, top_p, False, 64, seed=9)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("block,cap", [(16, None), (64, 8)], ids=["exact_path", "overflow"])
def test_exact_path(block, cap):
    # the 8 largest logits all sit at block position 3 of a 16-wide block: four candidates per
    # position miss half of them and the count in pass 2 proves it; 8 slots cannot hold the
    # candidates above the group-maxima bound: both take the exact full passes
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, 256, generator=g, dtype=torch.float64, device="cpu")
    for j, col in enumerate(range(3, 256, 16)):
        if j < 8:
            x[:, col] = 4.0 + 0.1 * j + 0.01 * torch.arange(3, dtype=torch.float64)
    x = x.float().to(torch.get_default_device())
    got, ok = _launch(x, 8, 0.5, block=block, cap=cap)
    assert ok.all()
    assert torch.equal(got.cpu(), expected_draws(softmax64(x), 8, 0.5, False, block, seed=9))


def test_invalid_rows_and_indices_give_token_0():
    x = logits(5, 200, seed=22)
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    x[3] = float("-inf")
    idx = torch.tensor([0, 1, 2, 3, 4, 5, -1], dtype=torch.int32, device=x.device)
    got, ok = _launch(x, 5, 0.9, block=64, indices=idx)
    assert ok.tolist() == [True, False, False, False, True, False, False]
    assert (got[~ok.cpu().to(got.device)] == 0).all()
    keep = keep_set(softmax64(x), top_k=5, top_p=0.9)
    assert keep[0, got[0]] and keep[4, got[4]]


def _public(x, top_k, top_p, backend, **kw):
    return sampling.top_k_top_p_sampling_from_logits(x, top_k, top_p, seed=5, offset=0,
                                                     backend=backend, **kw)


def test_public_call_index_mapping_and_per_row_top_p():
    x = logits(3, 200, seed=23, dtype=torch.bfloat16)
    idx = torch.tensor([2, 0, 2, 1, 0], dtype=torch.int64, device=x.device)
    ps = torch.tensor([0.3, 0.0, 0.9], device=x.device)
    out = _public(x, 6, ps, "triton:two_pass", indices=idx)
    assert out.dtype == torch.int64 and out.shape == (5,)
    keep = keep_set(softmax64(x), top_k=6, top_p=ps)
    assert keep[idx.cpu(), out.cpu()].all()
    assert torch.equal(out, _public(x, 6, ps, "triton:two_pass", indices=idx))  # deterministic


@pytest.mark.parametrize("rules", [dict(top_k="per_row"), dict(filter_apply_order="joint"),
                                   dict(top_k=100)], ids=["per_row_k", "joint", "k_above_q"])
def test_asking_for_it_where_its_record_refuses_names_the_feature(rules):
    from flashinfer.dispatch import BackendUnavailableError

    x = logits(3, 150, seed=24)
    rules = dict(rules)
    top_k = rules.pop("top_k", 6)
    if top_k == "per_row":
        top_k = torch.tensor([3, 9, 4], dtype=torch.int32, device=x.device)
    # (Q = 64 lanes at this vocabulary)
    with pytest.raises(BackendUnavailableError, match="top_k_per_row|joint|lanes of the two-pass"):
        _public(x, top_k, 0.8, "triton:two_pass", **rules)
    keep = keep_set(softmax64(x), top_k=top_k, top_p=0.8,
                    joint=rules.get("filter_apply_order") == "joint")
    assert keep[torch.arange(3), _public(x, top_k, 0.8, "auto", **rules).cpu()].all()


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_other_backends_draw_inside_the_keep_set(backend):
    x = logits(4, 120, seed=25)
    x[2, 5] = float("nan")
    out = _public(x, 4, 0.7, backend)
    keep = keep_set(softmax64(x), top_k=4, top_p=0.7)
    for r in (0, 1, 3):
        assert keep[r, out[r]]
    assert out[2] == 0


def test_dispatch_checks():
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem, select

    def decide(features, top_k):
        shape = {"batch_size": 64, "vocab_size": 131072}
        if top_k is not None:
            shape["top_k"] = top_k
        return select(Problem.make(OP, simulated("9.0"), dtypes={"logits": "bfloat16"},
                                   shape=shape, features=features), assume_installed=True)

    assert decide(["top_k", "top_p"], 64).name == "triton:two_pass"
    assert decide(["top_k", "top_p"], 1024).name == "triton"
    assert decide(["top_k", "top_k_per_row", "top_p"], None).name == "triton"
    assert decide(["top_k", "top_p", "joint"], 64).name == "triton"


@pytest.mark.gpu
def test_gpu_chi_square():
    torch.manual_seed(0)
    x = (torch.randn(1, 64, dtype=torch.float64) * 1.5).float().cuda()
    n = 200_000
    rows = x.expand(n, 64).contiguous()
    out = _public(rows, 10, 0.8, "triton:two_pass")
    counts = torch.bincount(out.cpu().long(), minlength=64).double()
    p = softmax64(x.cpu())
    target = p * keep_set(p, top_k=10, top_p=0.8)
    assert chi_square_p_value(counts, (target / target.sum())[0]) > 1e-6


@pytest.mark.gpu
def test_gpu_large_vocab_keep_set():
    x = logits(64, 128256, seed=26, dtype=torch.bfloat16).cuda() * 3.0
    out = _public(x, 50, 0.9, "triton:two_pass")
    keep = keep_set(softmax64(x.cpu()), top_k=50, top_p=0.9)
    assert keep[torch.arange(64, device="cpu"), out.cpu()].all()
