"""flash_attn adapter: FlashAttention-3 and FlashAttention-2 forward, varlen entry points.

Two variants (capability_db/flash_attn.toml), each serving ``single_prefill``,
``single_decode`` (one sequence, ``cu_seqlens = [0, len]``), ``batch_prefill_ragged`` (the
whole batch in one launch, ``cu_seqlens`` = the plan's device ``qo_indptr`` / ``kv_indptr``) and
``batch_prefill_paged`` (each run gathers the requests' pages into plan-allocated contiguous K/V,
one ``index_select`` per tensor, then the ragged launch; the (page, slot) of every token is
built in plan() on the device; host page ids ``p, p+1, ...`` of an NHD cache whose tokens leave
no hole are one run of the cache's rows, passed as a view with no gather, e.g. a cascade's
shared prefix; variant ``fa2_block_table`` instead hands FA2 the paged cache
and a block table, for pages that are multiples of 256, the only ones FA2 reads in place):

* ``fa3`` — ``flash_attn_varlen_func`` of the FA3 module ``flash_attn_interface`` or, when only
  that is installed, of the ``fa3_fwd`` wheel's ``fa3_fwd_interface`` (same API). SM 9.0.
  The wheel is built without fp16 kernels and without local (window) attention, so the adapter
  check rejects those when ``fa3_fwd_interface`` is the module that imports. Its compiled
  kernels cover head dims 64/96/128/192/256 (a head dim in between is padded up) and the unequal
  pairs Q/K in (128, 192] with V in (96, 128], or Q/K <= 64 with V <= 512; fp8 needs q, k and v
  all in e4m3, which the batch ops (fp8 KV, 16-bit q) do not give, so fp8 is not declared.
  No native paged KV (the wheel drops it; paged prefill gathers) and no sinks.
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

import numpy as np
import torch

from ...attention.params import AttentionParams
from ...attention.batch_params import BatchPlan, KVInput, RunScales
from ...device import reserved_sms
from ...optional_packages import import_error
from ..shared.paged_mapping import block_sparse as block_sparse_paged  # noqa: F401 (a record's kernel)
from ...reasons import Reason
from ..torch.attention import (
    aligned, aligned_qkv, cu_seqlens, fill_empty, finish_lse, store_outputs, window_needs_causal,
)


FA3_MODULES = ("flash_attn_interface", "fa3_fwd_interface")


# ------------------------------------------------------------------------------------------
# vendor entry points


def fa3_module_name() -> str | None:
    """The FA3 module that imports, preferring the full package; ``None`` when neither does."""
    for name in FA3_MODULES:
        if import_error(name) is None:
            return name
    return None


@functools.lru_cache(maxsize=None)
def _takes(fn, name: str) -> bool:
    """Whether ``fn`` has a parameter ``name`` (FA3 releases differ)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def _fa3_forward_op():
    """The compiled forward op ``torch.ops.fa3_fwd.fwd`` when the fa3_fwd wheel is the FA3
    module, else ``None`` (the Python entry point is used).

    Why not the wheel's ``flash_attn_varlen_func``: it goes through a ``torch.library.custom_op``
    and an autograd Function; the first call of any Python custom op imports torch's compiler
    stack (1.5 s here, 3.5 s on the H200 host: 1,600 modules), and every call pays their
    dispatch. The compiled op takes the same arguments positionally (the wheel's
    ``_flash_attn_forward`` forwards them unchanged) and writes into a given output."""
    if _FA3_OP:
        return _FA3_OP[0]
    if fa3_module_name() != "fa3_fwd_interface":
        return None
    importlib.import_module("fa3_fwd._C")  # registers torch.ops.fa3_fwd
    _FA3_OP.append(torch.ops.fa3_fwd.fwd.default)  # (the overload: no resolution per call)
    return _FA3_OP[0]


_FA3_OP: list = []  # the compiled op once found (an installed wheel stays installed)


def fa3_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal, window, softcap, out=None,
               num_splits=1, qv=None):
    """``(out [total_q, H, Dv], lse [H, total_q] natural log)`` from FA3's varlen forward.

    ``out``: an optional contiguous ``[total_q, H, Dv]`` tensor in q's dtype the kernel writes
    (the returned output is then that tensor). ``num_splits``: the key chunks each row tile is
    cut into (:func:`key_splits`; FA3 merges them). ``qv``: FA3's second query part (MLA:
    scores ``q . k + qv . v``, :mod:`.mla`). FA3 leaves
    :func:`~flashinfer.device.reserved_sms` SMs free (its ``sm_margin``)."""
    raw = _fa3_forward_op()
    if raw is not None:
        result = raw(q, k, v, None, None, qv, out, cu_q, cu_k, None, None, None, max_q, max_k,
                     None, None, None, None, None, None, None, None, None, scale, causal,
                     window[0], window[1], 0, softcap, True, None, num_splits, None,
                     reserved_sms())
        return result[0], result[1]
    module = importlib.import_module(fa3_module_name() or FA3_MODULES[0])
    fn = module.flash_attn_varlen_func
    kwargs = {"softmax_scale": scale, "causal": causal, "window_size": window, "softcap": softcap}
    if _takes(fn, "num_splits"):
        kwargs["num_splits"] = num_splits
    if _takes(fn, "sm_margin"):
        kwargs["sm_margin"] = reserved_sms()
    if qv is not None:
        kwargs["qv"] = qv
    if _takes(fn, "return_attn_probs"):  # older FA3 releases always return (out, lse)
        kwargs["return_attn_probs"] = True
    result = fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    return result[0], result[1]


def fa2_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, causal, window, softcap,
               block_table=None):
    """``(out [total_q, H, D], lse [H, total_q] natural log)`` from the FA2 package. With
    ``block_table`` (int32 ``[B, max_pages]``), ``k`` / ``v`` are the paged caches
    ``[num_pages, page_size, H, D]`` (page size a multiple of 256) read in place."""
    from flash_attn import flash_attn_varlen_func

    extra = {} if block_table is None else {"block_table": block_table}
    result = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0,
                                    softmax_scale=scale, causal=causal, window_size=window,
                                    softcap=softcap, return_attn_probs=True, **extra)
    return result[0], result[1]


#: FA3's row tile (query rows a program takes) and the fewest keys worth a split of their own
FA3_TILE_ROWS, KEYS_PER_SPLIT = 128, 2048
#: the most key chunks: FA3 writes one fp32 partial output each, then merges them
MAX_SPLITS = 16


def key_splits(batch: int, heads: int, max_q: int, max_k: int, device) -> int:
    """How many chunks FA3 cuts each row tile's keys into: 1 when the row tiles fill the GPU
    twice over, else enough to (up to :data:`MAX_SPLITS`, each of at least
    :data:`KEYS_PER_SPLIT` keys). A cascade's shared level, 64 queries x 32 heads over a 32k
    prefix, is 32 tiles on 132 SMs: cascade decode of 64 requests took 0.63 ms unsplit, 0.88
    with FA3's own choice (num_splits=0), 0.38 with this one; 256 requests 0.93 / 0.56 / 0.47
    (benchmarks/results/compositions_h200_2026-12-04_0155utc.jsonl, _0214utc.jsonl)."""
    if torch.device(device).type != "cuda" or max_k < 2 * KEYS_PER_SPLIT:
        return 1
    sms = _sm_count(torch.device(device).index or 0)
    tiles = batch * heads * -(-max(max_q, 1) // FA3_TILE_ROWS)
    if tiles >= 2 * sms:
        return 1
    return max(1, min(MAX_SPLITS, -(-2 * sms // tiles), max_k // KEYS_PER_SPLIT))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _vendor(variant: str):
    # Looked up at call time, so a test's replacement of fa3_varlen / fa2_varlen takes effect.
    return fa3_varlen if variant == "fa3" else fa2_varlen


def _window(window_left: int, kv_len: int, causal: bool) -> tuple[int, int]:
    if 0 <= window_left < kv_len:
        return (window_left, 0 if causal else -1)
    return (-1, -1)


# ------------------------------------------------------------------------------------------
# adapter checks


def fa3_reasons(problem) -> list[Reason]:
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


def fa2_reasons(problem) -> list[Reason]:
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
        splits = ({"num_splits": key_splits(1, num_qo_heads, qo_len, kv_len, q.device)}
                  if variant == "fa3" else {})
        out, lse = _vendor(variant)(
            aligned(q), aligned(k), aligned(v), cu_seqlens(q.device, qo_len),
            cu_seqlens(q.device, kv_len), qo_len, kv_len, scale=params.sm_scale, causal=causal,
            window=_window(params.window_left, kv_len, causal), softcap=params.logits_soft_cap,
            **splits)
        out = out.reshape(qo_len, num_qo_heads, -1).to(params.o_dtype)
        if not params.return_lse:
            return out, None
        return out, finish_lse(lse.reshape(num_qo_heads, qo_len))
    kernel.__name__ = f"{variant}_single"
    return kernel


def _varlen_runner(variant: str, plan: BatchPlan, cu_k: torch.Tensor, max_k: int,
                   block_table: torch.Tensor | None = None):
    """``run(q, k, v, out, lse, scales) -> out``: one varlen launch, ``cu_seqlens_q =
    plan.qo_indptr``, outputs stored per the contract; ``out`` None: the kernel's own output
    (q's dtype) is returned (the contract's ``makes_output``). Nothing host-synchronising,
    nothing data-sized allocated but that output.
    ``block_table``: FA2 only, ``k`` / ``v`` are then paged caches (see :func:`fa2_varlen`)."""
    causal = plan.causal
    cu_q, max_q = plan.qo_indptr, plan.max_qo_len
    window = _window(plan.window_left, max_k, causal)
    vendor_args = {} if block_table is None else {"block_table": block_table}
    if variant == "fa3":
        vendor_args["num_splits"] = key_splits(plan.batch_size, plan.num_qo_heads, max_q, max_k,
                                         plan.device)
    # a row that sees no key gets lse +inf from the kernel (made -inf by one more launch); an
    # eager plan knows whether it has one (a CUDA-graph plan's replay may meet a later plan's)
    empty_rows = plan.cuda_graph or _has_empty_rows(plan)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
            lse: torch.Tensor | None, scales: RunScales) -> torch.Tensor:
        if out is None and (q.shape[0] == 0 or max_k == 0):
            out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        if q.shape[0] == 0:
            return out
        if max_k == 0:
            fill_empty(out, lse)
            return out
        direct = {}
        if (out is not None and variant == "fa3" and scales.v_scale == 1.0
                and out.dtype == q.dtype and out.is_contiguous()):
            direct["out"] = out  # the kernel writes the output in place: no copy
        q, k, v = aligned_qkv(q, k, v)
        result, lse_nat = _vendor(variant)(
            q, k, v, cu_q, cu_k, max_q, max_k,
            scale=plan.sm_scale * scales.q_scale * scales.k_scale, causal=causal,
            window=window, softcap=plan.logits_soft_cap, **direct, **vendor_args)
        if out is None:  # the kernel's own output, in q's dtype (the wrapper asked for it)
            out = result
        store_outputs(out, lse, result, lse_nat, scales.v_scale, empty_rows)
        return out

    return run


def _has_empty_rows(plan: BatchPlan) -> bool:
    """Whether a query row of the plan sees no key: a request of no keys, or, causal, more
    query tokens than keys (rows are bottom-right aligned)."""
    qo = plan.qo_indptr_host.numpy()
    q_lens, kv_lens = qo[1:] - qo[:-1], plan.kv_lens_host.numpy()
    short = kv_lens < (q_lens if plan.causal else 1)
    return bool((short & (q_lens > 0)).any())


def _ragged_planner(variant: str):
    def plan_ragged(plan: BatchPlan):
        """One varlen launch per run(); cu_seqlens are the plan's device buffers."""
        varlen = _varlen_runner(variant, plan, plan.kv_indptr, plan.max_kv_len)

        def run(q: torch.Tensor, kv: KVInput, out: torch.Tensor | None,
                lse: torch.Tensor | None, scales: RunScales) -> torch.Tensor:
            return varlen(q, kv.k, kv.v, out, lse, scales)

        run.makes_output = True
        return run
    plan_ragged.__name__ = f"{variant}_plan_ragged"
    return plan_ragged


def paged_gather_index(plan: BatchPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(page_ids, slots, cu_seqlens_k)`` on ``plan.device``: the page and in-page slot (int64
    ``[total_kv]``) of every KV token of every request, in request order, and the int32
    ``[B+1]`` row offsets of the gathered K/V. Made on the host from the plan's host arrays
    (numpy, page by page: every slot of a request's pages but the unused tail of its last page)
    and sent in one copy with the offsets; page ids kept on the device are then looked up there
    (one gather): no device sync, two or three launches instead of a dozen."""
    device, ps = plan.device, plan.page_size
    lens = plan.kv_lens_host.numpy()
    indptr = plan.kv_indptr_host.numpy()
    n_pages, total_kv = int(indptr[-1]), int(lens.sum(dtype=np.int64))
    host_ids = plan.kv_indices_host
    pages = host_ids.numpy()[:n_pages] if host_ids is not None else np.arange(n_pages)
    page_of = np.repeat(pages.astype(np.int64, copy=False), ps)  # every slot of every page
    slot_of = np.tile(np.arange(ps, dtype=np.int64), n_pages)
    if total_kv != n_pages * ps:  # drop the unused tail of each request's last page
        keep = np.ones(n_pages * ps, dtype=bool)
        for start, end, n in zip(indptr[:-1].tolist(), indptr[1:].tolist(), lens.tolist()):
            keep[start * ps + n:end * ps] = False
        page_of, slot_of = page_of[keep], slot_of[keep]
    packed = np.empty(2 * total_kv + lens.shape[0] + 1, dtype=np.int64)
    packed[:total_kv], packed[total_kv:2 * total_kv] = page_of, slot_of
    packed[2 * total_kv] = 0
    np.cumsum(lens, out=packed[2 * total_kv + 1:])
    sent = torch.from_numpy(packed).to(device, non_blocking=True)
    page_ids, slots = sent[:total_kv], sent[total_kv:2 * total_kv]
    if host_ids is None and total_kv:  # positions in kv_indices: the ids live on the device
        page_ids = plan.kv_indices.to(torch.int64)[page_ids]
    return page_ids, slots, sent[2 * total_kv:].to(torch.int32)


def _one_run_of_pages(plan: BatchPlan) -> int | None:
    """The first page id when the plan's tokens, in request order, are the consecutive slots of
    consecutive pages (host ids ``p, p+1, ...``; every request but the last fills its pages):
    then the gathered K/V would be a copy of one run of the cache's rows. ``None`` otherwise."""
    host_ids = plan.kv_indices_host
    indptr = plan.kv_indptr_host.numpy()
    n_pages = int(indptr[-1])
    if host_ids is None or n_pages == 0:
        return None
    ids = host_ids.numpy()[:n_pages]
    first = int(ids[0])
    if first < 0 or (n_pages > 1 and not (np.diff(ids) == 1).all()):
        return None
    lens = plan.kv_lens_host.numpy()
    used = np.flatnonzero(indptr[1:] > indptr[:-1])  # requests that hold pages
    full = (indptr[1:] - indptr[:-1]) * plan.page_size
    if used.size and not (lens[used[:-1]] == full[used[:-1]]).all():
        return None
    return first


def _page_rows(cache: torch.Tensor, layout: str) -> tuple[torch.Tensor, int] | None:
    """``(rows [N, H, D], pitch)``: a view of the cache where token ``(page, slot)`` is row
    ``page * pitch + slot``, when the page stride is a multiple of the slot stride (NHD and HND,
    contiguous or split from a 5-D cache); ``None`` otherwise."""
    nhd = cache if layout == "NHD" else cache.transpose(1, 2)  # [pages, page_size, H, D]
    pages, page_size = nhd.shape[:2]
    s_page, s_slot = nhd.stride()[:2]
    if s_slot <= 0 or s_page % s_slot or pages == 0:
        return None
    pitch = s_page // s_slot
    rows = nhd.as_strided(((pages - 1) * pitch + page_size,) + tuple(nhd.shape[2:]),
                          (s_slot,) + tuple(nhd.stride()[2:]))
    return rows, pitch


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _paged_planner(variant: str):
    def plan_paged(plan: BatchPlan):
        """Gather the requests' pages into contiguous K/V buffers (allocated here, sized by the
        plan), then the ragged varlen launch over them. fp8 pages are widened exactly to q's
        dtype as they are gathered (the scales are the run's, as for 16-bit pages)."""
        page_ids, slots, cu_k = paged_gather_index(plan)
        row_index: dict[int, torch.Tensor] = {}  # pitch -> page_ids * pitch + slots
        total_kv = slots.shape[0]
        buf_dtype = plan.q_dtype if plan.kv_dtype in _FP8 else plan.kv_dtype
        k_buf = torch.empty(total_kv, plan.num_kv_heads, plan.head_dim_qk, dtype=buf_dtype,
                            device=plan.device)
        v_buf = torch.empty(total_kv, plan.num_kv_heads, plan.head_dim_vo, dtype=buf_dtype,
                            device=plan.device)
        varlen = _varlen_runner(variant, plan, cu_k, plan.max_kv_len)
        layout = plan.kv_layout
        first_page = _one_run_of_pages(plan) if buf_dtype == plan.kv_dtype else None
        # per cache (pointer, shape, strides): its rows view and its tokens in place; a serving
        # loop passes the same caches every run, and the views cost microseconds each
        views: dict[tuple, tuple] = {}

        def cache_views(cache: torch.Tensor) -> tuple:
            """``(_page_rows(cache), the tokens as a view of the cache or None)``."""
            key = (cache.data_ptr(), cache.shape, cache.stride())
            found = views.get(key)
            if found is None:
                if len(views) >= 8:
                    views.clear()
                rows = _page_rows(cache, layout)
                found = views[key] = (rows, in_place(rows))
            return found

        def in_place(found) -> torch.Tensor | None:
            """The tokens as a view of the cache, when they are one run of its rows: page ids
            consecutive, no hole but the last page's tail, pages one after another in memory."""
            if first_page is None or found is None or found[1] != plan.page_size:
                return None
            rows, start = found[0], first_page * plan.page_size
            return rows[start:start + total_kv] if start + total_kv <= rows.shape[0] else None

        def gather(cache: torch.Tensor, found, buf: torch.Tensor) -> None:
            if found is None:  # strides that do not flatten: advanced indexing into buf
                nhd = cache if layout == "NHD" else cache.transpose(1, 2)
                if nhd.dtype == buf.dtype:
                    torch.ops.aten.index.Tensor_out(nhd, [page_ids, slots], out=buf)
                else:
                    buf.copy_(nhd[page_ids, slots])
                return
            rows, pitch = found
            if pitch not in row_index:  # first run (a capture's warm-up): one index per pitch
                row_index[pitch] = page_ids * pitch + slots
            if rows.dtype == buf.dtype:
                torch.index_select(rows, 0, row_index[pitch], out=buf)
            else:
                buf.copy_(rows.index_select(0, row_index[pitch]))

        def run(q: torch.Tensor, kv: KVInput, out: torch.Tensor | None,
                lse: torch.Tensor | None, scales: RunScales) -> torch.Tensor:
            (k_rows, k), (v_rows, v) = cache_views(kv.k), cache_views(kv.v)
            if total_kv and q.shape[0] and (k is None or v is None):
                gather(kv.k, k_rows, k_buf)
                gather(kv.v, v_rows, v_buf)
                k, v = k_buf, v_buf
            return varlen(q, k_buf if k is None else k, v_buf if v is None else v, out, lse,
                          scales)

        run.makes_output = True
        return run
    plan_paged.__name__ = f"{variant}_plan_paged"
    return plan_paged


def block_table_index(plan: BatchPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """``(block_table, cu_seqlens_k)`` on ``plan.device``: int32 ``[B, max_pages]`` whose row
    ``b`` is request ``b``'s page ids, then (never read: past its length) the ids that follow
    it in ``kv_indices``, the last one repeated; and the int32 ``[B+1]`` token offsets. Built on
    the host from the plan's host arrays and sent in one copy; page ids kept on the device are
    then looked up there (one gather): no device sync."""
    indptr = plan.kv_indptr_host.numpy()
    lens = plan.kv_lens_host.numpy()
    n_pages, batch = int(indptr[-1]), lens.shape[0]
    width = max(int((indptr[1:] - indptr[:-1]).max(initial=0)), 1)
    positions = indptr[:-1, None].astype(np.int64) + np.arange(width)
    np.minimum(positions, max(n_pages - 1, 0), out=positions)
    host_ids = plan.kv_indices_host
    packed = np.empty(batch * width + batch + 1, dtype=np.int32)
    if n_pages == 0:
        packed[:batch * width] = 0
    elif host_ids is not None:
        packed[:batch * width] = host_ids.numpy()[positions].reshape(-1)
    else:  # positions now, ids looked up on the device below
        packed[:batch * width] = positions.reshape(-1)
    packed[batch * width] = 0
    np.cumsum(lens, out=packed[batch * width + 1:])
    sent = torch.from_numpy(packed).to(plan.device, non_blocking=True)
    table = sent[:batch * width].view(batch, width)
    if host_ids is None and n_pages:
        table = plan.kv_indices[table.long()]
    return table, sent[batch * width:]


def fa2_block_table_planner(plan: BatchPlan):
    """FA2 reading the paged cache in place: one varlen launch with a block table (pages that
    are multiples of 256, FA2's own limit; smaller pages go through the gathering planner)."""
    table, cu_k = block_table_index(plan)
    varlen = _varlen_runner("fa2", plan, cu_k, plan.max_kv_len, block_table=table)
    hnd = plan.kv_layout == "HND"
    # FA2's paged (split-KV) kernel leaves a finite lse on the rows of a request without keys
    # (seen on the H200); those rows are set to the contract's 0 / -inf after each launch
    qo = plan.qo_indptr_host.numpy()
    keyless = [np.arange(qo[b], qo[b + 1]) for b in np.flatnonzero(plan.kv_lens_host.numpy() == 0)]
    rows = np.concatenate(keyless) if keyless else np.zeros(0, dtype=np.int64)
    empty_rows = torch.from_numpy(rows.astype(np.int64)).to(plan.device) if rows.size else None

    def run(q: torch.Tensor, kv: KVInput, out: torch.Tensor, lse: torch.Tensor | None,
            scales: RunScales) -> None:
        k, v = (kv.k.transpose(1, 2), kv.v.transpose(1, 2)) if hnd else (kv.k, kv.v)
        varlen(q, k, v, out, lse, scales)
        if empty_rows is not None and plan.max_kv_len:
            out.index_fill_(0, empty_rows, 0.0)
            if lse is not None:
                lse.index_fill_(0, empty_rows, float("-inf"))

    return run


# the kernel functions the capability records name, one per variant
fa3_single, fa2_single = _single("fa3"), _single("fa2")
fa3_plan_ragged, fa2_plan_ragged = _ragged_planner("fa3"), _ragged_planner("fa2")
fa3_plan_paged, fa2_plan_paged = _paged_planner("fa3"), _paged_planner("fa2")
