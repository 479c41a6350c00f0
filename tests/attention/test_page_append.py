"""append_paged_kv_cache through the dispatcher: reference and Triton kernels against a naive loop,
validation, Decisions on simulated SMs, and (GPU) Triton vs reference incl. an fp8 cache."""

import pytest
import torch

import flashinfer
from flashinfer import dispatch
from flashinfer.device import simulated, sm_family
from flashinfer.dispatch import BackendUnavailableError, Problem, select

# old and newly appended tokens per request: appends start mid-page and cross page boundaries
OLD = [3, 0, 14, 16]
NEW = [2, 5, 19, 1]


def make_case(layout, page_size, form, dtype=torch.float32, device="cpu", heads=3, head_dim=8,
              old=OLD, new=NEW, index_dtype=torch.int32):
    """A cache with random contents, a shuffled page table covering old + new tokens, the
    appended K/V and their (batch_indices, positions)."""
    seq = [o + n for o, n in zip(old, new)]
    pages = [-(-s // page_size) for s in seq]
    total_pages = sum(pages) + 3  # some pages belong to nobody
    indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=index_dtype)
    indices = torch.randperm(total_pages)[:sum(pages)].to(index_dtype)
    last = torch.tensor([(s - 1) % page_size + 1 for s in seq], dtype=torch.int32)
    inner = (page_size, heads, head_dim) if layout == "NHD" else (heads, page_size, head_dim)
    cache = torch.randn(total_pages, 2, *inner).to(dtype)
    nnz = sum(new)
    k_app = torch.randn(nnz, heads, head_dim).to(dtype)
    v_app = torch.randn(nnz, heads, head_dim).to(dtype)
    append_indptr = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32)
    b, p = flashinfer.get_batch_indices_positions(append_indptr, torch.tensor(seq, dtype=torch.int32), nnz)
    b, p = b.to(index_dtype), p.to(index_dtype)
    case = dict(k_app=k_app, v_app=v_app, b=b, p=p, cache=cache, indices=indices, indptr=indptr,
                last=last)
    case = {k: v.to(device) for k, v in case.items()}
    case["paged"] = case["cache"] if form == "5d" else (case["cache"][:, 0], case["cache"][:, 1])
    return case


def naive(case, layout):
    """The expected cache, one token and one head at a time, from plain Python indices."""
    expected = case["cache"].clone()
    for t in range(case["k_app"].shape[0]):
        bi, pos = int(case["b"][t]), int(case["p"][t])
        page_size = expected.shape[2] if layout == "NHD" else expected.shape[3]
        page = int(case["indices"][int(case["indptr"][bi]) + pos // page_size])
        slot = pos % page_size
        for h in range(case["k_app"].shape[1]):
            for kv, src in ((0, case["k_app"]), (1, case["v_app"])):
                if layout == "NHD":
                    expected[page, kv, slot, h] = src[t, h]
                else:
                    expected[page, kv, h, slot] = src[t, h]
    return expected


def append(case, layout, backend="auto"):
    flashinfer.append_paged_kv_cache(case["k_app"], case["v_app"], case["b"], case["p"],
                                     case["paged"], case["indices"], case["indptr"], case["last"],
                                     layout, backend=backend)


def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("form", ["5d", "tuple"])
def test_append_matches_naive_loop(backend, layout, page_size, form):
    torch.manual_seed(1)
    case = make_case(layout, page_size, form)
    expected = naive(case, layout)
    with dispatch.record_decisions() as log:
        append(case, layout, backend)
    assert log[-1].backend == backend
    assert torch.equal(case["cache"], expected)


def _head_dims_case(layout, device, dims=(24, 8)):
    """A case whose V cache has another head dim than K's (MLA's latent / RoPE parts, 192 / 128),
    each cache with spare slots around every row so a write past a row shows."""
    torch.manual_seed(3)
    case = make_case(layout, 4, "tuple", device=device, head_dim=dims[0])
    k_cache = case["paged"][0]
    inner = list(k_cache.shape)
    inner[-1] = dims[1]
    v_cache = torch.randn(inner, device=device)
    case["v_app"] = torch.randn(case["k_app"].shape[:2] + (dims[1],), device=device)
    case["paged"] = (k_cache, v_cache)
    return case


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dims", [(24, 8), (8, 24)])
def test_append_k_and_v_of_different_head_dims(layout, dims):
    """Triton (interpreter) writes exactly what the reference writes when K's and V's head dims
    differ, and nothing past V's rows."""
    results = []
    for backend in ("reference", "triton"):
        case = _head_dims_case(layout, "cpu", dims)
        append(case, layout, backend)
        results.append(tuple(c.clone() for c in case["paged"]))
    for want, got in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_page_size_one_4d_cache_int64_indices(backend, layout):
    torch.manual_seed(2)
    case = make_case(layout, 1, "5d", index_dtype=torch.int64)
    expected = naive(case, layout)
    case["paged"] = case["cache"].squeeze(2 if layout == "NHD" else 3)  # [pages, 2, H, D], a view
    append(case, layout, backend)
    assert torch.equal(case["cache"], expected)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_append_copies_every_dtype_bit_exact(backend, dtype):
    torch.manual_seed(3)
    case = make_case("HND", 16, "tuple", dtype=dtype, heads=2, head_dim=16)
    expected = naive(case, "HND")
    append(case, "HND", backend)
    assert torch.equal(bits(case["cache"]), bits(expected))


def test_triton_wide_heads_span_several_programs():
    torch.manual_seed(4)  # head_dim 256 x 16 heads: 8 heads per program, 2 head blocks per token
    case = make_case("NHD", 16, "5d", heads=16, head_dim=256, old=[5, 17], new=[3, 2])
    expected = naive(case, "NHD")
    append(case, "NHD", "triton")
    assert torch.equal(case["cache"], expected)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_append_nothing_leaves_cache_unchanged(backend):
    torch.manual_seed(5)
    case = make_case("NHD", 16, "5d", old=[4, 2], new=[0, 0])
    before = case["cache"].clone()
    append(case, "NHD", backend)
    assert torch.equal(case["cache"], before)


def test_auto_on_cpu_runs_the_reference_and_builds_the_problem():
    torch.manual_seed(6)
    case = make_case("HND", 16, "tuple", heads=2, head_dim=8)
    with dispatch.record_decisions() as log:
        append(case, "HND")
    problem = log[-1].problem
    assert log[-1].backend == "reference"
    assert (problem.op, problem.layout, dict(problem.dtypes)) == ("append_paged_kv", "HND", {"kv": "float32"})
    assert dict(problem.shape) == {"num_kv_heads": 2, "head_dim": 8, "page_size": 16,
                                   "num_tokens": 32}  # 27 tokens, bucketed


# --- validation: one test per rule ---------------------------------------------------------

def _bad(layout="NHD", **changes):
    torch.manual_seed(7)
    case = make_case(layout, 4, "tuple", heads=2, head_dim=8, old=[1], new=[3])
    case.update(changes)
    return case


def test_rejects_append_dtype_other_than_cache():
    case = _bad()
    case["k_app"] = case["k_app"].half()
    with pytest.raises(TypeError, match="append_key dtype torch.float16 must equal the cache dtype"):
        append(case, "NHD")


def test_rejects_k_and_v_caches_of_different_dtypes():
    case = _bad()
    case["paged"] = (case["paged"][0], case["paged"][1].half())
    with pytest.raises(ValueError, match="paged_kv_cache: v_cache"):
        append(case, "NHD")


def test_rejects_append_shape_mismatch():
    case = _bad()
    case["v_app"] = case["v_app"][:, :1]
    with pytest.raises(ValueError, match="append_value shape"):
        append(case, "NHD")


def test_rejects_append_wrong_rank():
    case = _bad()
    case["k_app"] = case["k_app"].flatten(1)
    with pytest.raises(ValueError, match="append_key must be a \\[nnz, H_kv, D\\]"):
        append(case, "NHD")


@pytest.mark.parametrize("name", ["b", "p", "indices", "indptr"])
def test_rejects_float_index_tensors(name):
    case = _bad()
    case[name] = case[name].float()
    label = {"b": "batch_indices", "p": "positions", "indices": "kv_indices", "indptr": "kv_indptr"}[name]
    with pytest.raises(ValueError, match=f"{label} must be a 1-D int32 or int64 tensor"):
        append(case, "NHD")


def test_rejects_positions_of_wrong_length():
    case = _bad()
    case["p"] = case["p"][:-1]
    with pytest.raises(ValueError, match="batch_indices and positions must have nnz=3"):
        append(case, "NHD")


def test_rejects_bad_layout():
    with pytest.raises(ValueError, match="kv_layout"):
        append(_bad(), "NDH")


def test_named_backend_without_a_kernel_raises_with_reasons(monkeypatch):
    """cudnn (upstream's kernel name) is strict under FLASHINFER_STRICT=1; flash_attn always."""
    with pytest.raises(BackendUnavailableError, match="flash_attn"):
        append(_bad(), "NHD", "flash_attn")
    monkeypatch.setenv("FLASHINFER_STRICT", "1")
    with pytest.raises(BackendUnavailableError, match="cudnn"):
        append(_bad(), "NHD", "cudnn")


# --- Decisions on simulated devices --------------------------------------------------------

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


def _problem(sm, dtype="bfloat16", layout="NHD"):
    return Problem.make("append_paged_kv", simulated(sm), dtypes={"kv": dtype},
                        shape={"num_kv_heads": 8, "head_dim": 128, "page_size": 16,
                               "num_tokens": 256}, layout=layout)


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decision_per_sm(sm, dtype, layout):
    decision = select(_problem(sm, dtype, layout), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.source == "default" and "page_append_h200" in decision.basis
    assert {c.backend for c in decision.candidates} == {"reference", "triton"}
    if sm == "cpu":
        assert decision.backend == "reference" and decision.rule == "priority[cpu]"
        assert [r.field for r in triton.reasons] == ["device"]
    else:
        assert decision.backend == "triton" and decision.order == ("triton", "reference")
        assert decision.rule == f"priority[{sm_family(simulated(sm).sm)}]"
        assert triton.usable and triton.verified == (sm == "9.0")  # verified_on = ["9.0"]


@pytest.mark.parametrize("sm", ["7.0", "13.0"])
def test_decision_outside_triton_sm_range_falls_back_to_reference(sm):
    decision = select(_problem(sm), assume_installed=True)
    triton = next(c for c in decision.candidates if c.backend == "triton")
    assert decision.backend == "reference" and [r.field for r in triton.reasons] == ["sm"]


def test_decision_on_cpu_under_the_interpreter_still_prefers_the_reference():
    decision = select(_problem("cpu"), triton_interpret=True)
    assert decision.backend == "reference" and decision.order == ("reference", "triton")


# --- GPU: Triton vs reference ---------------------------------------------------------------

GPU_SHAPES = [  # (heads, head_dim, old, new)
    (2, 64, [3, 0, 14], [2, 5, 19]),
    (8, 128, [100, 0, 517, 1000], [1, 300, 64, 77]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("form", ["5d", "tuple"])
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_gpu_triton_matches_reference(dtype, layout, page_size, form, shape):
    heads, head_dim, old, new = shape
    results = []
    for backend in ("reference", "triton"):
        torch.manual_seed(8)
        case = make_case(layout, page_size, form, dtype=dtype, device="cuda", heads=heads,
                         head_dim=head_dim, old=old, new=new)
        before = bits(case["cache"]).clone()
        append(case, layout, backend)
        assert not torch.equal(bits(case["cache"]), before)
        results.append(bits(case["cache"]))
    assert torch.equal(results[0], results[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(512, 64), (192, 128)])
def test_gpu_append_k_and_v_of_different_head_dims(dims):
    results = []
    for backend in ("reference", "triton"):
        case = _head_dims_case("NHD", "cuda", dims)
        append(case, "NHD", backend)
        results.append(tuple(bits(c).clone() for c in case["paged"]))
    for want, got in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_gpu_auto_picks_triton_and_never_syncs():
    torch.manual_seed(9)
    case = make_case("NHD", 16, "5d", dtype=torch.bfloat16, device="cuda", heads=8, head_dim=128)
    expected = case["cache"].clone()
    append({**case, "paged": expected}, "NHD", "reference")
    append(case, "NHD")  # warm up: compile the kernel, decide
    with dispatch.record_decisions() as log:
        torch.cuda.set_sync_debug_mode("error")
        try:
            append(case, "NHD")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert log[-1].backend == "triton"
    assert torch.equal(case["cache"], expected)


# --- torch.compile ---------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["5d", "tuple"])
def test_compile_fullgraph_traces_the_append(form):
    """The custom op flashinfer::append_paged_kv_cache: a compiled function mutates the cache
    exactly as eager does."""
    torch.manual_seed(11)
    case = make_case("NHD", 4, form)
    expected = naive(case, "NHD")

    def f(k_app, v_app, b, p, paged, indices, indptr, last):
        flashinfer.append_paged_kv_cache(k_app, v_app, b, p, paged, indices, indptr, last, "NHD")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    compiled(case["k_app"], case["v_app"], case["b"], case["p"], case["paged"], case["indices"],
             case["indptr"], case["last"])
    assert torch.equal(case["cache"], expected)
