"""flash_attn adapter: FlashAttention-3 and FlashAttention-2 forward, varlen entry points.

Two variants (capability_db/flash_attn.toml), each serving ``single_prefill``,
``single_decode`` (one sequence, ``cu_seqlens = [0, len]``) and ``batch_prefill_ragged`` (the
whole batch in one launch, ``cu_seqlens`` = the plan's device ``qo_indptr`` / ``kv_indptr``):

* ``fa3`` — ``flash_attn_varlen_func`` of the FA3 module ``flash_attn_interface`` or, when only
  that is installed, of the ``fa3_fwd`` wheel's ``fa3_fwd_interface`` (same API). SM 9.0.
  The wheel is built without fp16 kernels and without local (window) attention, so the adapter
  check rejects those when ``fa3_fwd_interface`` is the module that imports. Its compiled
  kernels cover head dims 64/96/128/192/256 (a head dim in between is padded up) and the unequal
  pairs Q/K in (128, 192] with V in (96, 128], or Q/K <= 64 with V <= 512; fp8 needs q, k and v
  all in e4m3, which the batch ops (fp8 KV, 16-bit q) do not give, so fp8 is not declared.
  No paged KV (the wheel drops it) and no sinks.
* ``fa2`` — ``flash_attn.flash_attn_varlen_func`` of the FA2 package (>= 2.6: softcap and the
  ``[H, total_q]`` lse layout). SM 8.0 and later, fp16/bf16, equal head dims <= 256.

Both: GQA native; causal bottom-right; ``window_size = (left, 0)`` with causal; ``softcap``
caps ``softmax_scale * q.k``; the lse is natural log ``[H, total_q]`` (``+inf`` for a row that
sees no key), converted to base 2 ``[total_q, H]``. A window without causal is rejected: the
kernels clamp its right edge to ``max_seqlen_k`` keys past the diagonal (see torch_native).
Vendor modules are imported inside functions only; :func:`fa3_varlen` and :func:`fa2_varlen` are
the single points where they are called (the CPU tests replace them with emulations).
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from ..attention_params import AttentionParams
from ..batch_attention_params import BatchPlan, KVInput, RunScales
from ..capability_db import import_error
from ..reasons import Reason
from . import KernelTable
from .torch_native import aligned, cu_seqlens, fill_empty, finish_lse, store_outputs, window_needs_causal

KERNELS = KernelTable("flash_attn")

FA3_MODULES = ("flash_attn_interface", "fa3_fwd_interface")
_SINGLE_OPS = ("single_prefill", "single_decode")


# ------------------------------------------------------------------------------------------
# vendor entry points


def fa3_module_name() -> str | None:
    """The FA3 module that imports, preferring the full package; ``None`` when neither does."""
    for name in FA3_MODULES:
        if import_error(name) is None:
            return name
    return None


@functools.lru_cache(maxsize=None)
def _takes_return_attn_probs(fn) -> bool:
    try:
        return "return_attn_probs" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def fa3_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal, window, softcap):
    """``(out [total_q, H, Dv], lse [H, total_q] natural log)`` from FA3's varlen forward."""
    module = importlib.import_module(fa3_module_name() or FA3_MODULES[0])
    fn = module.flash_attn_varlen_func
    kwargs = {"softmax_scale": scale, "causal": causal, "window_size": window, "softcap": softcap}
    if _takes_return_attn_probs(fn):  # older FA3 releases always return (out, lse)
        kwargs["return_attn_probs"] = True
    result = fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    return result[0], result[1]


def fa2_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal, window, softcap):
    """``(out [total_q, H, D], lse [H, total_q] natural log)`` from the FA2 package."""
    from flash_attn import flash_attn_varlen_func

    result = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0,
                                    softmax_scale=scale, causal=causal, window_size=window,
                                    softcap=softcap, return_attn_probs=True)
    return result[0], result[1]


def _vendor(variant: str):
    # Looked up at call time, so a test's replacement of fa3_varlen / fa2_varlen takes effect.
    return fa3_varlen if variant == "fa3" else fa2_varlen


def _window(window_left: int, kv_len: int, causal: bool) -> tuple[int, int]:
    if 0 <= window_left < kv_len:
        return (window_left, 0 if causal else -1)
    return (-1, -1)


# ------------------------------------------------------------------------------------------
# adapter checks


def _fa3_reasons(problem) -> list[Reason]:
    reasons = [] if problem.op == "single_decode" else window_needs_causal(problem)
    module = fa3_module_name()
    q_dtype = dict(problem.dtypes).get("q")
    if module == "fa3_fwd_interface":  # the wheel: no fp16 kernels, no local attention
        if q_dtype == "float16":
            reasons.append(Reason("dtype.q", q_dtype, "{bfloat16} with fa3_fwd",
                                  "the fa3_fwd wheel has no float16 kernels (bfloat16 only); "
                                  "flash_attn_interface does not import"))
        if "window" in problem.features:
            reasons.append(Reason("feature", "window", "no window with fa3_fwd",
                                  "the fa3_fwd wheel is built without local (window) attention; "
                                  "flash_attn_interface does not import"))
    if "head_dim_differs" in problem.features:
        shape = dict(problem.shape)
        dqk, dvo = shape.get("head_dim_qk", 0), shape.get("head_dim_vo", 0)
        if not ((128 < dqk <= 192 and 96 < dvo <= 128) or dqk <= 64):
            reasons.append(Reason("head_dim_vo", dvo, "qk (128,192] with vo (96,128], or qk <= 64",
                                  f"FA3 runs head_dim_qk={dqk} != head_dim_vo={dvo} only for "
                                  f"qk in (128, 192] with vo in (96, 128], or qk <= 64"))
    return reasons


def _fa2_reasons(problem) -> list[Reason]:
    reasons = [] if problem.op == "single_decode" else window_needs_causal(problem)
    if import_error("flash_attn") is None:
        version = getattr(importlib.import_module("flash_attn"), "__version__", "0")
        if _version_tuple(version) < (2, 6):
            reasons.append(Reason("version", version, ">=2.6",
                                  f"flash_attn {version} is older than 2.6 (softcap, [H, total_q] lse)"))
    return reasons


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in str(text).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


# ------------------------------------------------------------------------------------------
# kernels and planners


def _single(variant: str):
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams):
        qo_len, num_qo_heads, _ = q.shape
        kv_len = k.shape[0]
        causal = bool(params.causal or qo_len == 1)  # one query row sees every key either way
        out, lse = _vendor(variant)(
            aligned(q), aligned(k), aligned(v), cu_seqlens(q.device, qo_len),
            cu_seqlens(q.device, kv_len), qo_len, kv_len, scale=params.sm_scale, causal=causal,
            window=_window(params.window_left, kv_len, causal), softcap=params.logits_soft_cap)
        out = out.reshape(qo_len, num_qo_heads, -1).to(params.o_dtype)
        if not params.return_lse:
            return out, None
        return out, finish_lse(lse.reshape(num_qo_heads, qo_len))
    kernel.__name__ = f"{variant}_single"
    return kernel


def _ragged_planner(variant: str):
    def plan_ragged(plan: BatchPlan):
        """One varlen launch per run(); cu_seqlens are the plan's device buffers."""
        causal = plan.causal
        cu_q, cu_k = plan.qo_indptr, plan.kv_indptr
        max_q, max_k = plan.max_qo_len, plan.max_kv_len
        window = _window(plan.window_left, max_k, causal)

        def run(q: torch.Tensor, kv: KVInput, out: torch.Tensor, lse: torch.Tensor | None,
                scales: RunScales) -> None:
            if q.shape[0] == 0:
                return
            if max_k == 0:
                fill_empty(out, lse)
                return
            result, lse_nat = _vendor(variant)(
                aligned(q), aligned(kv.k), aligned(kv.v), cu_q, cu_k, max_q, max_k,
                scale=plan.sm_scale * scales.q_scale * scales.k_scale, causal=causal,
                window=window, softcap=plan.logits_soft_cap)
            store_outputs(out, lse, result, lse_nat, scales.v_scale)

        return run
    plan_ragged.__name__ = f"{variant}_plan_ragged"
    return plan_ragged


for _variant, _reasons in (("fa3", _fa3_reasons), ("fa2", _fa2_reasons)):
    for _op in _SINGLE_OPS:
        KERNELS.kernel(_op, _variant)(_single(_variant))
        KERNELS.check(_op, _variant)(_reasons)
    KERNELS.kernel("batch_prefill_ragged", _variant)(_ragged_planner(_variant))
    KERNELS.check("batch_prefill_ragged", _variant)(_reasons)
