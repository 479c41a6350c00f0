"""torch adapter: attention kernels built into PyTorch's CUDA build.

Two variants serve ``single_decode`` and ``single_prefill`` (capability_db/torch.toml):

* ``flash_varlen`` — ``torch.ops.aten._flash_attention_forward``, the FlashAttention-2 copy inside
  torch, called in its varlen form (``cum_seq_q = [0, qo_len]``). GQA native; ``is_causal`` is
  bottom-right aligned; ``window_size_left`` gives the left window (``window_size_right`` is set
  to 0 by torch itself when causal). The lse comes back as ``[H_qo, total_q]`` natural log,
  ``+inf`` for a row that sees no key. No ALiBi: torch 2.11's FA2 build raises "This flash
  attention build does not support alibi" (seen on the H200), so the record does not declare it.
* ``sdpa_efficient`` — ``torch.ops.aten._scaled_dot_product_efficient_attention``, the
  memory-efficient (CUTLASS) kernel that ``scaled_dot_product_attention`` runs under
  ``sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)``, called directly because only the aten op
  returns the lse. Its ``is_causal`` is top-left aligned, so every mask (causal bottom-right,
  window, custom mask) and ALiBi go in an explicit additive bias in q's dtype; a plain causal
  call with ``qo_len == kv_len`` and no GQA uses ``is_causal``. GQA: each kv head's query group is
  folded into the query length (``[1, H_kv, group * qo_len, D]``), so K/V are never expanded.
  ALiBi is written relative to each row's right-most visible key, so the bias is small exactly
  where the softmax weight is (16-bit rounding of large biases would otherwise cost accuracy),
  and the per-row shift is added back to the lse. bfloat16 needs SM 8.0 (adapter check).

``flash_varlen`` also plans ``batch_prefill_ragged`` (:func:`plan_ragged`): the same varlen call
with ``cum_seq_q = plan.qo_indptr`` and ``cum_seq_k = plan.kv_indptr`` (the plan's device
buffers, so a CUDA graph replays whatever the wrapper wrote there), ``max_q``/``max_k`` from the
plan; ``q_scale * k_scale`` go into the softmax scale, ``v_scale`` multiplies the output. A left
window is only declared together with causal: without it FA2 clamps the right edge of a window to
``max_k`` keys past the diagonal, which hides keys from rows of a request with more queries than
``max_k + 1`` keys (not what the contract says). No paged op: torch 2.11's op has no block_table.

Both return natural-log lse; the adapter converts to base 2 and gives rows that see no key
output 0 and lse ``-inf``. The aten entry points are reached through ``aten_flash`` and
``aten_efficient`` (the ops' default overloads), and their schemas are probed once, so a torch
whose op lacks an argument we need is a rejection with a reason, not a crash.
"""

from __future__ import annotations

import functools
import math

import torch

from ...attention.params import AttentionParams
from ...attention.batch_params import BatchPlan, KVInput, RunScales
from ...reasons import Reason
from ..reference.attention import visible_keys


_LOG2E = 1.0 / math.log(2.0)


# ------------------------------------------------------------------------------------------
# aten entry points and their schemas


def _overload(name: str):
    """``torch.ops.aten.<name>.default`` (calling the overload skips the packet's overload
    resolution, ~1 us a call), or a function raising what the missing op would."""
    try:
        return getattr(torch.ops.aten, name).default
    except (AttributeError, RuntimeError) as err:
        def missing(*args, _err=err, **kwargs):
            raise RuntimeError(f"torch {torch.__version__} has no aten.{name}") from _err
        return missing


aten_flash = _overload("_flash_attention_forward")


aten_efficient = _overload("_scaled_dot_product_efficient_attention")


@functools.lru_cache(maxsize=None)
def schema_arguments(op_name: str) -> frozenset[str] | None:
    """Argument names of ``torch.ops.aten.<op_name>.default`` (``None`` if the op is missing)."""
    try:
        schema = getattr(torch.ops.aten, op_name).default._schema
    except (AttributeError, RuntimeError):
        return None
    return frozenset(arg.name for arg in schema.arguments)


def _schema_reasons(op_name: str, needed: set[str]) -> list[Reason]:
    names = schema_arguments(op_name)
    if names is None:
        return [Reason("torch_op", op_name, "present",
                       f"torch {torch.__version__} has no aten.{op_name}")]
    missing = sorted(needed - names)
    if missing:
        return [Reason("torch_op", ",".join(missing), "present",
                       f"torch {torch.__version__}: aten.{op_name} has no argument(s) "
                       f"{', '.join(missing)}")]
    return []


# ------------------------------------------------------------------------------------------
# shared helpers


def aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its last dim is contiguous and every other stride and the base address are
    16-byte aligned (what the vectorised loads of both kernels need), else a fresh contiguous
    copy (a fresh allocation is aligned; ``contiguous()`` would keep a misaligned base)."""
    if t.data_ptr() % 16 == 0 and t.is_contiguous() and t.shape[-1] * t.element_size() % 16 == 0:
        return t  # the steady state: every stride of a contiguous tensor is a multiple of the row
    elems = max(1, 16 // t.element_size())
    ok = (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
          and all(s % elems == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1))
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def aligned_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """:func:`aligned` of all three, with the steady state checked at once: contiguous tensors
    at 16-byte aligned addresses are kept (the kernels' 16-bit dtypes and head dims that are
    multiples of 8 make each of their rows 16-byte aligned)."""
    if (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
            and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0):
        return q, k, v
    return aligned(q), aligned(k), aligned(v)


def finish_lse(lse_nat: torch.Tensor) -> torch.Tensor:
    """Natural-log lse ``[H, qo_len]`` (``+inf`` or ``-inf`` for empty rows) -> base 2 ``[qo_len, H]``."""
    lse = lse_nat.t() * _LOG2E
    return lse.masked_fill(lse == float("inf"), float("-inf")).contiguous()


# ------------------------------------------------------------------------------------------
# flash_varlen


def flash_reasons(problem) -> list[Reason]:
    needed = {"scale"}
    if "window" in problem.features:
        needed.add("window_size_left")
    return _schema_reasons("_flash_attention_forward", needed)


_CU_SEQLENS: dict[tuple[torch.device, int], torch.Tensor] = {}


def cu_seqlens(device: torch.device, length: int) -> torch.Tensor:
    """``[0, length]`` int32 on ``device``; cached (two kernel launches saved per call), except
    while a CUDA graph is being captured, where a cached tensor would live in the graph's pool."""
    key = (device, length)
    cached = _CU_SEQLENS.get(key)
    if cached is not None:
        return cached
    tensor = torch.arange(2, dtype=torch.int32, device=device) * length
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        if len(_CU_SEQLENS) >= 1024:
            _CU_SEQLENS.clear()
        _CU_SEQLENS[key] = tensor
    return tensor


class FlashVarlen:
    """The single-request kernel (``kernel(q, k, v, params)``, :mod:`...attention.params`)
    through aten's FA2 varlen entry with one sequence, and its prepared form."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 params: AttentionParams):
        return self.prepare(params, q.shape[0], k.shape[0], q.device)(q, k, v)

    @staticmethod
    def prepare(params: AttentionParams, qo_len: int, kv_len: int, device: torch.device):
        cu_q, cu_k = cu_seqlens(device, qo_len), cu_seqlens(device, kv_len)
        is_causal = bool(params.causal or qo_len == 1)  # one query row sees every key either way
        kwargs = {"scale": params.sm_scale}
        if 0 <= params.window_left < kv_len:
            kwargs["window_size_left"] = params.window_left
        o_dtype, return_lse = params.o_dtype, params.return_lse

        def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            q, k, v = aligned_qkv(q, k, v)
            result = aten_flash(q, k, v, cu_q, cu_k, qo_len, kv_len, 0.0, is_causal, False,
                                **kwargs)
            out = result[0]  # [qo_len, H, Dv] like q
            if out.dim() != 3:
                out = out.reshape(qo_len, q.shape[1], -1)
            if out.dtype != o_dtype:
                out = out.to(o_dtype)
            if not return_lse:
                return out, None
            return out, finish_lse(result[1].reshape(q.shape[1], qo_len))

        return run


flash_varlen = FlashVarlen()


# ------------------------------------------------------------------------------------------
# sdpa_efficient


def efficient_reasons(problem) -> list[Reason]:
    reasons = _schema_reasons("_scaled_dot_product_efficient_attention", {"scale"})
    q_dtype = dict(problem.dtypes).get("q")
    if problem.sm is not None and problem.sm < (8, 0) and q_dtype == "bfloat16":
        reasons.append(Reason("dtype.q", q_dtype, "{float16,float32} below SM 8.0",
                              f"bfloat16 needs SM 8.0 in the memory-efficient kernel, device is "
                              f"SM {problem.sm[0]}.{problem.sm[1]}"))
    return reasons


def efficient_bias(params: AttentionParams, qo_len: int, kv_len: int, num_qo_heads: int,
                   num_kv_heads: int, dtype: torch.dtype, device: torch.device):
    """The additive bias for the folded problem, and what the caller must fix afterwards.

    Returns ``(bias, lse_shift, nonempty)``: ``bias`` ``[1, H_kv, group*qo_len, kv_len]`` in
    ``dtype`` (row ``g*qo_len + r``; last-dim stride padded to 16 elements) or ``None``;
    ``lse_shift`` ``[H_qo, qo_len]`` float32 to add to the natural-log lse (ALiBi) or ``None``;
    ``nonempty`` bool ``[qo_len]`` (rows that see a key) or ``None`` when every row does.
    """
    group = num_qo_heads // num_kv_heads
    rows = torch.arange(qo_len, device=device)
    visible = visible_keys(rows, qo_len, kv_len, params)
    alibi = params.pos_encoding_mode == "ALIBI"
    if visible is None and not alibi:
        return None, None, None
    keys = torch.arange(kv_len, device=device)
    lse_shift = None
    if alibi:
        if visible is None:
            anchor = torch.full((qo_len,), kv_len - 1, device=device)
        else:  # the right-most visible key of each row (0 for an empty row, masked anyway)
            anchor = torch.where(visible, keys, -1).amax(dim=-1).clamp_min(0)
        slopes = params.alibi_slopes.to(device=device, dtype=torch.float32)
        distance = (keys[None, :] - anchor[:, None]).to(torch.float32)  # [qo_len, kv_len], <= 0 where visible
        values = slopes[:, None, None] * distance[None]  # [H_qo, qo_len, kv_len]
        lse_shift = slopes[:, None] * (anchor - rows).to(torch.float32)[None, :]
    else:
        values = torch.zeros(1, qo_len, kv_len, device=device)
    if visible is not None:
        values = values.masked_fill(~visible, float("-inf"))
    heads = num_kv_heads if alibi else 1
    padded = -(-kv_len // 16) * 16
    storage = torch.zeros(1, heads, group * qo_len, padded, dtype=dtype, device=device)
    values = values.expand(heads * group, qo_len, kv_len).reshape(1, heads, group * qo_len, kv_len)
    storage[..., :kv_len] = values
    bias = storage[..., :kv_len].expand(1, num_kv_heads, group * qo_len, kv_len)
    nonempty = None if visible is None else visible.any(dim=-1)
    return bias, lse_shift, nonempty


def sdpa_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams):
    qo_len, num_qo_heads, head_dim_qk = q.shape
    kv_len, num_kv_heads, head_dim_vo = v.shape
    group = num_qo_heads // num_kv_heads
    plain_causal = (params.causal and params.custom_mask is None and params.window_left < 0
                    and params.pos_encoding_mode != "ALIBI" and qo_len == kv_len and group == 1)
    if plain_causal:  # top-left == bottom-right when qo_len == kv_len
        bias, lse_shift, nonempty = None, None, None
    else:
        bias, lse_shift, nonempty = efficient_bias(params, qo_len, kv_len, num_qo_heads,
                                                   num_kv_heads, q.dtype, q.device)
    qh = (q.reshape(qo_len, num_kv_heads, group, head_dim_qk).permute(1, 2, 0, 3)
          .reshape(1, num_kv_heads, group * qo_len, head_dim_qk))
    kh = k.transpose(0, 1).unsqueeze(0)
    vh = v.transpose(0, 1).unsqueeze(0)
    result = aten_efficient(aligned(qh), aligned(kh), aligned(vh), bias, params.return_lse, 0.0,
                            plain_causal, scale=params.sm_scale)
    out = (result[0].reshape(num_kv_heads, group, qo_len, head_dim_vo).permute(2, 0, 1, 3)
           .reshape(qo_len, num_qo_heads, head_dim_vo))
    if nonempty is not None:
        out = out.masked_fill(~nonempty[:, None, None], 0.0)
    out = out.to(params.o_dtype)
    if not params.return_lse:
        return out, None
    lse = result[1][0, :, : group * qo_len].reshape(num_qo_heads, qo_len)
    if lse_shift is not None:
        lse = lse + lse_shift
    if nonempty is not None:
        lse = lse.masked_fill(~nonempty[None, :], float("-inf"))
    return out, finish_lse(lse)


# ------------------------------------------------------------------------------------------
# flash_varlen for batch_prefill_ragged


def store_outputs(out: torch.Tensor, lse: torch.Tensor | None, result: torch.Tensor,
                  lse_nat: torch.Tensor | None, v_scale: float, empty_rows: bool = True) -> None:
    """Write a varlen kernel's ``result [total_q, H, D]`` (times ``v_scale``) into ``out`` and its
    natural-log ``lse_nat [H, total_q]`` (``+inf``/``-inf`` for empty rows) into ``lse``
    ``[total_q, H]`` base 2; ``empty_rows=False`` (the plan has none) skips their fix-up. No
    host sync; temporaries have plan-fixed sizes."""
    if v_scale != 1.0:
        torch.mul(result, v_scale, out=out)
    elif result is not out:  # a kernel given ``out`` wrote it already
        out.copy_(result)
    if lse is not None:
        torch.mul(lse_nat.t(), _LOG2E, out=lse)
    if lse is not None and empty_rows:  # (one launch: their +inf becomes -inf in place)
        torch.nan_to_num_(lse, nan=float("nan"), posinf=float("-inf"), neginf=float("-inf"))


def fill_empty(out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """Every row sees no key (``max_kv_len == 0``): output 0, lse ``-inf``."""
    out.zero_()
    if lse is not None:
        lse.fill_(float("-inf"))


def window_needs_causal(problem) -> list[Reason]:
    """FA2/FA3 clamp a non-causal window's right edge to ``max_k`` keys past the diagonal; only
    the causal form is exact for every request (see the module docstring)."""
    if "window" in problem.features and "causal" not in problem.features:
        return [Reason("feature", "window", "window with causal",
                       "a sliding window is served only together with causal=True")]
    return []


def flash_ragged_reasons(problem) -> list[Reason]:
    return flash_reasons(problem) + window_needs_causal(problem)


def plan_ragged(plan: BatchPlan):
    """Runner for ``batch_prefill_ragged`` through aten's FA2 varlen entry (one launch)."""
    causal = plan.causal
    cu_q, cu_k = plan.qo_indptr, plan.kv_indptr
    max_q, max_k = plan.max_qo_len, plan.max_kv_len
    kwargs = {}
    if 0 <= plan.window_left < max_k:
        kwargs["window_size_left"] = plan.window_left

    def run(q: torch.Tensor, kv: KVInput, out: torch.Tensor, lse: torch.Tensor | None,
            scales: RunScales) -> None:
        if q.shape[0] == 0:
            return
        if max_k == 0:
            fill_empty(out, lse)
            return
        scale = plan.sm_scale * scales.q_scale * scales.k_scale
        result = aten_flash(aligned(q), aligned(kv.k), aligned(kv.v), cu_q, cu_k, max_q, max_k,
                            0.0, causal, False, scale=scale, **kwargs)
        store_outputs(out, lse, result[0], result[1] if lse is not None else None,
                      scales.v_scale)

    return run
