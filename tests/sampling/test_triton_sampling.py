"""Our Triton sampling kernels (flashinfer/backends/triton/sampling.py), called directly
through the triton KernelTable, against float64 computations written here and in
sampling_helpers.py.

On CPU they run in Triton's interpreter, one program per output row at about 0.1 s each, so the
CPU tests use tiny shapes and check exact results (softmax, renorm, masking), the support of every
sample (each drawn token is in the float64 keep set), edge cases and determinism. The chi-square
tests of the sampled distributions need thousands of draws and are marked ``gpu``.
"""

import pytest
import torch

from conftest import poison, rel_error
from sampling_helpers import (as_rows, chi_square_p_value, keep_set, kernel, probs_rows, run_spec,
                              spec_inputs)

triton = pytest.importorskip("triton")

#: small-shape kernel tests: interpreter on CPU, native on a GPU (conftest.kernel_device)
pytestmark = pytest.mark.usefixtures("kernel_device")


def draw(p, n_per_row, top_k=None, top_p=None, min_p=None, joint=False, seed=7, offset=0,
         out_dtype=torch.int32, variant="default"):
    rows = p.shape[0]
    idx = torch.arange(rows, dtype=torch.int32, device=p.device).repeat_interleave(n_per_row)
    out = torch.full((idx.numel(),), -7, dtype=out_dtype, device=p.device)
    valid = torch.zeros(idx.numel(), dtype=torch.bool, device=p.device)
    kernel("sampling_from_probs", variant)(p, out, valid, idx, top_k, top_p, min_p, joint, True,
                                           seed, offset)
    return idx.long(), out.long(), valid


# ---------------------------------------------------------------- exact: softmax, renorm, mask

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_softmax(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 50) * 3).to(dtype)
    x[1, :7] = float("-inf")
    for temp in (None, 0.7, torch.tensor([0.5, 1.0, 2.0])):
        out = poison(torch.empty(3, 50))
        kernel("softmax")(x, out, temp)
        t = 1.0 if temp is None else (temp.double()[:, None] if torch.is_tensor(temp) else temp)
        expect = torch.softmax(x.double() / t, -1)
        assert rel_error(out, expect) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_renorm_exact(dtype):
    p = probs_rows(4, 40, seed=1).to(dtype)
    for k in (5, torch.tensor([1, 3, 40, 0], dtype=torch.int32)):
        out = poison(torch.empty_like(p))
        kernel("renorm_probs")(p, out, k, None)
        keep = keep_set(p.float(), top_k=k)
        pd = p.double() * keep
        expect = pd / pd.sum(-1, keepdim=True)
        assert torch.equal(out != 0, keep)
        assert rel_error(out, expect) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_top_p_renorm_exact():
    p = probs_rows(4, 48, seed=2)
    for top_p in (0.5, torch.tensor([0.05, 0.3, 0.9, 1.0])):
        out = poison(torch.empty_like(p))
        kernel("renorm_probs")(p, out, None, top_p)
        keep = keep_set(p, top_p=top_p)
        pd = p.double() * keep
        assert torch.equal(out != 0, keep)
        assert rel_error(out, pd / pd.sum(-1, keepdim=True)) < 1e-6


def test_renorm_ties_and_one_hot():
    p = torch.tensor([[0.1, 0.2, 0.2, 0.2, 0.05, 0.25],
                      [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    out = poison(torch.empty_like(p))
    kernel("renorm_probs")(p, out, 2, None)            # ties at the boundary are all kept
    assert torch.equal(out != 0, keep_set(p, top_k=2))
    assert torch.equal(out[0] != 0, torch.tensor([0, 1, 1, 1, 0, 1], dtype=torch.bool))
    assert torch.equal(out[1], p[1])
    out = poison(torch.empty_like(p))
    kernel("renorm_probs")(p, out, None, 0.3)
    assert torch.equal(out != 0, keep_set(p, top_p=0.3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_mask_logits(dtype):
    torch.manual_seed(3)
    x = torch.randn(3, 33).to(dtype)
    x[0, 5] = x[0, 6] = x[0].max() + 1           # a tie at the top
    x[2, :30] = float("-inf")
    for k in (3, torch.tensor([2, 33, 5], dtype=torch.int32)):
        out = poison(torch.empty_like(x))
        kernel("top_k_mask_logits")(x, out, k)
        ks = as_rows(k, 3)
        xd = x.double()
        count = (xd[:, None, :] > xd[:, :, None]).sum(-1)
        for r in range(3):
            kr = int(ks[r])
            keep = (count[r] < kr) if 0 < kr < 33 else torch.ones(33, dtype=torch.bool)
            expect = torch.where(keep, xd[r], float("-inf"))
            assert torch.equal(out[r].double(), expect), (r, kr)


# ---------------------------------------------------------------- sampling from probabilities

@pytest.mark.parametrize("rules", [
    dict(),
    dict(top_k=4),
    dict(top_p=0.4),
    dict(min_p=0.3),
    dict(top_k=6, top_p=0.5),
    dict(top_k=6, top_p=0.5, joint=True),
    dict(top_k=torch.tensor([2, 30], dtype=torch.int32), top_p=torch.tensor([0.3, 0.6])),
], ids=["plain", "top_k", "top_p", "min_p", "k_first", "joint", "per_row"])
def test_samples_in_keep_set(rules):
    # per-row thresholds are built at collection time, on the CPU: beside the probabilities
    rules = {k: v.to(torch.get_default_device()) if torch.is_tensor(v) else v
             for k, v in rules.items()}
    p = probs_rows(2, 30, seed=4)
    idx, out, valid = draw(p, 3, **rules)
    keep = keep_set(p, **rules)
    assert valid.all()
    assert keep[idx, out].all(), (out, keep.nonzero())


@pytest.mark.parametrize("joint", [False, True], ids=["k_first", "joint"])
def test_small_top_k_with_top_p_takes_two_passes(joint):
    # the lanes' top four hold the top k (k <= Q / 4), so the pass after the first decides both
    # boundaries and draws from the kept set: a speed property (pivots never change results)
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 4096, generator=g, device="cpu") * 4.0
    p = torch.softmax(logits, -1).to(torch.get_default_device())
    out = torch.full((4,), -7, dtype=torch.int32, device=p.device)
    valid = torch.zeros(4, dtype=torch.bool, device=p.device)
    passes = torch.full((4,), -1, dtype=torch.int32, device=p.device)
    kernel("sampling_from_probs")(p, out, valid, None, 50, 0.9, None, joint, True, 3, 0,
                                  passes=passes)
    assert valid.all() and keep_set(p, top_k=50, top_p=0.9, joint=joint)[
        torch.arange(4, device=p.device), out.long()].all()
    assert 1 <= int(passes.min()) and int(passes.max()) <= 2, passes.tolist()


def test_edge_rules_keep_everything():
    p = probs_rows(1, 24, seed=5)
    p[0, 3] = 0.0                                  # zero probability: never drawn
    for rules in (dict(top_k=24), dict(top_k=0), dict(top_p=1.0), dict(min_p=0.0)):
        _, out, valid = draw(p, 4, **rules)
        assert valid.all() and (out != 3).all() and (out >= 0).all() and (out < 24).all()


def test_one_hot_and_top_p_zero():
    p = torch.zeros(2, 20)
    p[0, 13] = 1.0
    p[1] = probs_rows(1, 20, seed=6)[0]
    idx, out, valid = draw(p, 3, top_p=torch.tensor([0.5, 0.0]))
    assert valid.all()
    assert (out[idx == 0] == 13).all()
    assert (out[idx == 1] == int(p[1].argmax())).all()   # top_p = 0 keeps only the maximum


def test_invalid_rows_and_indices():
    p = probs_rows(4, 16, seed=8)
    p[1, 2] = float("nan")
    p[2, 0] = -0.1
    p[3] = 0.0
    idx = torch.tensor([0, 1, 2, 3, -1, 4], dtype=torch.int64)
    out = torch.full((6,), -7, dtype=torch.int64)
    valid = torch.ones(6, dtype=torch.bool)
    kernel("sampling_from_probs")(p, out, valid, idx, 3, None, None, False, True, 1, 2)
    assert valid.tolist() == [True, False, False, False, False, False]
    assert out[1:].tolist() == [0] * 5 and 0 <= int(out[0]) < 16


@pytest.mark.parametrize("k, top_p", [(3, None), (None, 0.5), (16, None), (None, 1.0)])
def test_renorm_invalid_rows_come_out_zero(k, top_p):
    """As the reference: a NaN, a negative entry or no mass gives a row of zeros (filter on or
    off), never inf or NaN."""
    p = probs_rows(4, 16, seed=12)
    p[1, 2] = float("nan")
    p[2, 0] = -0.1
    p[3] = 0.0
    out = torch.full_like(p, 7.0)
    kernel("renorm_probs")(p, out, k, top_p)
    assert torch.isfinite(out).all()
    assert (out[1:] == 0).all() and abs(float(out[0].sum()) - 1.0) < 1e-5


def test_determinism_and_seed_forms():
    p = probs_rows(3, 32, seed=9)
    idx = torch.arange(3, dtype=torch.int32)
    runs = {}
    for name, seed, offset in [
        ("int", 1234, 8),
        ("again", 1234, 8),
        ("t1", torch.tensor([1234]), torch.tensor([8])),
        ("tB", torch.tensor([1234, 99, 7]), torch.full((3,), 8)),
    ]:
        out = torch.empty(3, dtype=torch.int32)
        valid = torch.empty(3, dtype=torch.bool)
        kernel("sampling_from_probs")(p, out, valid, idx, 4, None, None, False, True, seed,
                                      offset)
        runs[name] = out
    assert torch.equal(runs["int"], runs["again"]) and torch.equal(runs["int"], runs["t1"])
    assert int(runs["tB"][0]) == int(runs["int"][0])         # row 0 keeps seed 1234


def test_large_seed_and_offset():
    p = probs_rows(1, 16, seed=10)
    _, a, _ = draw(p, 2, seed=2**64 - 1, offset=2**40 + 4)
    _, b, _ = draw(p, 2, seed=2**64 - 1, offset=2**40 + 4)
    assert torch.equal(a, b) and (a >= 0).all() and (a < 16).all()


# ---------------------------------------------------------------- sampling from logits

def test_sampling_from_logits_support_and_invalid():
    torch.manual_seed(11)
    x = torch.randn(4, 20)
    x[0, ::2] = float("-inf")
    x[1, 4] = float("nan")
    x[2] = float("-inf")
    idx = torch.tensor([0, 0, 1, 2, 3, 5], dtype=torch.int32)
    out = torch.full((6,), -7, dtype=torch.int32)
    kernel("sampling_from_logits")(x, out, idx, True, 3, 0)
    assert int(out[0]) % 2 == 1 and int(out[1]) % 2 == 1
    assert out[2:5].tolist()[:2] == [0, 0] and 0 <= int(out[4]) < 20 and int(out[5]) == 0
    again = torch.empty_like(out)
    kernel("sampling_from_logits")(x, again, idx, True, 3, 0)
    assert torch.equal(out, again)


def test_sampling_from_logits_half():
    x = torch.full((2, 12), float("-inf"), dtype=torch.bfloat16)
    x[0, 7] = 1.0
    x[1, 2] = 0.0
    out = torch.empty(2, dtype=torch.int64)
    kernel("sampling_from_logits")(x, out, None, True, torch.tensor([5]), torch.tensor([0]))
    assert out.tolist() == [7, 2]


# ---------------------------------------------------------------- chain speculative sampling


def test_spec_all_accepted_when_target_equals_draft():
    draft, ids, target = spec_inputs(2, 3, 16, seed=12)
    target[:, :3] = draft
    output, accepted, emitted = run_spec(draft, ids, target, acc0=5, emit0=1)
    assert torch.equal(output[:, :3], ids)
    assert ((output[:, 3] >= 0) & (output[:, 3] < 16)).all()
    assert accepted.tolist() == [8, 8] and emitted.tolist() == [4, 4]


def test_spec_rejections_and_residual():
    draft, ids, target = spec_inputs(3, 3, 16, seed=13)
    target[:, :3] = draft
    # request 0: target gives the second draft zero probability -> rejected at 1
    target[0, 1, ids[0, 1]] = 0.0
    # request 1: first draft id out of range -> rejected at 0; later tests still count
    ids[1, 0] = 99
    # request 2: residual relu(t - q) at position 0 is one token
    target[2, 0] = 0.0
    target[2, 0, 5] = 1.0
    draft[2, 0] = 0.0
    draft[2, 0, 6] = 1.0
    ids[2, 0] = 6
    output, accepted, emitted = run_spec(draft, ids, target)
    assert output[0, 0] == ids[0, 0] and output[0, 2:].tolist() == [-1, -1]
    assert int(output[0, 1]) != int(ids[0, 1])
    assert emitted.tolist() == [1, 0, 0]
    assert accepted.tolist() == [2, 2, 2]
    assert output[1, 1:].tolist() == [-1, -1, -1] and 0 <= int(output[1, 0]) < 16
    assert output[2].tolist() == [5, -1, -1, -1]
    again = run_spec(draft, ids, target)
    assert torch.equal(again[0], output)


# ---------------------------------------------------------------- GPU: chi-square


@pytest.mark.gpu
@pytest.mark.parametrize("rules,variant", [
    (rules, variant)
    for rules in (dict(), dict(top_k=5), dict(top_p=0.6), dict(min_p=0.2),
                  dict(top_k=8, top_p=0.7), dict(top_k=8, top_p=0.7, joint=True))
    # two_pass serves plain, min-p and the scalar top-k rules; top-p alone is nucleus's
    for variant in (("default", "nucleus") if set(rules) == {"top_p"} else ("default", "two_pass"))
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)) or "plain")
def test_gpu_chi_square_probs(rules, variant):
    p = probs_rows(1, 48, seed=14).cuda()
    n = 200_000
    _, out, valid = draw(p, n, **rules, variant=variant)
    assert valid.all()
    keep = keep_set(p.cpu(), **rules)[0]
    target = p.cpu().double()[0] * keep
    target /= target.sum()
    counts = torch.bincount(out.cpu(), minlength=48).double()
    assert (counts[~keep] == 0).all()
    assert chi_square_p_value(counts, target) > 1e-6


@pytest.mark.gpu
def test_gpu_chi_square_logits():
    torch.manual_seed(15)
    x = torch.randn(1, 40, device="cuda") * 2
    n = 200_000
    out = torch.empty(n, dtype=torch.int64, device="cuda")
    kernel("sampling_from_logits")(x, out, torch.zeros(n, dtype=torch.int32, device="cuda"),
                                   True, 21, 0)
    counts = torch.bincount(out.cpu(), minlength=40).double()
    assert chi_square_p_value(counts, torch.softmax(x.cpu().double()[0], -1)) > 1e-6


@pytest.mark.gpu
def test_gpu_large_vocab_top_k_top_p_keep_set():
    p = probs_rows(64, 4096, seed=16, power=8.0).cuda()
    rules = dict(top_k=50, top_p=0.9)
    idx, out, valid = draw(p, 4, **rules)
    assert valid.all()
    keep = keep_set(p.cpu(), **rules)
    assert keep[idx.cpu(), out.cpu()].all()


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_reads_seed_on_device():
    from conftest import capture_cuda_graph

    p = probs_rows(8, 32000, seed=17, power=6.0).cuda()
    idx = torch.arange(8, dtype=torch.int32, device="cuda")
    seed = torch.tensor([5], dtype=torch.int64, device="cuda")
    offset = torch.tensor([0], dtype=torch.int64, device="cuda")
    out = torch.empty(8, dtype=torch.int32, device="cuda")
    valid = torch.empty(8, dtype=torch.bool, device="cuda")

    def step():
        kernel("sampling_from_probs")(p, out, valid, idx, 50, 0.9, None, False, True, seed,
                                      offset)

    graph = capture_cuda_graph(step)
    for off in (4, 8, 12):
        offset.fill_(off)
        graph.replay()
        eager = torch.empty_like(out)
        kernel("sampling_from_probs")(p, eager, valid.clone(), idx, 50, 0.9, None, False, True,
                                      5, off)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.gpu
def test_gpu_large_vocab_renorm_and_mask_exact():
    p = probs_rows(16, 32000, seed=18, power=6.0).cuda()
    ks = torch.randint(1, 2000, (16,), dtype=torch.int32, device="cuda")
    out = torch.empty_like(p)
    kernel("renorm_probs")(p, out, ks, None)
    keep = keep_set(p.cpu(), top_k=ks.cpu())
    assert torch.equal((out != 0).cpu(), keep)
    ps = torch.rand(16, device="cuda")
    kernel("renorm_probs")(p, out, None, ps)
    # fp32 partial sums may differ from float64 only for tokens whose mass above lies within
    # 1e-5 of the threshold
    pd = p.double().cpu()
    desc = pd.sort(-1, descending=True).values
    count = 32000 - torch.searchsorted(desc.flip(-1).contiguous(), pd, right=True)
    zero = torch.zeros(16, 1, dtype=pd.dtype, device="cpu")
    mass = torch.cat([zero, desc.cumsum(-1)], -1).gather(-1, count)
    near = (mass - ps.cpu().double()[:, None]).abs() < 1e-5
    differ = (out != 0).cpu() != keep_set(p.cpu(), top_p=ps.cpu())
    assert not (differ & ~near).any()
    logits = torch.randn(16, 32000, device="cuda").to(torch.bfloat16)
    masked = torch.empty_like(logits)
    kernel("top_k_mask_logits")(logits, masked, ks)
    expect = keep_set(torch.softmax(logits.double(), -1).cpu(), top_k=ks.cpu())
    assert torch.equal(torch.isfinite(masked).cpu(), expect)
