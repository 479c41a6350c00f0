"""Reference MoE kernels: routing and the routed experts, in float64.

Signatures are the canonical ones of :mod:`flashinfer.fused_moe.routing` (``moe_routing``) and
:mod:`flashinfer.fused_moe.core` (``fused_moe``). Top-k is a stable descending sort, so among
equal scores the lowest index wins. The experts are computed expert by expert (the tokens that
chose an expert are gathered; no loop over tokens), everything dequantised to float64, and the
weighted sum is rounded once into ``out``. Pairs whose id is not a local expert are skipped;
with ``spec.ids_fault`` set, ids outside ``[0, spec.num_experts_total)`` are reported into the
device's error record with device ops (:func:`flashinfer.index_checks.report_device`).
"""

from __future__ import annotations

import torch

from ...index_checks import Check, report_device


def stable_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, best first, lowest index among ties."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]


def group_mask(biased: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """DeepSeek-V3 group limit: ``[T, E]`` bool, True for experts in the ``topk_group`` groups
    whose two best (biased) scores sum highest."""
    t, e = biased.shape
    grouped = biased.reshape(t, n_group, e // n_group)
    best_two = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(-1)
    keep = torch.zeros((t, n_group), dtype=torch.bool, device=biased.device)
    keep.scatter_(1, stable_topk(best_two, topk_group), True)
    return keep.repeat_interleave(e // n_group, dim=1)


def routing_weights(logits: torch.Tensor, bias, method: int, top_k: int, n_group: int,
                    topk_group: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) of the routing table in :mod:`flashinfer.fused_moe.routing`, computed in
    the dtype of ``logits`` (the reference passes float64, the torch backend float32)."""
    b = torch.zeros_like(logits[0]) if bias is None else bias.to(logits.dtype)
    if method in (2, 7):  # DeepSeekV3, MiniMax2: bias on the sigmoid scores, selection only
        s = torch.sigmoid(logits)
        select = s + b
        if method == 2 and n_group > 1:
            select = select.masked_fill(~group_mask(select, n_group, topk_group), float("-inf"))
        ids = stable_topk(select, top_k)
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + (1e-20 if method == 7 else 0.0))
        return w * scale, ids
    x = logits + b
    if method in (0, 4):  # Default, RenormalizeNaive
        p = torch.softmax(x, dim=-1)
        ids = stable_topk(p, top_k)
        w = p.gather(1, ids)
        if method == 4:
            w = w / w.sum(-1, keepdim=True)
    elif method in (6, 8):  # SigmoidRenorm, Sigmoid
        s = torch.sigmoid(x)
        ids = stable_topk(s, top_k)
        w = s.gather(1, ids)
        if method == 6:
            w = w / w.sum(-1, keepdim=True)
    else:  # Renormalize, Llama4, TopK, TopKSigmoid: select on the raw (biased) logits
        ids = stable_topk(x, top_k)
        picked = x.gather(1, ids)
        if method == 1:
            w = torch.softmax(picked, dim=-1)
        elif method in (3, 9):
            w = torch.sigmoid(picked)
        else:  # TopK: uniform weights
            w = torch.full_like(picked, 1.0 / top_k)
    return w * scale, ids


def moe_routing(logits, bias, method, top_k, n_group, topk_group, scale, weights_out,
                ids_out) -> None:
    w, ids = routing_weights(logits.double(), None if bias is None else bias.double(), method,
                             top_k, n_group, topk_group, scale)
    weights_out.copy_(w)
    ids_out.copy_(ids)


def expand_blocks(scale: torch.Tensor, rows: int, cols: int, block: int = 128) -> torch.Tensor:
    """``[..., ceil(rows/block), ceil(cols/block)]`` block scales -> ``[..., rows, cols]``."""
    full = scale.repeat_interleave(block, -2).repeat_interleave(block, -1)
    return full[..., :rows, :cols]


def dequant_experts(x, x_scale, w1, w1_scale, w2, w2_scale, quant: str, dtype: torch.dtype):
    """Inputs and expert weights in ``dtype`` with every scale applied. Per-tensor scales act on
    the gemm outputs, which is the same as scaling the weight rows: up rows ``[:I]`` by
    ``w1_scale[:, 0]``, gate rows ``[I:]`` by ``w1_scale[:, 1]``, all of gemm2 by ``w2_scale``."""
    xd, w1d, w2d = x.to(dtype), w1.to(dtype), w2.to(dtype)
    if quant == "fp8_block_scale":
        if x_scale is not None:
            xd = xd * x_scale.to(dtype).repeat_interleave(128, -1)[:, : x.shape[1]]
        w1d = w1d * expand_blocks(w1_scale.to(dtype), w1.shape[1], w1.shape[2])
        w2d = w2d * expand_blocks(w2_scale.to(dtype), w2.shape[1], w2.shape[2])
    elif quant == "fp8_per_tensor":
        half = w1.shape[1] // 2
        s1 = w1_scale.to(dtype)
        w1d = torch.cat([w1d[:, :half] * s1[:, 0, None, None],
                         w1d[:, half:] * s1[:, 1, None, None]], dim=1)
        w2d = w2d * w2_scale.to(dtype)[:, None, None]
    return xd, w1d, w2d


def gated(h: torch.Tensor, activation: int) -> torch.Tensor:
    """``act(gate) * up`` of a gemm1 output ``[n, 2I]``: up is ``[:, :I]``, gate ``[:, I:]``
    (TensorRT-LLM's order: the weight rows are w3 then w1). 3 Swiglu: SiLU; 4 Geglu: erf GELU;
    8 GegluTanh: tanh GELU."""
    half = h.shape[-1] // 2
    up, gate = h[..., :half], h[..., half:]
    if activation == 3:
        act = torch.nn.functional.silu(gate)
    else:
        act = torch.nn.functional.gelu(gate, approximate="tanh" if activation == 8 else "none")
    return act * up


def report_expert_ids(ids: torch.Tensor, spec) -> None:
    """Merge the ids outside ``[0, spec.num_experts_total)`` into the device's error record
    under ``spec.ids_fault`` (device ops, no sync); nothing when the ids are trusted."""
    if spec.ids_fault is None or ids.numel() == 0:
        return
    flat = ids.reshape(-1)
    total = spec.num_experts_total
    report_device(Check(spec.ids_fault, (flat < 0) | (flat >= total), flat, total))


def fused_moe(x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, spec, out) -> None:
    report_expert_ids(ids, spec)
    xd, w1d, w2d = dequant_experts(x, x_scale, w1, w1_scale, w2, w2_scale, spec.quant,
                                   torch.float64)
    acc = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float64, device=x.device)
    local = ids.long() - spec.expert_offset
    for e in torch.unique(local).tolist():
        if not 0 <= e < w1.shape[0]:
            continue
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        w = weights[tok, slot].double().unsqueeze(1)
        inp = xd[tok] * w if spec.scales_on_input else xd[tok]
        y = gated(inp @ w1d[e].t(), spec.activation) @ w2d[e].t()
        acc.index_add_(0, tok, y if spec.scales_on_input else y * w)
    out.copy_(acc)
