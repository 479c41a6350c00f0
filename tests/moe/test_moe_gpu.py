"""Fused MoE on CUDA: the torch backend against the reference (DeepSeek-V3-like, scaled down)."""

import pytest
import torch

from conftest import TOLERANCE, rel_error
from flashinfer.fused_moe import (RoutingMethodType, cutlass_fused_moe, trtllm_bf16_moe,
                                  trtllm_fp8_block_scale_moe)
from flashinfer.fused_moe.routing import route

pytestmark = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn


def _blocks(w: torch.Tensor, rows: int = 128, cols: int = 128):
    """fp8 e4m3 and float32 block scales (last two dims multiples of the block)."""
    *lead, r, c = w.shape
    b = w.float().reshape(*lead, r // rows, rows, c // cols, cols)
    scale = b.abs().amax(dim=(-3, -1)).clamp_min(1e-12) / 448.0
    q = (b / scale[..., :, None, :, None]).reshape(*lead, r, c).to(E4M3)
    return q, scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 7, 128, 1000])
def test_cutlass_torch_vs_reference(dtype, m):
    torch.manual_seed(m)
    e, hidden, inter, k = 64, 1024, 256, 8
    x = torch.randn(m, hidden, device="cuda", dtype=dtype)
    w1 = (torch.randn(e, 2 * inter, hidden, device="cuda") / hidden ** 0.5).to(dtype)
    w2 = (torch.randn(e, hidden, inter, device="cuda") / inter ** 0.5).to(dtype)
    logits = torch.randn(m, e, device="cuda")
    weights, ids = route(logits, None, RoutingMethodType.Renormalize, k, backend="reference")
    ref = cutlass_fused_moe(x, ids, weights, w1, w2, dtype, [], backend="reference")[0]
    got = cutlass_fused_moe(x, ids, weights, w1, w2, dtype, [], backend="torch")[0]
    assert rel_error(got, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("m", [7, 128])
def test_routing_torch_vs_reference_deepseek(m):
    torch.manual_seed(m)
    logits = torch.randn(m, 256, device="cuda")
    bias = torch.randn(256, device="cuda") * 0.1
    w_ref, ids_ref = route(logits, bias, RoutingMethodType.DeepSeekV3, 8, 8, 4, 2.5,
                           backend="reference")
    w, ids = route(logits, bias, RoutingMethodType.DeepSeekV3, 8, 8, 4, 2.5, backend="torch")
    same = (ids == ids_ref).all(dim=1)
    assert same.float().mean() > 0.99  # float32 vs float64 may reorder a near tie
    torch.testing.assert_close(w[same], w_ref[same], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m", [1, 128, 4096])
def test_fp8_block_scale_deepseek_like(m):
    torch.manual_seed(m + 1)
    e, hidden, inter, k = 64, 1024, 256, 8
    x = torch.randn(m, hidden, device="cuda")
    xq, xs = _blocks(x, 1, 128)
    q1, s1 = _blocks(torch.randn(e, 2 * inter, hidden, device="cuda") / hidden ** 0.5)
    q2, s2 = _blocks(torch.randn(e, hidden, inter, device="cuda") / inter ** 0.5)
    logits = torch.randn(m, e, device="cuda")
    bias = torch.randn(e, device="cuda") * 0.1
    args = (logits, bias, xq, xs.t().contiguous(), q1, s1, q2, s2, e, k, 8, 4, inter, 0, e, 2.5)
    ref = trtllm_fp8_block_scale_moe(*args, routing_method_type=RoutingMethodType.DeepSeekV3,
                                     backend="reference")
    got = trtllm_fp8_block_scale_moe(*args, routing_method_type=RoutingMethodType.DeepSeekV3,
                                     backend="torch")
    # routing is decided per backend: a float32/float64 near tie may change a token's experts
    assert rel_error(got, ref) < 2 * TOLERANCE[torch.bfloat16]


def test_bf16_moe_with_idle_experts_auto():
    torch.manual_seed(5)
    m, e, hidden, inter, k = 128, 32, 512, 128, 2
    x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
    w1 = (torch.randn(e, 2 * inter, hidden, device="cuda") / hidden ** 0.5).bfloat16()
    w2 = (torch.randn(e, hidden, inter, device="cuda") / inter ** 0.5).bfloat16()
    logits = torch.randn(m, e, device="cuda")
    logits[:, e // 2:] -= 100.0  # half the experts never chosen
    kwargs = dict(routing_method_type=RoutingMethodType.Renormalize, use_shuffled_weight=False,
                  weight_layout=0)
    ref = trtllm_bf16_moe(logits, None, x, w1, w2, e, k, None, None, inter, 0, e,
                          backend="reference", **kwargs)
    got = trtllm_bf16_moe(logits, None, x, w1, w2, e, k, None, None, inter, 0, e, **kwargs)
    assert rel_error(got, ref) < TOLERANCE[torch.bfloat16]
