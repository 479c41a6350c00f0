"""Fused MoE, reference and torch backends, against a naive per-token float64 loop."""

import pytest
import torch

from conftest import TOLERANCE, poison, rel_error
from flashinfer.fused_moe import (ActivationType, RoutingMethodType, cutlass_fused_moe,
                                  trtllm_bf16_moe, trtllm_fp8_block_scale_moe,
                                  trtllm_fp8_per_tensor_scale_moe)

BACKENDS = ["reference", "torch"]
E4M3 = torch.float8_e4m3fn


def _act(gate: torch.Tensor, activation: int) -> torch.Tensor:
    if activation == ActivationType.Swiglu:
        return gate * torch.sigmoid(gate)
    if activation == ActivationType.Geglu:
        return 0.5 * gate * (1 + torch.erf(gate / 2 ** 0.5))
    inner = (2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate ** 3)
    return 0.5 * gate * (1 + torch.tanh(inner))


def naive_moe(x, ids, weights, w1, w2, activation=ActivationType.Swiglu, offset=0,
              on_input=False):
    """Per-token, per-slot loop in float64: w1 rows [:I] are "up", [I:] the gate (TRT-LLM)."""
    x, w1, w2 = x.double(), w1.double(), w2.double()
    inter = w1.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - offset
            if not 0 <= e < w1.shape[0]:
                continue
            wt = float(weights[t, j])
            inp = x[t] * wt if on_input else x[t]
            h = w1[e] @ inp
            y = w2[e] @ (_act(h[inter:], activation) * h[:inter])
            out[t] += y if on_input else wt * y
    return out


def quant_blocks(w: torch.Tensor, rows: int = 128, cols: int = 128):
    """fp8 e4m3 with one float32 scale per (rows x cols) block of the last two dims."""
    *lead, r, c = w.shape
    rb, cb = -(-r // rows), -(-c // cols)
    padded = torch.zeros(*lead, rb * rows, cb * cols, dtype=torch.float32)
    padded[..., :r, :c] = w.float()
    blocks = padded.reshape(*lead, rb, rows, cb, cols)
    amax = blocks.abs().amax(dim=(-3, -1)).clamp_min(1e-12)
    scale = amax / 448.0
    q = (blocks / scale[..., :, None, :, None]).reshape(*lead, rb * rows, cb * cols)
    return q[..., :r, :c].to(E4M3), scale


def dequant_blocks(q: torch.Tensor, scale: torch.Tensor, rows: int = 128, cols: int = 128):
    full = scale.repeat_interleave(rows, -2).repeat_interleave(cols, -1)
    return q.double() * full[..., : q.shape[-2], : q.shape[-1]].double()


def _experts(e, hidden, inter, dtype, seed):
    torch.manual_seed(seed)
    w1 = (torch.randn(e, 2 * inter, hidden) / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(e, hidden, inter) / inter ** 0.5).to(dtype)
    return w1, w2


def _routing(m, e, k, seed, skip=()):
    """Random distinct experts per token (never those in ``skip``) and positive weights."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(e) if i not in skip])
    ids = torch.stack([allowed[torch.randperm(len(allowed), generator=g)[:k]] for _ in range(m)])
    weights = torch.rand(m, k, generator=g) + 0.1
    return ids.int(), weights


def _tol(dtype, backend):
    return TOLERANCE[dtype] * (2 if backend == "torch" else 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("m", [1, 7, 128])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_cutlass_bf16_sizes_and_topk(backend, m, k):
    e, hidden, inter = 8, 64, 32
    w1, w2 = _experts(e, hidden, inter, torch.bfloat16, m * 10 + k)
    x = torch.randn(m, hidden).bfloat16()
    ids, weights = _routing(m, e, k, m + k, skip=(5,) if k < 8 else ())  # expert 5 idle
    out = poison(torch.empty(m, hidden, dtype=torch.bfloat16))
    res = cutlass_fused_moe(x, ids, weights, w1, w2, torch.bfloat16, [], output=out,
                            backend=backend)
    assert isinstance(res, list) and len(res) == 1 and res[0] is out
    assert rel_error(out, naive_moe(x, ids, weights, w1, w2)) < _tol(torch.bfloat16, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("activation", [ActivationType.Swiglu, ActivationType.Geglu,
                                        ActivationType.GegluTanh])
def test_cutlass_dtypes_and_activations(backend, dtype, activation):
    m, e, hidden, inter, k = 7, 4, 32, 16, 2
    w1, w2 = _experts(e, hidden, inter, dtype, int(activation))
    x = torch.randn(m, hidden).to(dtype)
    ids, weights = _routing(m, e, k, 3)
    out = cutlass_fused_moe(x, ids, weights, w1, w2, dtype, [], activation_type=activation,
                            backend=backend)[0]
    expected = naive_moe(x, ids, weights, w1, w2, activation)
    assert rel_error(out, expected) < _tol(dtype, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_tokens_to_one_expert_and_expert_parallel(backend):
    m, e, hidden, inter = 16, 4, 32, 16
    w1, w2 = _experts(e, hidden, inter, torch.bfloat16, 9)
    x = torch.randn(m, hidden).bfloat16()
    ids = torch.full((m, 1), 6, dtype=torch.int32)  # global expert 6 = local 2 on ep_rank 1
    weights = torch.rand(m, 1) + 0.5
    out = cutlass_fused_moe(x, ids, weights, w1, w2, torch.float32, [], ep_size=2, ep_rank=1,
                            backend=backend)[0]
    expected = naive_moe(x, ids, weights, w1, w2, offset=4)
    assert rel_error(out, expected) < _tol(torch.bfloat16, backend)
    # rank 0 owns none of the chosen experts: a zero partial sum
    out0 = cutlass_fused_moe(x, ids, weights, w1, w2, torch.float32, [], ep_size=2, ep_rank=0,
                             backend=backend)[0]
    assert torch.equal(out0, torch.zeros_like(out0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hidden,inter", [(256, 128), (192, 96)])  # second: partial blocks
def test_cutlass_deepseek_fp8_block_scale(backend, hidden, inter):
    m, e, k = 7, 4, 2
    w1, w2 = _experts(e, hidden, inter, torch.float32, hidden)
    (q1, s1), (q2, s2) = quant_blocks(w1), quant_blocks(w2)
    x = torch.randn(m, hidden).bfloat16()
    ids, weights = _routing(m, e, k, 5)
    out = cutlass_fused_moe(x, ids, weights, q1, q2, torch.bfloat16, [s1, s2],
                            use_deepseek_fp8_block_scale=True, backend=backend)[0]
    expected = naive_moe(x, ids, weights, dequant_blocks(q1, s1), dequant_blocks(q2, s2))
    assert rel_error(out, expected) < _tol(torch.bfloat16, backend)


def _route_naive(logits, k):  # Renormalize: top-k of the logits, softmax over them
    vals, ids = torch.sort(logits.double(), dim=-1, descending=True, stable=True)
    return ids[:, :k].int(), torch.softmax(vals[:, :k], dim=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trtllm_bf16_moe(backend):
    m, e, hidden, inter, k = 7, 8, 64, 32, 2
    w1, w2 = _experts(e, hidden, inter, torch.bfloat16, 11)
    x = torch.randn(m, hidden).bfloat16()
    logits = torch.randn(m, e)
    out = trtllm_bf16_moe(logits, None, x, w1, w2, e, k, None, None, inter, 0, e,
                          routing_method_type=RoutingMethodType.Renormalize,
                          use_shuffled_weight=False, weight_layout=0, backend=backend)
    ids, weights = _route_naive(logits, k)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert rel_error(out, naive_moe(x, ids, weights, w1, w2)) < _tol(torch.bfloat16, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp8_input", [True, False])
def test_trtllm_fp8_block_scale_deepseek(backend, fp8_input):
    m, e, hidden, inter, k = 7, 16, 256, 128, 4
    w1, w2 = _experts(e, hidden, inter, torch.float32, 12)
    (q1, s1), (q2, s2) = quant_blocks(w1), quant_blocks(w2)
    x = torch.randn(m, hidden)
    if fp8_input:
        xq, xs = quant_blocks(x, 1, 128)
        hidden_states, hidden_scale, x_ref = xq, xs.t().contiguous(), dequant_blocks(xq, xs, 1)
    else:
        hidden_states = x.bfloat16()
        hidden_scale, x_ref = torch.empty(0), hidden_states
    logits, bias = torch.randn(m, e), torch.randn(e) * 0.1
    out = trtllm_fp8_block_scale_moe(logits, bias, hidden_states, hidden_scale, q1, s1, q2, s2,
                                     e, k, 4, 2, inter, 0, e, 2.5,
                                     routing_method_type=RoutingMethodType.DeepSeekV3,
                                     backend=backend)
    s = torch.sigmoid(logits.double())
    sel = s + bias.double()
    groups = sel.view(m, 4, 4).sort(-1, descending=True).values[..., :2].sum(-1)
    keep = torch.zeros(m, 4, dtype=torch.bool)
    keep.scatter_(1, groups.sort(dim=-1, descending=True, stable=True).indices[:, :2], True)
    sel = sel.masked_fill(~keep.repeat_interleave(4, 1), float("-inf"))
    ids = sel.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    weights = s.gather(1, ids) / s.gather(1, ids).sum(-1, keepdim=True) * 2.5
    expected = naive_moe(x_ref, ids, weights, dequant_blocks(q1, s1), dequant_blocks(q2, s2))
    assert rel_error(out, expected) < _tol(torch.bfloat16, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on_input", [False, True])
def test_trtllm_fp8_per_tensor(backend, on_input):
    m, e, hidden, inter = 7, 4, 64, 32
    w1, w2 = _experts(e, hidden, inter, torch.float32, 13)
    s_w1 = w1.abs().amax(dim=(1, 2)) / 448
    s_w2 = w2.abs().amax(dim=(1, 2)) / 448
    q1, q2 = (w1 / s_w1[:, None, None]).to(E4M3), (w2 / s_w2[:, None, None]).to(E4M3)
    x = torch.randn(m, hidden)
    s_x = x.abs().amax() / 448
    xq = (x / s_x).to(E4M3)
    gate_scale = s_w1 * s_x
    up_scale = gate_scale * 1.25  # upstream folds the intermediate's requant scale here
    out2 = s_w2 / 1.25
    logits = torch.randn(m, e)
    out = trtllm_fp8_per_tensor_scale_moe(logits, None, xq, q1, up_scale, gate_scale, q2, out2,
                                          e, 1, None, None, inter, 0, e, None, on_input,
                                          routing_method_type=RoutingMethodType.Llama4,
                                          backend=backend)
    ids = logits.argmax(-1, keepdim=True).int()
    weights = torch.sigmoid(logits.double().gather(1, ids.long()))
    w1_ref = q1.double() * gate_scale.double()[:, None, None]
    w1_ref[:, :inter] *= 1.25
    w2_ref = q2.double() * out2.double()[:, None, None]
    expected = naive_moe(xq.double(), ids, weights, w1_ref, w2_ref, on_input=on_input)
    assert rel_error(out, expected) < _tol(torch.bfloat16, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_experts_subset(backend):
    m, e_total, e_local, hidden, inter, k = 16, 8, 4, 32, 16, 2
    w1, w2 = _experts(e_local, hidden, inter, torch.bfloat16, 14)
    x = torch.randn(m, hidden).bfloat16()
    logits = torch.randn(m, e_total)
    out = trtllm_bf16_moe(logits, None, x, w1, w2, e_total, k, None, None, inter, 4, e_local,
                          routing_method_type=RoutingMethodType.Renormalize,
                          use_shuffled_weight=False, weight_layout=0, backend=backend)
    ids, weights = _route_naive(logits, k)
    expected = naive_moe(x, ids, weights, w1, w2, offset=4)
    assert rel_error(out, expected) < _tol(torch.bfloat16, backend)
