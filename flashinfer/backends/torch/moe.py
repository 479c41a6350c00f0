"""torch backend for the MoE family: routing in float32 and the experts as sorted, per-expert
matmuls (cuBLAS on CUDA, the CPU BLAS on cpu).

* ``moe_routing`` — the routing table of :mod:`flashinfer.fused_moe.routing` evaluated in float32
  with torch ops (stable sorts, so ties go to the lowest index as in the reference).
* ``fused_moe`` — the ``T * top_k`` (token, slot) pairs are sorted by local expert id (a stable
  argsort of the flat ids; ids of other ranks sort last and are dropped), so each expert's rows
  form one contiguous segment: one gemm1, the gated activation (float32) and one gemm2 per
  non-empty segment, in the compute dtype (the activation dtype; bfloat16 for fp8 experts, whose
  weights are dequantised per 128x128 block or taken as-is for per-tensor scales, which then
  scale the float32 gemm outputs). The results are scattered back to ``[T, top_k, H]`` and
  summed over ``top_k`` in a fixed order (no atomics: deterministic). The segment sizes are read
  on the host (one device sync per call), so the op is not CUDA-graph capturable. Ids no rank
  owns (``spec.ids_fault`` set) are dropped like other ranks' and reported into the device's
  error record with device ops (``reference.moe.report_expert_ids``).

Registered into the ``torch`` adapter's table (``backends/torch/attention.py`` imports this module).
"""

from __future__ import annotations

import torch

from ..reference.moe import expand_blocks, gated, report_expert_ids, routing_weights


def moe_routing(logits, bias, method, top_k, n_group, topk_group, scale, weights_out,
                ids_out) -> None:
    w, ids = routing_weights(logits.float(), None if bias is None else bias.float(), method,
                             top_k, n_group, topk_group, scale)
    weights_out.copy_(w)
    ids_out.copy_(ids)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.bfloat16


def fused_moe(x, x_scale, w1, w1_scale, w2, w2_scale, ids, weights, spec, out) -> None:
    num_tokens, top_k = ids.shape
    num_local, hidden = w1.shape[0], w2.shape[1]
    dtype = _compute_dtype(x)
    block = spec.quant == "fp8_block_scale"
    per_tensor = spec.quant == "fp8_per_tensor"
    report_expert_ids(ids, spec)

    local = ids.reshape(-1).long() - spec.expert_offset
    key = torch.where((local >= 0) & (local < num_local), local, num_local)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=num_local + 1)[:num_local].tolist()
    order = order[: sum(counts)]

    xin = x.to(dtype) if x_scale is None else (
        x.float() * x_scale.float().repeat_interleave(128, -1)[:, :hidden]).to(dtype)
    rows = xin[order // top_k]
    slot_w = weights.reshape(-1)[order].float().unsqueeze(1)
    if spec.scales_on_input:
        rows = (rows.float() * slot_w).to(dtype)
    result = torch.empty((order.numel(), hidden), dtype=torch.float32, device=x.device)
    half = w1.shape[1] // 2
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        w1e, w2e = w1[e], w2[e]
        if block:
            w1e = (w1e.float() * expand_blocks(w1_scale[e].float(), *w1e.shape)).to(dtype)
            w2e = (w2e.float() * expand_blocks(w2_scale[e].float(), *w2e.shape)).to(dtype)
        h = (rows[start:start + n] @ w1e.to(dtype).t()).float()
        if per_tensor:
            h[:, :half] *= w1_scale[e, 0]
            h[:, half:] *= w1_scale[e, 1]
        y = (gated(h, spec.activation).to(dtype) @ w2e.to(dtype).t()).float()
        result[start:start + n] = y * w2_scale[e] if per_tensor else y
        start += n
    if not spec.scales_on_input:
        result *= slot_w
    full = torch.zeros((num_tokens * top_k, hidden), dtype=torch.float32, device=x.device)
    full[order] = result
    out.copy_(full.view(num_tokens, top_k, hidden).sum(1))
