"""MoE routing: every RoutingMethodType against a float64 per-token naive, ties, bad input."""

import math

import pytest
import torch

from flashinfer.fused_moe import RoutingMethodType as R
from flashinfer.fused_moe import fused_topk_deepseek
from flashinfer.fused_moe.routing import route

BACKENDS = ["reference", "torch"]


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _top(scores: list, k: int, allowed=None) -> list:
    """k best indices, best first; among equal scores the lowest index."""
    idx = [i for i in range(len(scores)) if allowed is None or i in allowed]
    return sorted(idx, key=lambda i: (-scores[i], i))[:k]


def naive_route(logits, bias, method, k, n_group=1, topk_group=1, scale=1.0):
    """Per-token float64 routing written from the method table (not the library code)."""
    ids_all, w_all = [], []
    for row in logits.double().tolist():
        e = len(row)
        b = [0.0] * e if bias is None else bias.double().tolist()
        x = [row[i] + b[i] for i in range(e)]
        if method in (R.DeepSeekV3, R.MiniMax2):
            s = [_sig(v) for v in row]
            sel = [s[i] + b[i] for i in range(e)]
            allowed = None
            if method == R.DeepSeekV3:
                size = e // n_group
                gscore = [sum(sorted(sel[g * size:(g + 1) * size], reverse=True)[:2])
                          for g in range(n_group)]
                groups = _top(gscore, topk_group)
                allowed = {g * size + j for g in groups for j in range(size)}
            ids = _top(sel, k, allowed)
            total = sum(s[i] for i in ids) + (1e-20 if method == R.MiniMax2 else 0.0)
            w = [s[i] / total for i in ids]
        elif method in (R.Default, R.RenormalizeNaive):
            m = max(x)
            z = sum(math.exp(v - m) for v in x)
            p = [math.exp(v - m) / z for v in x]
            ids = _top(p, k)
            w = [p[i] for i in ids]
            if method == R.RenormalizeNaive:
                w = [v / sum(w) for v in w]
        elif method in (R.SigmoidRenorm, R.Sigmoid):
            s = [_sig(v) for v in x]
            ids = _top(s, k)
            w = [s[i] for i in ids]
            if method == R.SigmoidRenorm:
                w = [v / sum(w) for v in w]
        else:
            ids = _top(x, k)
            if method == R.Renormalize:
                m = max(x[i] for i in ids)
                z = sum(math.exp(x[i] - m) for i in ids)
                w = [math.exp(x[i] - m) / z for i in ids]
            elif method in (R.Llama4, R.TopKSigmoid):
                w = [_sig(x[i]) for i in ids]
            else:  # TopK
                w = [1.0 / k] * k
        ids_all.append(ids)
        w_all.append([v * scale for v in w])
    return torch.tensor(w_all, dtype=torch.float64), torch.tensor(ids_all, dtype=torch.int32)


METHODS = [R.Default, R.Renormalize, R.RenormalizeNaive, R.TopK, R.SigmoidRenorm, R.MiniMax2,
           R.Sigmoid, R.TopKSigmoid]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_methods_match_naive(backend, method, with_bias):
    torch.manual_seed(int(method) * 2 + with_bias)
    logits = torch.randn(9, 16)
    bias = torch.randn(16) * 0.3 if with_bias else None
    w, ids = route(logits, bias, method, 4, routed_scaling_factor=1.5, backend=backend)
    w_ref, ids_ref = naive_route(logits, bias, method, 4, scale=1.5)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_llama4_top1_sigmoid(backend):
    torch.manual_seed(1)
    logits = torch.randn(7, 16)
    w, ids = route(logits, None, R.Llama4, 1, backend=backend)
    w_ref, ids_ref = naive_route(logits, None, R.Llama4, 1)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("e,n_group,topk_group,k", [(64, 8, 4, 8), (32, 4, 2, 2), (16, 1, 1, 4)])
def test_deepseek_v3(backend, e, n_group, topk_group, k):
    torch.manual_seed(e + k)
    logits = torch.randn(11, e)
    bias = torch.randn(e) * 0.2
    w, ids = route(logits, bias, R.DeepSeekV3, k, n_group, topk_group, 2.5, backend=backend)
    w_ref, ids_ref = naive_route(logits, bias, R.DeepSeekV3, k, n_group, topk_group, 2.5)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)
    # weights come from the un-biased sigmoid and sum to routed_scaling_factor
    torch.testing.assert_close(w.double().sum(1), torch.full((11,), 2.5, dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_logits(backend):
    torch.manual_seed(3)
    logits = torch.randn(5, 32).bfloat16()
    w, ids = route(logits, None, R.Renormalize, 8, backend=backend)
    w_ref, ids_ref = naive_route(logits.float(), None, R.Renormalize, 8)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS + [R.DeepSeekV3])
def test_ties_lowest_index_wins(backend, method):
    logits = torch.zeros(3, 16)
    logits[1, [9, 3, 12]] = 2.0  # three-way tie at the top
    logits[2, 5] = -1.0
    bias = torch.zeros(16) if method == R.DeepSeekV3 else None
    n_group, topk_group = (4, 2) if method == R.DeepSeekV3 else (None, None)
    w, ids = route(logits, bias, method, 4, n_group, topk_group, backend=backend)
    if method == R.DeepSeekV3:  # equal groups: groups 0 and 1 stay, then ids by index
        assert ids[0].tolist() == [0, 1, 2, 3]
        assert ids[2].tolist() == [0, 1, 2, 3]
    else:
        assert ids[0].tolist() == [0, 1, 2, 3]
        assert ids[1].tolist() == [3, 9, 12, 0]
        assert ids[2].tolist() == [0, 1, 2, 3]
    w_ref, ids_ref = naive_route(logits, bias, method, 4, n_group or 1, topk_group or 1)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_topk_prob_false_skips_renormalisation(backend):
    torch.manual_seed(4)
    logits = torch.randn(6, 16)
    w, ids = route(logits, None, R.RenormalizeNaive, 3, norm_topk_prob=False, backend=backend)
    w_ref, ids_ref = naive_route(logits, None, R.Default, 3)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.double(), w_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_topk_deepseek_in_place(dtype):
    torch.manual_seed(5)
    scores = torch.randn(10, 64).to(dtype)
    bias = (torch.randn(64) * 0.1).to(dtype)
    values = torch.full((10, 8), float("nan"), dtype=dtype)
    indices = torch.full((10, 8), -1, dtype=torch.int32)
    replay = torch.full((12, 8), -1, dtype=torch.int16)
    assert fused_topk_deepseek(scores, bias, 8, 4, 8, 2.5, values, indices,
                               routing_replay_out=replay) is None
    w_ref, ids_ref = naive_route(scores.float(), bias.float(), R.DeepSeekV3, 8, 8, 4, 2.5)
    assert torch.equal(indices, ids_ref)
    torch.testing.assert_close(values.double(), w_ref, rtol=1e-2 if dtype == torch.bfloat16
                               else 1e-5, atol=1e-5)
    assert torch.equal(replay[:10].int(), ids_ref) and (replay[10:] == -1).all()


def _route_error(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        route(*args, **kwargs)


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((torch.randn(4, 8), None, 10, 2), {}, ValueError, "routing_method_type"),
    ((torch.randn(4, 8), None, 42, 2), {}, ValueError, "routing_method_type"),
    ((torch.randn(4, 8), None, R.Default, 9), {}, ValueError, "top_k"),
    ((torch.randn(4, 8), None, R.Default, 0), {}, ValueError, "top_k"),
    ((torch.randn(4, 8), None, R.Llama4, 2), {}, ValueError, "top_k"),
    ((torch.randn(4, 8), None, R.DeepSeekV3, 2, 2, 1), {}, ValueError, "routing_bias"),
    ((torch.randn(4, 8), torch.zeros(8), R.DeepSeekV3, 2, 3, 1), {}, ValueError, "n_group"),
    ((torch.randn(4, 8), torch.zeros(8), R.DeepSeekV3, 2, 2, 3), {}, ValueError, "topk_group"),
    ((torch.randn(4, 8), torch.zeros(8), R.DeepSeekV3, 2, None, 1), {}, ValueError, "n_group"),
    ((torch.randn(4, 8), torch.zeros(8), R.DeepSeekV3, 6, 4, 1), {}, ValueError, "top_k"),
    ((torch.randn(4, 8), torch.zeros(7), R.Default, 2), {}, ValueError, "routing_bias"),
    ((torch.randn(4, 8, 2), None, R.Default, 2), {}, ValueError, "routing_logits"),
    ((torch.randint(0, 5, (4, 8)), None, R.Default, 2), {}, ValueError, "routing_logits"),
    (([[1.0]], None, R.Default, 1), {}, TypeError, "routing_logits"),
    ((torch.randn(4, 8), None, R.Default, 2), {"routed_scaling_factor": "x"}, ValueError,
     "routed_scaling_factor"),
])
def test_invalid_routing_arguments(args, kwargs, exc, match):
    _route_error(exc, match, *args, **kwargs)


def _dsv3_call(**over):
    args = dict(scores=torch.randn(4, 64), bias=torch.zeros(64), n_group=8, topk_group=4,
                topk=8, routed_scaling_factor=1.0, topk_values=torch.empty(4, 8),
                topk_indices=torch.empty(4, 8, dtype=torch.int32))
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    ({"topk": 9, "topk_values": torch.empty(4, 9),
      "topk_indices": torch.empty(4, 9, dtype=torch.int32)}, "topk"),
    ({"scores": torch.randn(4, 640), "bias": torch.zeros(640), "n_group": 1, "topk_group": 1},
     "num_experts"),
    ({"scores": torch.randn(4, 512), "bias": torch.zeros(512)}, "num_experts / n_group"),
    ({"topk_values": torch.empty(4, 8, dtype=torch.bfloat16)}, "topk_values"),
    ({"topk_indices": torch.empty(4, 8, dtype=torch.int64)}, "topk_indices"),
    ({"topk_values": torch.empty(3, 8)}, "topk_values"),
])
def test_invalid_fused_topk_deepseek(over, match):
    with pytest.raises(ValueError, match=match):
        fused_topk_deepseek(**_dsv3_call(**over))


def test_fused_topk_deepseek_cake_backend_rejected():
    with pytest.raises(ValueError, match="cake"):
        fused_topk_deepseek(**_dsv3_call(), backend="cake")


def test_routing_replay_out_checked():
    with pytest.raises(ValueError, match="routing_replay_out"):
        fused_topk_deepseek(**_dsv3_call(), routing_replay_out=torch.empty(4, 8,
                                                                           dtype=torch.int32))
