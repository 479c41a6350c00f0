"""The two-pass sampler (variant ``triton:two_pass`` of sampling_from_probs,
``_sampling_two_pass_kernels.py``; plain sampling, min-p, a scalar top-k with or without top-p):
support of every draw against the contract's float64 keep set, both orders of top-k and top-p,
ties, invalid rows, index mapping, determinism, every draw equal to a float64 inverse CDF at the
kernel's own uniforms (the exact full-pass path, forced with a narrow block or too few candidate
slots, included), and the calls it refuses (its check keeps them away). CPU: the interpreter,
small shapes; the chi-square tests of the sampled distributions run in test_triton_sampling.py
(``gpu``, both variants)."""

import pytest
import torch

from sampling_helpers import keep_set, probs_rows, with_bad_rows

triton = pytest.importorskip("triton")

from flashinfer.dispatch import kernel_for  # noqa: E402
from triton_draws import expected_draws  # noqa: E402

pytestmark = pytest.mark.usefixtures("kernel_device")


def two_pass():
    return kernel_for("triton", "sampling_from_probs", "two_pass")


def draw(p, n_per_row, top_k, top_p=None, joint=False, seed=7, offset=0, min_p=None):
    rows = p.shape[0]
    idx = torch.arange(rows, dtype=torch.int32, device=p.device).repeat_interleave(n_per_row)
    out = torch.full((idx.numel(),), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(idx.numel(), dtype=torch.bool, device=p.device)
    two_pass()(p, out, valid, idx, top_k, top_p, min_p, joint, True, seed, offset)
    return idx.long(), out.long(), valid


@pytest.mark.parametrize("rules", [dict(top_k=5), dict(top_k=5, top_p=0.6),
                                   dict(top_k=5, top_p=0.6, joint=True), dict(top_k=40, top_p=0.3),
                                   dict(top_k=3, top_p=0.0), dict(top_k=7, top_p=1.0),
                                   dict(top_k=None), dict(top_k=None, min_p=0.3),
                                   dict(top_k=None, min_p=0.0)],
                         ids=["k", "k_first", "joint", "k40_p03", "p0", "p1", "plain", "min_p",
                              "min_p0"])
def test_every_draw_is_in_the_keep_set(rules):
    p = probs_rows(2, 250, seed=1)  # 250 tokens: 256 candidate slots to sort
    idx, out, valid = draw(p, 4, **rules)
    assert valid.all()
    assert keep_set(p, **rules)[idx, out].all(), out.tolist()


def test_ties_at_the_top_k_boundary_are_all_kept():
    p = probs_rows(1, 64, seed=2)
    p[0, [3, 9, 20, 41]] = p.max() * 1.5  # four equal largest values, top_k = 2
    p /= p.sum()
    idx, out, valid = draw(p, 16, top_k=2)
    keep = keep_set(p, top_k=2)
    assert valid.all() and keep[idx, out].all()
    assert int(keep.sum()) == 4  # the contract keeps every tied value


@pytest.mark.parametrize("rules", [dict(top_k=4, top_p=0.8), dict(top_k=None),
                                   dict(top_k=None, min_p=0.2)], ids=["top_k", "plain", "min_p"])
def test_rows_that_are_not_distributions_give_token_0_and_invalid(rules):
    p = with_bad_rows(probs_rows(5, 50, seed=3))
    idx, out, valid = draw(p, 1, **rules)
    assert valid.tolist() == [True, False, False, False, False]
    assert out[1:].tolist() == [0, 0, 0, 0]


def test_index_mapping_and_an_out_of_range_index():
    p = probs_rows(3, 80, seed=4)
    idx = torch.tensor([2, 0, 7, -1], dtype=torch.int32, device=p.device)
    out = torch.full((4,), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(4, dtype=torch.bool, device=p.device)
    two_pass()(p, out, valid, idx, 6, 0.7, None, False, True, 5, 0)
    assert valid.tolist() == [True, True, False, False]
    keep = keep_set(p, top_k=6, top_p=0.7)
    assert keep[2, out[0].long()] and keep[0, out[1].long()]
    assert out[2:].tolist() == [0, 0]


def test_deterministic_for_a_seed_and_offset_and_different_for_another():
    p = probs_rows(1, 200, seed=5, power=1.0)
    a = draw(p, 6, top_k=20, seed=11)[1]
    b = draw(p, 6, top_k=20, seed=11)[1]
    c = draw(p, 6, top_k=20, seed=11, offset=1)[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


def _launch(p, top_k, top_p, joint, block, seed=9, cap=None, min_p=None):
    """The kernel itself with a chosen block (a narrow one forces the exact full-pass path) and
    compacted candidate slots (too few for the candidates force it too)."""
    from flashinfer.backends.triton import _sampling_two_pass_kernels as K2
    from flashinfer.backends.triton.sampling import two_pass_groups

    n = p.shape[0]
    out = torch.full((n,), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(n, dtype=torch.bool, device=p.device)
    pv = 1.0 if top_p is None else top_p
    mode = 2 if top_k is not None else (1 if min_p is not None else 0)
    groups, default_cap = two_pass_groups(top_k or 1, block, p.shape[1])
    cap = cap or default_cap
    scratch = torch.full((n, cap), float("nan"), device=p.device)
    K2.two_pass_sample_kernel[(n,)](p, out, valid, out, out, out, top_k or 1, pv, min_p or 0.0,
                                    out, out, seed, 0, 0, 0, n, p.shape[1], p.stride(0), scratch,
                                    MODE=mode, HAS_IDX=False, HAS_P=top_p is not None, P_T=False,
                                    MP_T=False, JOINT=int(joint), LOGITS=False, SEED_T=False,
                                    OFF_T=False,
                                    BLOCK=block, G=groups, CAP=cap, COL=4, PHILOX_ROUNDS=7)
    return out.long(), valid


@pytest.mark.parametrize("block,joint,cap", [(256, False, None), (64, False, None),
                                             (64, True, None), (16, False, None),
                                             (16, True, None), (64, False, 8), (64, True, 8)],
                         ids=["one_token_per_position", "four_per_position", "four_joint",
                              "exact_path", "exact_path_joint", "candidates_overflow",
                              "candidates_overflow_joint"])
def test_draw_is_the_inverse_cdf_in_position_major_order(block, joint, cap):
    # rows of 256 whose 8 largest values all sit at block position 3 of a 16-wide block: with
    # block 16 the candidates (four per position) miss half of the top 8, the count in pass 2
    # proves it and the exact full passes run; with 64 and 256 every token is a candidate, and
    # 8 compacted slots cannot hold the 64 position maxima at or above the bound: exact path
    g = torch.Generator().manual_seed(6)
    base = torch.rand(3, 256, generator=g, dtype=torch.float64, device="cpu") * 0.1 + 0.01
    for j, col in enumerate(range(3, 256, 16)):
        if j < 8:
            base[:, col] = 1.0 + 0.1 * j + 0.01 * torch.arange(3, dtype=torch.float64)
    p = (base / base.sum(-1, keepdim=True)).float().to(torch.get_default_device())
    got, ok = _launch(p, 8, 0.5, joint, block=block, seed=9, cap=cap)
    assert ok.all()
    assert torch.equal(got.cpu(), expected_draws(p, 8, 0.5, joint, block, seed=9))


@pytest.mark.parametrize("min_p", [None, 0.25], ids=["plain", "min_p"])
@pytest.mark.parametrize("block", [64, 256])
def test_plain_and_min_p_draws_are_the_inverse_cdf_in_position_major_order(min_p, block):
    p = probs_rows(4, 300, seed=19)
    got, ok = _launch(p, None, None, False, block=block, seed=12, min_p=min_p)
    assert ok.all()
    assert torch.equal(got.cpu(), expected_draws(p, None, None, False, block, seed=12, min_p=min_p))


def test_min_p_per_row():
    p = probs_rows(3, 200, seed=20)
    mp = torch.tensor([0.0, 0.3, 0.9], device=p.device)
    idx, out, valid = draw(p, 8, None, min_p=mp)
    assert valid.all() and keep_set(p, min_p=mp)[idx, out].all()


def test_calls_it_does_not_serve_are_refused_not_rerouted():
    """The variant never hands off at run time: its check keeps these calls away
    (test_sampling_decisions), and a direct call outside the check is an error."""
    p = probs_rows(2, 120, seed=8)
    for rules in (dict(top_k=torch.tensor([3, 9], dtype=torch.int32, device=p.device)),
                  dict(top_k=5, min_p=0.1), dict(top_k=None, top_p=0.7), dict(top_k=120)):
        with pytest.raises(ValueError, match="two_pass_reasons"):
            draw(p, 3, rules.get("top_k"), rules.get("top_p"), min_p=rules.get("min_p"))


@pytest.mark.gpu
def test_gpu_large_vocab_keep_set():
    p = probs_rows(64, 128256, seed=16, power=8.0).cuda()
    idx, out, valid = draw(p, 2, 50, 0.9)
    assert valid.all() and keep_set(p.cpu(), top_k=50, top_p=0.9)[idx.cpu(), out.cpu()].all()
