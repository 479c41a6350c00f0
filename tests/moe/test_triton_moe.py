"""Triton fused MoE (backends/triton/moe.py): the device-side alignment, the kernels
under TRITON_INTERPRET=1 at tiny shapes against a float64 per-(token, slot) loop written here,
the SM 8.9 fp8 check, and (GPU) DeepSeek-like scaled-down layers against the reference."""

import dataclasses

import pytest
import torch

from conftest import TOLERANCE, capture_cuda_graph, poison, rel_error
from flashinfer.backends.triton.moe import ONE_PROGRAM_PAIRS, fused_moe, max_rows, prepare
from flashinfer.device import simulated
from flashinfer.dispatch import Problem, select
from flashinfer.fused_moe import cutlass_fused_moe
from flashinfer.fused_moe.core import ExpertSpec

E4M3 = torch.float8_e4m3fn
SWIGLU, GEGLU, GEGLU_TANH = 3, 4, 8
#: small-shape kernel tests: interpreter on CPU, native on a GPU (conftest.kernel_device)
pytestmark = pytest.mark.usefixtures("kernel_device")


def _naive(x, w1, w2, ids, weights, activation=SWIGLU, offset=0, on_input=False):
    """float64 loop over (token, slot): x, w1, w2 already dequantised."""
    x, w1, w2 = x.double(), w1.double(), w2.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - offset
            if not 0 <= e < w1.shape[0]:
                continue
            w = float(weights[t, j])
            row = x[t] * w if on_input else x[t]
            h = w1[e] @ row
            up, gate = h[:inter], h[inter:]
            if activation == SWIGLU:
                act = gate / (1 + torch.exp(-gate))
            elif activation == GEGLU:
                act = 0.5 * gate * (1 + torch.erf(gate / 2 ** 0.5))
            else:
                act = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5
                                                   * (gate + 0.044715 * gate ** 3)))
            y = w2[e] @ (act * up)
            out[t] += y if on_input else w * y
    return out


def _q128(v):
    """float64 values of ``v [..., K]`` after the kernels' W8A8 rounding: fp8 e4m3 per 128-wide
    group of the last dim, scale amax / 448 (computed in float32, as the kernels do)."""
    k = v.shape[-1]
    g = torch.nn.functional.pad(v.float(), (0, -(-k // 128) * 128 - k))
    g = g.reshape(*v.shape[:-1], -1, 128)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 448.0 / amax, torch.zeros_like(amax))
    q = (g * inv).to(E4M3).double() * (amax.double() / 448.0)
    return q.reshape(*v.shape[:-1], -1)[..., :k]


def _naive_w8a8(x, w1, w2, ids, weights, on_input=False):
    """float64 W8A8 DeepSeek recipe (SwiGLU) with weights already dequantised: the input and
    the (float32) intermediate rounded to fp8 per row and 128-wide group (``_q128``)."""
    xq, w1, w2 = _q128(x.double()), w1.double(), w2.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64, device=x.device)
    for e in range(w1.shape[0]):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        w = weights[tok, slot].double()[:, None]
        rows = xq[tok] * w if on_input else xq[tok]
        h = rows @ w1[e].t()
        up, gate = h[:, :inter], h[:, inter:]
        mid = gate / (1 + torch.exp(-gate)) * up
        mid = mid.float().double()
        y = _q128(mid) @ w2[e].t()
        out.index_add_(0, tok, y if on_input else w * y)
    return out


def _experts(e, hidden, inter, dtype, device=None):
    w1 = (torch.randn(e, 2 * inter, hidden, device=device) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(e, hidden, inter, device=device) / inter ** 0.5).to(dtype)
    return w1, w2


def _route(t, k, e, device=None):
    ids = torch.rand(t, e, device=device).argsort(dim=1)[:, :k].int()  # k distinct experts
    return ids, torch.rand(t, k, device=device) + 0.1


def _blocks(w, rows=128, cols=128):
    """fp8 e4m3 and float32 scales of ``rows x cols`` blocks (last two dims padded up)."""
    *lead, r, c = w.shape
    pr, pc = -(-r // rows) * rows, -(-c // cols) * cols
    padded = torch.nn.functional.pad(w.float(), (0, pc - c, 0, pr - r))
    b = padded.reshape(*lead, pr // rows, rows, pc // cols, cols)
    scale = b.abs().amax(dim=(-3, -1)).clamp_min(1e-12) / 448.0
    q = (b / scale[..., :, None, :, None]).reshape(*lead, pr, pc)[..., :r, :c].to(E4M3)
    return q, scale


def _dequant(q, scale, rows=128, cols=128):
    full = scale.repeat_interleave(rows, -2).repeat_interleave(cols, -1)
    return q.double() * full[..., : q.shape[-2], : q.shape[-1]].double()


def _run(x, w1, w2, ids, weights, spec, x_scale=None, s1=None, s2=None, out_dtype=None):
    out = poison(torch.empty(x.shape[0], w2.shape[1], dtype=out_dtype or torch.bfloat16,
                             device=x.device))
    fused_moe(x, x_scale, w1, s1, w2, s2, ids, weights, spec, out)
    return out


def _spec(quant="none", activation=SWIGLU, offset=0, on_input=False):
    return ExpertSpec(quant, activation, offset, on_input)


# --------------------------------------------------------------------------------------------
# alignment and input quantisation (prepare)


@pytest.mark.parametrize("t,k,e,block_m,offset", [(1, 1, 4, 16, 0), (7, 2, 8, 16, 0),
                                                   (33, 2, 6, 32, 0), (33, 2, 6, 16, 4),
                                                   (16, 8, 256, 16, 0), (43, 3, 9, 16, 0),
                                                   (300, 8, 256, 16, 0), (50, 3, 5, 64, 0)])
def test_align_groups_and_pads_by_expert(t, k, e, block_m, offset):
    """One program up to ONE_PROGRAM_PAIRS pairs (16 x 8 is the last), three launches past it
    (43 x 3 the first)."""
    torch.manual_seed(t * 10 + k)
    # global ids, some of other ranks (below the offset or past the local experts)
    ids = torch.randint(offset - 2, offset + e + 2, (t, k), dtype=torch.int32)
    sorted_pairs, block_expert, num_blocks, x_q, x_scale = prepare(ids, offset, e, block_m)
    assert x_q is None and x_scale is None
    rows = max_rows(t * k, e, block_m)
    assert sorted_pairs.shape == (rows,) and block_expert.shape == (rows // block_m,)
    # the exact list: each expert's pairs ascending (stable), padded to a block multiple
    flat = ids.reshape(-1).long().cpu() - offset
    expected, experts = [], []
    for ex in range(e):
        pairs = (flat == ex).nonzero().flatten().tolist()
        padded = -(-len(pairs) // block_m) * block_m
        expected += pairs + [t * k] * (padded - len(pairs))
        experts += [ex] * (padded // block_m)
    assert int(num_blocks) == len(experts)
    assert sorted_pairs.tolist() == expected + [t * k] * (rows - len(expected))
    assert block_expert[: len(experts)].tolist() == experts
    assert ((block_expert >= 0) & (block_expert < e)).all()  # unused blocks: any valid expert


@pytest.mark.parametrize("tokens", [1, 16, 256, 1024, 4096, 65536])
def test_launch_configs_keep_w8a8_tiles_one_scale_group(tokens):
    from flashinfer.backends.triton.moe import launch_config

    w8a8 = launch_config(tokens * 8, 256, True, True)
    assert w8a8.block_k == w8a8.block_n1 == 128
    plain = launch_config(tokens * 8, 256, True, False)
    assert plain.block_n1 == 64  # 128-wide bf16 tiles overflow shared memory at BLOCK_M 64
    assert w8a8.block_m <= 16 or tokens >= 256  # few rows per expert: little padding


@pytest.mark.parametrize("tokens,hidden,top_k", [(1, 128, 2), (19, 320, 2), (19, 320, 8)])
def test_prepare_quantises_per_token_and_128_group(tokens, hidden, top_k):
    """In the alignment's launch: spare programs of align_kernel (up to ONE_PROGRAM_PAIRS
    pairs) or of align_count_kernel (19 x 8 pairs); the alignment is the one without."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device="cpu").manual_seed(tokens)
    x = (torch.randn(tokens, hidden, generator=gen, device="cpu") * 3).to(torch.bfloat16)
    x[0, :128] = 0  # an all-zero group: scale 0, values 0
    ids = torch.randint(0, 12, (tokens, top_k), generator=gen, dtype=torch.int32).to(dev)
    assert (tokens * top_k <= ONE_PROGRAM_PAIRS) == (top_k == 2)
    *aligned, q, s = prepare(ids, 0, 10, 16, quantise=x.to(dev))
    for got, want in zip(aligned, prepare(ids, 0, 10, 16)[:3]):  # every element is written
        assert torch.equal(got, want)
    groups = -(-hidden // 128)
    assert q.shape == (tokens, hidden) and s.shape == (tokens, groups)
    q, s = q.float().cpu(), s.cpu()
    xf = torch.nn.functional.pad(x.float(), (0, groups * 128 - hidden)).view(tokens, groups, 128)
    amax = xf.abs().amax(-1)
    torch.testing.assert_close(s, amax / 448.0, rtol=1e-6, atol=0)
    assert s[0, 0] == 0 and (q[0, :128] == 0).all()
    # fp8 e4m3 values (3 mantissa bits: within 2**-4 relative of x / scale, the group's
    # largest magnitude exactly 448); ties may round either way (the kernel's fp32 division is
    # not torch's), so no bit-for-bit comparison with torch's conversion
    assert torch.equal(q, q.to(torch.float8_e4m3fn).float())
    scaled = (xf / torch.where(amax > 0, amax / 448.0, 1.0)[..., None]).view(tokens, -1)[:, :hidden]
    assert ((q - scaled).abs() <= scaled.abs() * 2.0**-4 + 1e-6).all()
    assert torch.equal(q.abs()[1:].amax(-1), torch.full((tokens - 1,), 448.0, device="cpu"))


# --------------------------------------------------------------------------------------------
# kernels under the interpreter


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,k,e,hidden,inter", [(1, 1, 4, 64, 64), (7, 2, 8, 128, 64),
                                                (33, 2, 8, 64, 128)])
def test_unquantised_vs_naive(dtype, t, k, e, hidden, inter):
    torch.manual_seed(t + k + e)
    x = torch.randn(t, hidden, dtype=dtype)
    w1, w2 = _experts(e, hidden, inter, dtype)
    ids, weights = _route(t, k, e)
    got = _run(x, w1, w2, ids, weights, _spec(), out_dtype=dtype)
    assert rel_error(got, _naive(x, w1, w2, ids, weights)) < TOLERANCE[dtype]


@pytest.mark.parametrize("activation", [GEGLU, GEGLU_TANH])
def test_gelu_activations(activation):
    torch.manual_seed(activation)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    w1, w2 = _experts(4, 64, 64, torch.bfloat16)
    ids, weights = _route(7, 2, 4)
    got = _run(x, w1, w2, ids, weights, _spec(activation=activation), out_dtype=torch.float32)
    assert rel_error(got, _naive(x, w1, w2, ids, weights, activation)) < 1e-2


def test_empty_experts_and_all_tokens_to_one_expert():
    torch.manual_seed(1)
    x = torch.randn(33, 64, dtype=torch.bfloat16)
    w1, w2 = _experts(8, 64, 64, torch.bfloat16)
    ids = torch.full((33, 1), 5, dtype=torch.int32)  # 33 rows: three M-blocks, seven experts idle
    weights = torch.rand(33, 1) + 0.1
    got = _run(x, w1, w2, ids, weights, _spec())
    assert rel_error(got, _naive(x, w1, w2, ids, weights)) < 1e-2


def test_expert_parallel_other_ranks_contribute_nothing():
    torch.manual_seed(2)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    w1, w2 = _experts(4, 64, 64, torch.bfloat16)
    ids = torch.randint(0, 12, (7, 2), dtype=torch.int32)  # global ids; local experts 4..7
    ids[0] = torch.tensor([0, 1])  # one token wholly on other ranks: its row must be 0
    weights = torch.rand(7, 2) + 0.1
    got = _run(x, w1, w2, ids, weights, _spec(offset=4))
    assert (got[0] == 0).all()
    assert rel_error(got, _naive(x, w1, w2, ids, weights, offset=4)) < 1e-2


def test_scales_on_input():
    torch.manual_seed(3)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    w1, w2 = _experts(4, 64, 64, torch.bfloat16)
    ids, weights = _route(7, 1, 4)
    got = _run(x, w1, w2, ids, weights, _spec(on_input=True))
    assert rel_error(got, _naive(x, w1, w2, ids, weights, on_input=True)) < 1e-2


@pytest.mark.parametrize("t,hidden,inter", [(7, 128, 128), (33, 192, 64), (70, 128, 64)])
def test_fp8_block_scale_weights(t, hidden, inter):
    """The input quantised in align_kernel's spare programs, and (70 x 2 pairs, past
    ONE_PROGRAM_PAIRS) in align_count_kernel's."""
    torch.manual_seed(t)
    x = torch.randn(t, hidden, dtype=torch.bfloat16)
    q1, s1 = _blocks(torch.randn(4, 2 * inter, hidden) / hidden ** 0.5)
    q2, s2 = _blocks(torch.randn(4, hidden, inter) / inter ** 0.5)
    ids, weights = _route(t, 2, 4)
    got = _run(x, q1, q2, ids, weights, _spec("fp8_block_scale"), s1=s1, s2=s2)
    expected = _naive_w8a8(x, _dequant(q1, s1), _dequant(q2, s2), ids, weights)
    assert rel_error(got, expected) < 1e-2


def test_fp8_block_scale_input_with_1x128_scales():
    torch.manual_seed(4)
    xq, xs = _blocks(torch.randn(7, 128), 1, 128)
    q1, s1 = _blocks(torch.randn(4, 128, 128) / 128 ** 0.5)
    q2, s2 = _blocks(torch.randn(4, 128, 64) / 8.0)
    ids, weights = _route(7, 2, 4)
    got = _run(xq, q1, q2, ids, weights, _spec("fp8_block_scale"), x_scale=xs, s1=s1, s2=s2)
    # the fp8 input is taken as given: re-rounding its dequantised values reproduces it exactly
    expected = _naive_w8a8(_dequant(xq, xs, 1), _dequant(q1, s1), _dequant(q2, s2), ids, weights)
    assert rel_error(got, expected) < 1e-2


def test_fp8_per_tensor():
    torch.manual_seed(5)
    e, hidden, inter = 4, 64, 64
    xq = torch.randn(7, hidden).to(E4M3)
    q1 = torch.randn(e, 2 * inter, hidden).to(E4M3)
    q2 = torch.randn(e, hidden, inter).to(E4M3)
    s1 = torch.rand(e, 2) * 0.02 + 0.01
    s2 = torch.rand(e) * 0.02 + 0.01
    ids, weights = _route(7, 2, e)
    got = _run(xq, q1, q2, ids, weights, _spec("fp8_per_tensor"), s1=s1, s2=s2)
    w1 = torch.cat([q1[:, :inter].double() * s1[:, 0, None, None].double(),
                    q1[:, inter:].double() * s1[:, 1, None, None].double()], dim=1)
    w2 = q2.double() * s2[:, None, None].double()
    assert rel_error(got, _naive(xq, w1, w2, ids, weights)) < 1e-2


def test_public_api_writes_output_in_place():
    torch.manual_seed(6)
    x = torch.randn(7, 64, dtype=torch.float16)
    w1, w2 = _experts(4, 64, 64, torch.float16)
    ids, weights = _route(7, 2, 4)
    out = poison(torch.empty(7, 64, dtype=torch.float16))
    res = cutlass_fused_moe(x, ids, weights, w1, w2, torch.float16, [], output=out,
                            backend="triton")
    assert res[0] is out
    assert rel_error(out, _naive(x, w1, w2, ids, weights)) < TOLERANCE[torch.float16]


# --------------------------------------------------------------------------------------------
# decisions on simulated SMs


@pytest.mark.parametrize("sm", ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"])
@pytest.mark.parametrize("weight", ["bfloat16", "float8_e4m3fn"])
def test_triton_candidate_reasons(sm, weight):
    features = ["fp8_block_scale"] if weight == "float8_e4m3fn" else []
    problem = Problem.make("fused_moe", simulated(None if sm == "cpu" else sm),
                           dtypes={"hidden": "bfloat16", "weight": weight, "out": "bfloat16"},
                           shape={"num_tokens": 128, "hidden_size": 7168,
                                  "intermediate_size": 2048, "num_experts": 256, "top_k": 8},
                           features=features)
    decision = select(problem, assume_installed=True)
    reasons = {r.field for c in decision.candidates if c.name == "triton" for r in c.reasons}
    if sm == "cpu":  # triton runs on the CPU only under TRITON_INTERPRET=1; the reference first
        assert decision.backend == "reference"
        assert reasons == {"device"}
    elif sm == "7.5":
        assert decision.backend == "reference"
        assert reasons == {"sm"}
    elif weight != "bfloat16" and sm in ("8.0", "8.6"):  # fp8 experts: the adapter's SM check
        assert decision.backend == "torch"
        assert reasons == {"sm"}
    else:  # verified on the H200 and faster than torch there: auto picks it first
        assert decision.backend == "triton"
        assert reasons == set()
        assert decision.order == ("triton", "torch", "reference")


# --------------------------------------------------------------------------------------------
# GPU


def _with_descriptors(monkeypatch, run):
    """``run()`` with every launch configuration's ``weights_tma`` set: the weight tiles loaded
    through tensor descriptors (Triton's interpreter emulates them on the CPU)."""
    from flashinfer.backends.triton import moe as tmoe

    chosen = tmoe.launch_config
    with monkeypatch.context() as patch:
        patch.setattr(tmoe, "launch_config",
                      lambda *a: dataclasses.replace(chosen(*a), weights_tma=True))
        assert tmoe.launch_config(7, 4, True, True).weights_tma
        return run()


@pytest.mark.parametrize("t,hidden,inter", [(7, 128, 128), (33, 192, 64), (5, 320, 192)])
def test_fp8_block_scale_weights_through_descriptors(monkeypatch, t, hidden, inter):
    """Bit-identical to the pointer loads (tested against float64 above), with hidden and
    intermediate sizes off the 128 tiles: the descriptors' zero fill past H and the rows of the
    next half or expert in an edge tile (never stored)."""
    torch.manual_seed(t + 40)
    x = torch.randn(t, hidden, dtype=torch.bfloat16)
    q1, s1 = _blocks(torch.randn(4, 2 * inter, hidden) / hidden ** 0.5)
    q2, s2 = _blocks(torch.randn(4, hidden, inter) / inter ** 0.5)
    ids, weights = _route(t, 2, 4)

    def run():
        return _run(x, q1, q2, ids, weights, _spec("fp8_block_scale"), s1=s1, s2=s2)

    assert torch.equal(_with_descriptors(monkeypatch, run), run())


@pytest.mark.parametrize("t,k,e,hidden,inter", [(7, 2, 8, 128, 64), (33, 2, 8, 96, 80)])
def test_unquantised_through_descriptors(monkeypatch, t, k, e, hidden, inter):
    torch.manual_seed(t + 41)
    x = torch.randn(t, hidden, dtype=torch.bfloat16)
    w1, w2 = _experts(e, hidden, inter, torch.bfloat16)
    ids, weights = _route(t, k, e)

    def run():
        return _run(x, w1, w2, ids, weights, _spec(), out_dtype=torch.bfloat16)

    got = _with_descriptors(monkeypatch, run)
    assert torch.equal(got, run())
    assert rel_error(got, _naive(x, w1, w2, ids, weights)) < TOLERANCE[torch.bfloat16]


def test_unaligned_weights_fall_back_to_pointer_loads():
    from flashinfer.backends.triton.moe import LaunchConfig, _weight_descriptors

    cfg = LaunchConfig(16, 128, 64, 128, 4, 1, 4, 1, 8, True)
    w1, w2 = _experts(2, 24, 16, torch.bfloat16)  # 32-byte rows: usable
    assert all(d is not None for d in _weight_descriptors(w1, w2, cfg))
    odd1, odd2 = _experts(2, 20, 12, torch.bfloat16)  # 24-byte rows of w2: not 16-byte multiples
    assert _weight_descriptors(odd1, odd2, cfg) == (None, None)
    assert _weight_descriptors(w1.transpose(1, 2), w2, cfg) == (None, None)  # not packed


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t", [1, 7, 128, 4096])
def test_gpu_unquantised_vs_reference(dtype, t):
    torch.manual_seed(t)
    e, hidden, inter, k = 64, 1024, 256, 8
    x = torch.randn(t, hidden, device="cuda", dtype=dtype)
    w1, w2 = _experts(e, hidden, inter, dtype, "cuda")
    ids, weights = _route(t, k, e, "cuda")
    ref = cutlass_fused_moe(x, ids, weights, w1, w2, dtype, [], backend="reference")[0]
    got = cutlass_fused_moe(x, ids, weights, w1, w2, dtype, [], backend="triton")[0]
    assert rel_error(got, ref) < TOLERANCE[dtype]


def _gpu_fp8_layer(t: int, seed: int):
    """A DeepSeek-like layer scaled down (64 experts, top-8, hidden 1024, intermediate 256) with
    fp8 128x128 experts on the GPU: ``(x, q1, s1, q2, s2, ids, weights)``."""
    torch.manual_seed(seed)
    e, hidden, inter, k = 64, 1024, 256, 8
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
    q1, s1 = _blocks(torch.randn(e, 2 * inter, hidden, device="cuda") / hidden ** 0.5)
    q2, s2 = _blocks(torch.randn(e, hidden, inter, device="cuda") / inter ** 0.5)
    return (x, q1, s1, q2, s2, *_route(t, k, e, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 7, 128, 4096])
def test_gpu_fp8_block_scale_vs_reference(t):
    x, q1, s1, q2, s2, ids, weights = _gpu_fp8_layer(t, t + 1)
    args = (x, ids, weights, q1, q2, torch.bfloat16, [s1, s2])
    ref = cutlass_fused_moe(*args, use_deepseek_fp8_block_scale=True, backend="reference")[0]
    got = cutlass_fused_moe(*args, use_deepseek_fp8_block_scale=True, backend="triton")[0]
    # W8A8: the fp8 rounding of the input and the intermediate, against bf16 activations
    assert rel_error(got, ref) < 8e-2
    expected = _naive_w8a8(x, _dequant(q1, s1), _dequant(q2, s2), ids, weights)
    assert rel_error(got, expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("t", [7, 4096])
def test_gpu_fp8_block_scale_through_descriptors(monkeypatch, t):
    """The descriptor (TMA) loads on the H200 against the pointer loads and float64."""
    x, q1, s1, q2, s2, ids, weights = _gpu_fp8_layer(t, t + 1)

    def run():
        return _run(x, q1, q2, ids, weights, _spec("fp8_block_scale"), s1=s1, s2=s2)

    got = _with_descriptors(monkeypatch, run)
    assert rel_error(got, run()) < 1e-3
    expected = _naive_w8a8(x, _dequant(q1, s1), _dequant(q2, s2), ids, weights)
    assert rel_error(got, expected) < 1e-2


@pytest.mark.gpu
def test_gpu_deterministic_and_graph_capturable():
    torch.manual_seed(9)
    e, hidden, inter, k, t = 32, 512, 256, 4, 300
    x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16)
    w1, w2 = _experts(e, hidden, inter, torch.bfloat16, "cuda")
    ids, weights = _route(t, k, e, "cuda")
    out = torch.empty(t, hidden, device="cuda", dtype=torch.bfloat16)

    def step():
        fused_moe(x, None, w1, None, w2, None, ids, weights, _spec(), out)

    graph = capture_cuda_graph(step)
    ids.copy_(_route(t, k, e, "cuda")[0])  # new routing, same shapes: replay must follow it
    graph.replay()
    torch.cuda.synchronize()
    expected = cutlass_fused_moe(x, ids, weights, w1, w2, torch.bfloat16, [],
                                 backend="reference")[0]
    assert rel_error(out, expected) < 1e-2
    again = out.clone()
    step()  # same inputs again: bit-identical (no atomics)
    assert torch.equal(out, again)
