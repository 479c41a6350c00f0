"""Ahead-of-time compilation of our Triton kernels (``flashinfer warmup``).

A Triton kernel compiles on its first call in a process that finds no matching entry in Triton's
on-disk cache (``TRITON_CACHE_DIR``, default ``~/.triton/cache``): about 2.5 s per sampling
kernel on the H200's host. Run ``flashinfer warmup`` once per machine or container image with
the serving shapes, and later processes load the compiled kernels instead (the first call of
``top_k_top_p_sampling_from_probs`` at 256 x 128k: 3.7 s cold, 1.1 s warm;
benchmarks/results/sampling_first_call_profile_*_h200_2026-11-30.txt).

A compiled kernel is keyed on its compile-time arguments, which for the samplers include the
vocabulary's alignment class and whether each threshold is a scalar or a per-row tensor, so the
warm-up calls every sampling function with both threshold forms at each requested vocabulary.
Row counts, seeds, offsets and threshold values are runtime arguments: any batch size and value
reuses the same compile. Each call goes through the public API with ``backend="auto"``, so it
compiles what the dispatcher would choose on this device (nothing on CPU). ``--only`` limits the
warm-up to the functions a deployment calls (about 2.5 s each instead of ~20 s for all).
``--export-pack FILE`` compiles into a fresh cache and writes the result as a kernel pack
(:mod:`flashinfer.kernel_pack`), which is how ``flashinfer/kernel_packs/`` is made: on a GPU,
``flashinfer warmup --vocab 32000 50257 --export-pack
flashinfer/kernel_packs/triton-<version>-sm<arch>.tar.xz`` (one vocabulary divisible by 16 and
one not: the two alignment classes).

The fp8 GEMMs our Triton kernels serve by default are warmed too (:func:`gemm_calls`, once, not
per vocabulary): batched ``bmm_fp8`` at each of the kernel's tile heights (on SM 9.0 the
dispatcher sends batched calls there; a first batched call took 7.7 s in a fresh process on
the H200, imports included), and
``gemm_fp8_nt_groupwise`` with 128x128 activation blocks, which cuBLASLt lacks. Their compiled
kernels depend on the tile height, the dtypes and whether K and N are multiples of 16, not on M
(the kernels do not specialise on it) nor otherwise on the model's sizes. Where the dispatcher picks a vendor kernel (cuBLASLt, cuDNN) nothing compiles.

The Triton MLA kernel (:func:`mla_calls`) compiles per head count, page size, cache dtype and
whether the keys are split, its merge per split count: the warm-up runs DeepSeek's latent
attention at 128 and 16 heads, pages 1 / 16 / 64, bf16 and fp8 caches, over the batches whose
split counts a serving loop meets most. Where FlashMLA serves (SM 9.0 with ``sgl-flash-mla``)
nothing compiles; the pack is exported with the Triton kernel forced, for machines without it.

The state merges of the cascade and shared-prefix wrappers (:func:`merge_calls`) compile per
head tile, head dim and dtype: the warm-up covers 8 and 32 heads, head dims 64 / 128 / 256, fp16
and bf16; with them FlashMLA's helper kernels (its CUDA-graph block table, the fp8 latent
gather of ``flashmla:dequant``), which compile without FlashMLA installed.

The fused MoE's kernels depend on the model (expert count, top-k, hidden and intermediate sizes,
the weights' quantisation) and on the tile bucket the tokens per expert fall in, so they are
warmed only when asked: ``--moe E,K,H,I`` (:func:`moe_calls`) runs the layer at 1 token and at
32 and 128 tokens per expert, which covers every bucket (the DeepSeek-V3 layer's first call
took 4.7 s on the H200, then 1.3 s more at 1,024 tokens). Weights are allocated, not drawn
(``torch.empty``: 11 GB for DeepSeek-V3's 256 fp8 experts; the outputs are not looked at).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

def sampling_calls() -> list[tuple[str, Callable]]:
    """The warm-up calls: ``(name, fn(probs, logits, ks, ps))``."""
    from . import sampling as S

    return [
        ("sampling_from_probs", lambda p, x, ks, ps: S.sampling_from_probs(p)),
        ("sampling_from_logits", lambda p, x, ks, ps: S.sampling_from_logits(x)),
        ("top_p_sampling_from_probs", lambda p, x, ks, ps: S.top_p_sampling_from_probs(p, 0.9)),
        ("top_p_sampling_from_probs[per_row]",
         lambda p, x, ks, ps: S.top_p_sampling_from_probs(p, ps)),
        ("top_k_sampling_from_probs", lambda p, x, ks, ps: S.top_k_sampling_from_probs(p, 50)),
        ("top_k_sampling_from_probs[per_row]",
         lambda p, x, ks, ps: S.top_k_sampling_from_probs(p, ks)),
        ("min_p_sampling_from_probs", lambda p, x, ks, ps: S.min_p_sampling_from_probs(p, 0.1)),
        ("top_k_top_p_sampling_from_probs",
         lambda p, x, ks, ps: S.top_k_top_p_sampling_from_probs(p, 50, 0.9)),
        ("top_k_top_p_sampling_from_probs[per_row]",
         lambda p, x, ks, ps: S.top_k_top_p_sampling_from_probs(p, ks, ps)),
        ("top_k_top_p_sampling_from_logits",
         lambda p, x, ks, ps: S.top_k_top_p_sampling_from_logits(x, 50, 0.9)),
        ("top_p_renorm_probs", lambda p, x, ks, ps: S.top_p_renorm_probs(p, 0.9)),
        ("top_k_renorm_probs", lambda p, x, ks, ps: S.top_k_renorm_probs(p, 50)),
        ("top_k_mask_logits", lambda p, x, ks, ps: S.top_k_mask_logits(x, 50)),
        ("softmax", lambda p, x, ks, ps: S.softmax(x, 0.7)),
        # a few rows split each row over many programs, many rows take one program each
        ("softmax[many_rows]", lambda p, x, ks, ps: S.softmax(x.repeat(128, 1), 0.7)),
        # the logits' dtype is part of a kernel's signature: bf16 as engines pass them
        ("sampling_from_logits[bf16]", lambda p, x, ks, ps: S.sampling_from_logits(x.bfloat16())),
        ("top_k_top_p_sampling_from_logits[bf16]",
         lambda p, x, ks, ps: S.top_k_top_p_sampling_from_logits(x.bfloat16(), 50, 0.9)),
        ("top_k_mask_logits[bf16]", lambda p, x, ks, ps: S.top_k_mask_logits(x.bfloat16(), 50)),
        ("softmax[bf16]", lambda p, x, ks, ps: S.softmax(x.bfloat16(), 0.7)),
        ("chain_speculative_sampling", _chain_call),
    ]


def _chain_call(probs, logits, ks, ps):
    """Three draft tokens per request, drafts and targets from the warm-up rows."""
    rows, vocab = probs.shape
    draft = probs[:, None].expand(rows, 3, vocab).contiguous()
    target = probs.flip(0)[:, None].expand(rows, 4, vocab).contiguous()
    ids = draft.argmax(-1).int()
    from . import sampling as S

    return S.chain_speculative_sampling(draft, ids, target)


def gemm_calls() -> list[tuple[str, Callable]]:
    """The GEMM warm-up calls: ``(name, fn(device, backend) -> output)``, inputs drawn from a
    fixed seed (so a checker can run the same call on the reference). ``bmm_fp8``: batch 2 of
    DeepSeek-V3's MLA W_UK product (N 512, K 128), e4m3, bf16 out, at M = 16 / 64 / 512 (the
    Triton kernel's 16-, 64- and 128-row tiles), and its W_UV product (N 128, K 512) at M = 16
    (four K steps: 4 pipeline stages where W_UK's single step takes 3, ``bmm_fp8_launch``);
    ``gemm_fp8_nt_groupwise``: 128x128 activation blocks, 512 x 512, at M = 16 and 64 (its two
    tile heights), and DeepSeek-V3's 1x128 activation blocks at M = 16, K 896 (seven scale
    blocks per row: Triton compiles one variant for scale strides that are multiples of 16 and
    one for the others, such as K 7,168's 56), which SM 9.0 sends to Triton at decode sizes
    (``dispatch_rules/gemm_fp8_groupwise.toml``)."""
    calls = [(f"bmm_fp8[m{m}]", lambda device, backend, m=m: _bmm_fp8_call(device, backend, m))
             for m in (16, 64, 512)]
    calls.append(("bmm_fp8[m16,n128,k512]",
                  lambda device, backend: _bmm_fp8_call(device, backend, 16, n=128, k=512)))
    calls += [(f"gemm_fp8_nt_groupwise[128x128,m{m}]",
               lambda device, backend, m=m: _groupwise_call(device, backend, m)) for m in (16, 64)]
    calls.append(("gemm_fp8_nt_groupwise[1x128,m16]",
                  lambda device, backend: _groupwise_call(device, backend, 16, rows_per_scale=1,
                                                          k=896)))
    return calls


#: the MLA warm-up grid: DeepSeek's latent attention (ckv 512 + kpe 64, bf16 queries) at 128
#: heads (one GPU) and 16 (8-way tensor parallel), pages 1 / 16 / 64, bf16 and fp8 caches, one
#: query token; batches 1 / 16 / 64 / 128 at kv 4096 (the split counts, and so the merge
#: kernels, of those batches) and 4 requests of 200 tokens (one split: no merge)
MLA_HEADS, MLA_PAGES, MLA_KV_DTYPES = (128, 16), (1, 16, 64), ("bfloat16", "float8_e4m3fn")
MLA_BATCHES = ((1, 4096), (16, 4096), (64, 4096), (128, 4096), (4, 200))


def mla_calls() -> list[tuple[str, Callable]]:
    """The MLA warm-up calls: ``(name, fn(device, backend) -> output)``, inputs drawn from a
    fixed seed; names separate their fields with ``:`` (``--only`` splits at commas). The Triton MLA kernel compiles per head count, page size, cache dtype and
    whether the keys are split; its merge per split count (which follows from the batch and the
    lengths, :func:`flashinfer.backends.triton.mla.launch_config`). The kernel pack is exported
    with ``backend="triton"`` (a machine without FlashMLA runs Triton on SM 9.0 too)."""
    return [(f"mla[h{h}:page{p}:{dt}:b{b}:kv{kv}]",
             lambda device, backend, a=(h, p, dt, b, kv): _mla_call(device, backend, *a))
            for h in MLA_HEADS for p in MLA_PAGES for dt in MLA_KV_DTYPES
            for b, kv in MLA_BATCHES]


#: the state-merge warm-up grid (cascade levels, shared-prefix wrappers): query heads 8 and 32
#: (the two head tiles of a 128-wide head), head dims 64 / 128 / 256, fp16 and bf16 states
MERGE_HEADS, MERGE_DIMS, MERGE_DTYPES = (8, 32), (64, 128, 256), ("bfloat16", "float16")


def merge_calls() -> list[tuple[str, Callable]]:
    """The state-merge warm-up calls: ``merge_state``, ``merge_state_in_place`` (also with a
    mask, a compile of its own) and ``merge_states`` of 3 states, per grid point; and FlashMLA's
    helper kernels: the block table its CUDA-graph decode rebuilds, the fp8 latent gather of
    ``flashmla:dequant`` at each warm page size (they compile the same without FlashMLA)."""
    calls = [(f"merge[{fn}:h{h}:d{d}:{dt}]",
              lambda device, backend, a=(fn, h, d, dt): _merge_call(device, backend, *a))
             for fn in ("merge_state", "merge_state_in_place", "merge_state_in_place+mask",
                        "merge_states")
             for h in MERGE_HEADS for d in MERGE_DIMS for dt in MERGE_DTYPES]
    return calls + [("block_table[mla_graph]", _block_table_call)] + [
        (f"latent_gather[page{p}:float8_e4m3fn]",
         lambda device, backend, p=p: _latent_gather_call(device, p)) for p in MLA_PAGES]


def _merge_call(device, backend: str, fn: str, heads: int, dim: int, dtype: str):
    from .attention import merge

    rows = 64
    gen = torch.Generator(device=device).manual_seed(heads * dim)
    v = torch.randn(rows, 3, heads, dim, generator=gen, device=device).to(getattr(torch, dtype))
    s = torch.randn(rows, 3, heads, generator=gen, device=device)
    if fn == "merge_states":
        return merge.merge_states(v, s, backend=backend)[0]
    if fn == "merge_state":
        return merge.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1], backend=backend)[0]
    out, lse = v[:, 0].contiguous(), s[:, 0].contiguous()
    mask = torch.ones(rows, dtype=torch.bool, device=device) if fn.endswith("+mask") else None
    merge.merge_state_in_place(out, lse, v[:, 1], s[:, 1], mask=mask, backend=backend)
    return out


def _latent_gather_call(device, page: int):
    from .attention.mla_params import MLA_PAGE
    from .backends.shared.latent_gather import gather_latent, gathered_layout

    batch, kv = 4, 200
    pages_each = -(-kv // page)
    lens = torch.full((batch,), kv, dtype=torch.int32)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_each
    cache = torch.randn(batch * pages_each, page, 576, device=device).to(torch.float8_e4m3fn)
    page_indptr, req, first = gathered_layout(lens.numpy())
    out = torch.empty(int(page_indptr[-1]), 64, 576, dtype=torch.bfloat16, device=device)
    dev = lambda a: torch.as_tensor(a).to(device)  # noqa: E731
    gather_latent(out, cache[..., :512], cache[..., 512:], dev(req), dev(first), dev(indptr),
                  dev(torch.arange(batch * pages_each, dtype=torch.int32)), dev(lens), 1.0, 1.0,
                  MLA_PAGE)
    return out


def _block_table_call(device, backend: str):
    """The block-table kernel (it runs under FlashMLA, but compiles the same without it)."""
    from .attention.mla_params import MLA_PAGE
    from .backends.shared.block_table import fill_block_table

    batch, pages_each = 64, 64
    indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * pages_each
    ids = torch.randperm(batch * pages_each, device=device).to(torch.int32)
    table = torch.zeros(batch, pages_each, dtype=torch.int32, device=device)
    fill_block_table(table, indptr, ids, batch * pages_each, MLA_PAGE)
    return table


_MLA_WORKSPACE: dict = {}


def _mla_call(device, backend: str, heads: int, page: int, kv_dtype: str, batch: int,
              kv: int) -> torch.Tensor:
    from .attention.mla_wrapper import BatchMLAPagedAttentionWrapper

    gen = torch.Generator(device=device).manual_seed(heads * 1000 + page * 10 + batch)
    pages_each = -(-kv // page)
    n_pages = batch * pages_each
    dtype = getattr(torch, kv_dtype)
    cache = torch.randn(n_pages, page, 576, generator=gen, device=device).to(dtype)
    q = torch.randn(batch, heads, 576, generator=gen, device=device).to(torch.bfloat16)
    key = str(device)
    if key not in _MLA_WORKSPACE:
        _MLA_WORKSPACE[key] = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    w = BatchMLAPagedAttentionWrapper(_MLA_WORKSPACE[key], backend=backend)
    ids = torch.randperm(n_pages, generator=torch.Generator().manual_seed(batch), dtype=torch.int32)
    w.plan(torch.arange(batch + 1, dtype=torch.int32), torch.arange(batch + 1, dtype=torch.int32)
           * pages_each, ids, torch.full((batch,), kv, dtype=torch.int32), heads, 512, 64, page,
           False, 192 ** -0.5, torch.bfloat16, dtype)
    scales = dict(ckv_scale=1.0, kpe_scale=1.0) if dtype == torch.float8_e4m3fn else {}
    return w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], **scales)


def _fp8(shape, gen, device) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=device).to(torch.float8_e4m3fn)


def _bmm_fp8_call(device, backend: str, m: int, n: int = 512, k: int = 128) -> torch.Tensor:
    from .gemm import bmm_fp8

    gen = torch.Generator(device=device).manual_seed(m + n)
    a, b = _fp8((2, m, k), gen, device), _fp8((2, n, k), gen, device).transpose(1, 2)
    scale = torch.full((1,), 0.5, device=device)
    return bmm_fp8(a, b, scale, scale, torch.bfloat16, backend=backend)


def _groupwise_call(device, backend: str, m: int, rows_per_scale: int = 128,
                    k: int = 512) -> torch.Tensor:
    from .gemm import gemm_fp8_nt_groupwise

    gen = torch.Generator(device=device).manual_seed(m + rows_per_scale)
    a, b = _fp8((m, k), gen, device), _fp8((512, k), gen, device)
    a_scale = torch.rand(-(-m // rows_per_scale), k // 128, generator=gen, device=device) + 0.5
    b_scale = torch.rand(4, k // 128, generator=gen, device=device) + 0.5
    return gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, "K", 1, (rows_per_scale, 128, 128),
                                 backend=backend)


def _matching(calls: list, only: str) -> list:
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    return [(name, fn) for name, fn in calls if not wanted or any(w in name for w in wanted)]


def check_only(only: str) -> None:
    """ValueError naming every warm-up call when ``only`` (comma-separated substrings) matches
    none of them."""
    if (only.strip() and not select_calls(only) and not select_gemm_calls(only)
            and not select_mla_calls(only) and not select_merge_calls(only)):
        names = [name for name, _ in sampling_calls() + gemm_calls()] + ["mla[...]", "merge[...]",
                                                                         "block_table[...]"]
        raise ValueError(f"--only {only!r} matches no warm-up call; names: {', '.join(names)}")


def select_calls(only: str = "") -> list[tuple[str, Callable]]:
    """:func:`sampling_calls` whose name contains one of the comma-separated substrings of
    ``only`` (all when empty)."""
    return _matching(sampling_calls(), only)


def select_gemm_calls(only: str = "") -> list[tuple[str, Callable]]:
    """:func:`gemm_calls` picked by ``only`` as :func:`select_calls` picks."""
    return _matching(gemm_calls(), only)


def select_mla_calls(only: str = "") -> list[tuple[str, Callable]]:
    """:func:`mla_calls` picked by ``only`` as :func:`select_calls` picks."""
    return _matching(mla_calls(), only)


def select_merge_calls(only: str = "") -> list[tuple[str, Callable]]:
    """:func:`merge_calls` picked by ``only`` as :func:`select_calls` picks."""
    return _matching(merge_calls(), only)


def warm_sampling(vocab_sizes, device: str | torch.device = "cuda", rows: int = 2,
                  only: str = "") -> list[dict]:
    """Call every sampling function (those :func:`select_calls` picks with ``only``) once per
    vocabulary in ``vocab_sizes`` on ``device``; returns one ``{"function", "vocab", "seconds",
    "kernel"}`` per call (``kernel``: the Decision)."""
    from .dispatch import record_decisions

    calls = select_calls(only)
    results = []
    for vocab in vocab_sizes:
        gen = torch.Generator(device=device).manual_seed(vocab)
        logits = torch.randn(rows, vocab, device=device, generator=gen) * 4.0
        probs = torch.softmax(logits, -1)
        ks = torch.full((rows,), 50, dtype=torch.int32, device=device)
        ps = torch.full((rows,), 0.9, dtype=torch.float32, device=device)
        for name, call in calls:
            start = time.perf_counter()
            with record_decisions() as log:
                call(probs, logits, ks, ps)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            results.append({"function": name, "vocab": vocab,
                            "seconds": time.perf_counter() - start,
                            "kernel": "+".join(sorted({d.name for d in log})) or None})
    return results


def warm_gemm(device: str | torch.device = "cuda", only: str = "") -> list[dict]:
    """Run every GEMM warm-up call (those :func:`select_gemm_calls` picks) once on ``device``
    with ``backend="auto"``; one ``{"function", "seconds", "kernel"}`` per call."""
    return [_timed(name, device, call, device, "auto") for name, call in select_gemm_calls(only)]


def _timed(name: str, device, call: Callable, *args) -> dict:
    """``{"function", "seconds", "kernel"}`` of one warm-up call (its time to completion on the
    device, and the kernels its Decisions named)."""
    from .dispatch import record_decisions

    start = time.perf_counter()
    with record_decisions() as log:
        call(*args)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return {"function": name, "seconds": time.perf_counter() - start,
            "kernel": "+".join(sorted({d.name for d in log})) or None}


def warm_mla(device: str | torch.device = "cuda", only: str = "",
             backend: str = "auto") -> list[dict]:
    """Run every MLA warm-up call (those :func:`select_mla_calls` picks) once on ``device``;
    one ``{"function", "seconds", "kernel"}`` per call."""
    try:
        return [_timed(name, device, call, device, backend)
                for name, call in select_mla_calls(only)]
    finally:
        _MLA_WORKSPACE.clear()


def warm_merge(device: str | torch.device = "cuda", only: str = "") -> list[dict]:
    """Run every merge warm-up call (those :func:`select_merge_calls` picks) once on ``device``
    with ``backend="auto"``; one ``{"function", "seconds", "kernel"}`` per call."""
    return [_timed(name, device, call, device, "auto") for name, call in select_merge_calls(only)]


#: quantisation of the experts a MoE warm-up builds (``--moe-quant``)
MOE_QUANTS = ("fp8_block", "bf16")


def moe_calls(experts: int, top_k: int, hidden: int, inter: int,
              quant: str = "fp8_block") -> list[tuple[str, Callable]]:
    """The fused-MoE warm-up calls of one layer: ``(name, fn(device))``. ``quant``:
    ``"fp8_block"`` (fp8 experts with 128x128 scales, bf16 activations: DeepSeek-V3) or
    ``"bf16"``. Token counts: 1, and 12 and 128 pairs per expert (one in each tile bucket of
    the Triton MoE's ``launch_config``)."""
    if quant not in MOE_QUANTS:
        raise ValueError(f"quant must be one of {MOE_QUANTS}, got {quant!r}")
    if min(experts, top_k, hidden, inter) < 1 or top_k > experts:
        raise ValueError(f"--moe needs positive sizes and top_k <= experts, got experts={experts}, "
                         f"top_k={top_k}, hidden={hidden}, inter={inter}")
    counts = sorted({1, -(-12 * experts // top_k), -(-128 * experts // top_k)})
    layer = (experts, top_k, hidden, inter, quant)
    return [(f"cutlass_fused_moe[{quant},E{experts},k{top_k},H{hidden},I{inter},T{t}]",
             lambda device, t=t: _moe_call(device, layer, t)) for t in counts]


def _moe_call(device, layer: tuple, tokens: int) -> torch.Tensor:
    from .fused_moe import cutlass_fused_moe

    experts, top_k, hidden, inter, quant = layer
    weights = _moe_weights(device, layer)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    slots = torch.arange(tokens * top_k, device=device).view(tokens, top_k)
    ids = ((slots // top_k * 7 + slots % top_k) % experts).to(torch.int32)  # distinct per row
    scales = torch.full((tokens, top_k), 1.0 / top_k, device=device)
    w1, w2, quant_scales = weights
    return cutlass_fused_moe(x, ids, scales, w1, w2, torch.bfloat16, quant_scales,
                             use_deepseek_fp8_block_scale=quant == "fp8_block")


_MOE_WEIGHTS: dict = {}


def _moe_weights(device, layer: tuple):
    """One layer's experts (uninitialised), kept for the next call of the same warm-up."""
    key = (str(device), layer)
    if key not in _MOE_WEIGHTS:
        _MOE_WEIGHTS.clear()
        experts, top_k, hidden, inter, quant = layer
        dtype = torch.float8_e4m3fn if quant == "fp8_block" else torch.bfloat16
        w1 = torch.empty(experts, 2 * inter, hidden, device=device, dtype=dtype)
        w2 = torch.empty(experts, hidden, inter, device=device, dtype=dtype)
        scales = []
        if quant == "fp8_block":
            blocks = lambda n: -(-n // 128)
            scales = [torch.ones(experts, blocks(2 * inter), blocks(hidden), device=device),
                      torch.ones(experts, blocks(hidden), blocks(inter), device=device)]
        _MOE_WEIGHTS[key] = (w1, w2, scales)
    return _MOE_WEIGHTS[key]


def warm_moe(device, experts: int, top_k: int, hidden: int, inter: int,
             quant: str = "fp8_block") -> list[dict]:
    """Run every call of :func:`moe_calls` once on ``device`` (``backend="auto"``); one
    ``{"function", "seconds", "kernel"}`` per call. The weights are freed afterwards."""
    try:
        return [_timed(name, device, call, device)
                for name, call in moe_calls(experts, top_k, hidden, inter, quant)]
    finally:
        _MOE_WEIGHTS.clear()


def cutlass_specs(sm: tuple[int, int]) -> tuple:
    """The CUTLASS adapter's kernels for the ops whose ``cutlass`` capability records admit
    ``sm`` (``flashinfer warmup --cutlass`` compiles these)."""
    from .backends import cutlass
    from .capability_db import database

    admitted = {r.op for r in database().records if r.backend == "cutlass"
                and (r.sm_min is None or sm >= r.sm_min) and (r.sm_max is None or sm <= r.sm_max)}
    return cutlass.specs_for(admitted)
