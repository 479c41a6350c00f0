"""Fuzz suite, paged-KV utilities: generated calls with one index wrong must raise a ValueError
naming the argument and its entry (index arrays on the CPU, or FLASHINFER_CHECK_INDICES=1), or,
with the arrays on a GPU, skip the bad entries, write every valid token exactly, nothing else,
and leave the fault in the error record; valid calls must match naive Python loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flashinfer
from flashinfer import index_checks

from conftest import FUZZ, HAS_CUDA, raises_naming


BAD_KINDS = ("batch_big", "batch_neg", "pos_neg", "pos_past", "page_big", "page_neg", "indptr")
ARGUMENT = {"batch_big": "batch_indices", "batch_neg": "batch_indices", "pos_neg": "positions",
            "pos_past": "positions", "page_big": "kv_indices", "page_neg": "kv_indices",
            "indptr": "kv_indptr"}


@st.composite
def append_cases(draw, bad: bool):
    """A valid append problem (distinct target slots), then, when ``bad``, one index made wrong."""
    page_size = draw(st.sampled_from([1, 3, 4]))
    batch = draw(st.integers(1, 3))
    pages = [draw(st.integers(0, 3)) for _ in range(batch)]
    used = sum(pages)
    num_pages = used + draw(st.integers(0, 2))
    order = draw(st.permutations(range(num_pages))) if num_pages else []
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    slots = [(b, p) for b in range(batch) for p in range(pages[b] * page_size)]
    chosen = draw(st.lists(st.sampled_from(slots), min_size=1 if bad else 0, max_size=5,
                           unique=True)) if slots else []
    case = {
        "page_size": page_size, "num_pages": num_pages, "heads": draw(st.sampled_from([1, 2])),
        "head_dim": draw(st.sampled_from([4, 8])), "layout": draw(st.sampled_from(["NHD", "HND"])),
        "dtype": draw(st.sampled_from([torch.float32, torch.bfloat16])),
        "index_dtype": draw(st.sampled_from([torch.int32, torch.int64])),
        "kv_indptr": indptr, "kv_indices": list(order[:used]),
        "batch_indices": [b for b, _ in chosen], "positions": [p for _, p in chosen],
        "kind": None,
    }
    if bad:
        if not chosen:
            case["kind"] = "skip"
            return case
        kind = draw(st.sampled_from(BAD_KINDS))
        t = draw(st.integers(0, len(chosen) - 1))
        extra = draw(st.integers(0, 1000))
        b, p = chosen[t]
        j = indptr[b] + p // page_size
        if kind == "batch_big":
            case["batch_indices"][t] = batch + extra
        elif kind == "batch_neg":
            case["batch_indices"][t] = -1 - extra
        elif kind == "pos_neg":
            case["positions"][t] = -1 - extra
        elif kind == "pos_past":
            case["positions"][t] = pages[b] * page_size + extra
        elif kind == "page_big":
            case["kv_indices"][j] = num_pages + extra
        elif kind == "page_neg":
            case["kv_indices"][j] = -1 - extra
        else:  # request b's pages end before they start
            case["kv_indptr"][b + 1] = indptr[b] - 1 - extra
        case["kind"] = kind
    return case


def _tensors(case, device):
    g = torch.Generator().manual_seed(len(case["positions"]) * 7 + case["num_pages"])
    nnz, h, d, ps = len(case["positions"]), case["heads"], case["head_dim"], case["page_size"]
    shape = (case["num_pages"], 2, ps, h, d) if case["layout"] == "NHD" else (case["num_pages"], 2, h, ps, d)
    cache = torch.randn(shape, generator=g).to(case["dtype"]).to(device)
    k = torch.randn(nnz, h, d, generator=g).to(case["dtype"]).to(device)
    v = torch.randn(nnz, h, d, generator=g).to(case["dtype"]).to(device)
    idx = {name: torch.tensor(case[name], dtype=case["index_dtype"], device=device).reshape(-1)
           for name in ("batch_indices", "positions", "kv_indices", "kv_indptr")}
    last = torch.ones(len(case["kv_indptr"]) - 1, dtype=torch.int32, device=device)
    return cache, k, v, idx, last


def _naive_append(cache, k, v, case, keep=lambda t: True):
    """The append as a Python loop over the tokens ``keep`` accepts (float64 comparison not
    needed: the append is a copy, so the result must be bit exact)."""
    out = cache.clone()
    ps = case["page_size"]
    for t, (b, p) in enumerate(zip(case["batch_indices"], case["positions"])):
        if not keep(t):
            continue
        page = case["kv_indices"][case["kv_indptr"][b] + p // ps]
        if case["layout"] == "NHD":
            out[page, 0, p % ps], out[page, 1, p % ps] = k[t], v[t]
        else:
            out[page, 0, :, p % ps], out[page, 1, :, p % ps] = k[t], v[t]
    return out


def _valid_token(case, t) -> bool:
    """Whether token ``t`` of a possibly mutated case obeys every append rule."""
    b, p, ps = case["batch_indices"][t], case["positions"][t], case["page_size"]
    ind, ids = case["kv_indptr"], case["kv_indices"]
    if not 0 <= b < len(ind) - 1:
        return False
    start, end = ind[b], ind[b + 1]
    if not (0 <= start <= end <= len(ids)) or not 0 <= p < (end - start) * ps:
        return False
    return 0 <= ids[start + p // ps] < case["num_pages"]


def _append(cache, k, v, idx, last, case, backend):
    flashinfer.append_paged_kv_cache(k, v, idx["batch_indices"], idx["positions"], cache,
                                     idx["kv_indices"], idx["kv_indptr"], last,
                                     kv_layout=case["layout"], backend=backend)


#: on the CPU Triton runs in its interpreter, which is only on without CUDA (with a GPU, the GPU
#: tests below run the Triton kernel natively)
CPU_BACKENDS = ["reference"] + ([] if HAS_CUDA else ["triton"])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ
@given(case=append_cases(bad=False))
def test_valid_append_matches_the_naive_loop(backend, case):
    cache, k, v, idx, last = _tensors(case, "cpu")
    want = _naive_append(cache, k, v, case)
    _append(cache, k, v, idx, last, case, backend)
    assert torch.equal(cache, want)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@FUZZ
@given(case=append_cases(bad=True))
def test_one_bad_index_raises_naming_it_and_writes_nothing(backend, case):
    if case["kind"] == "skip":
        return
    cache, k, v, idx, last = _tensors(case, "cpu")
    before = cache.clone()
    with raises_naming("append_paged_kv_cache", ARGUMENT[case["kind"]] + "["):
        _append(cache, k, v, idx, last, case, backend)
    assert torch.equal(cache, before)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs without CUDA only; the GPU tests cover it")
@FUZZ
@given(case=append_cases(bad=True))
def test_triton_kernel_skips_bad_tokens_and_records_them(case):
    """The kernel itself (no host check in front of it), in Triton's interpreter on the CPU."""
    if case["kind"] == "skip":
        return
    from flashinfer.backends.triton import page as triton_page
    from flashinfer.page import unpack_paged_kv_cache

    cache, k, v, idx, _ = _tensors(case, "cpu")
    want = _naive_append(cache, k, v, case, keep=lambda t: _valid_token(case, t))
    kc, vc = unpack_paged_kv_cache(cache, case["layout"])
    triton_page.append_paged_kv(k, v, idx["batch_indices"], idx["positions"], kc, vc,
                                idx["kv_indices"], idx["kv_indptr"], case["page_size"],
                                case["layout"])
    assert torch.equal(cache, want)
    with raises_naming("append_paged_kv_cache", ARGUMENT[case["kind"]] + "[", "skipped"):
        flashinfer.check_errors()


# --------------------------------------------------------------------------------------------
# get_batch_indices_positions, get_seq_lens


@st.composite
def positions_cases(draw):
    counts = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    seq = [c + draw(st.integers(0, 5)) for c in counts]
    return counts, seq


def _indptr(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


@FUZZ
@given(case=positions_cases(), out_buffers=st.booleans())
def test_batch_indices_positions_match_the_naive_loop(case, out_buffers):
    counts, seq = case
    indptr, nnz = _indptr(counts), sum(counts)
    want_b = [b for b, c in enumerate(counts) for _ in range(c)]
    want_p = [seq[b] - c + j for b, c in enumerate(counts) for j in range(c)]
    bufs = (torch.full((nnz,), -7, dtype=torch.int64), torch.full((nnz,), -7, dtype=torch.int64)) \
        if out_buffers else (None, None)
    b, p = flashinfer.get_batch_indices_positions(torch.tensor(indptr), torch.tensor(seq), nnz, *bufs)
    assert b.tolist() == want_b and p.tolist() == want_p


@FUZZ
@given(case=positions_cases(), kind=st.sampled_from(["short", "start", "order", "end"]),
       data=st.data())
def test_batch_indices_positions_bad_value_raises_naming_it(case, kind, data):
    counts, seq = case
    indptr, nnz = _indptr(counts), sum(counts)
    if kind == "short":
        busy = [b for b, c in enumerate(counts) if c]
        if not busy:
            return
        b = data.draw(st.sampled_from(busy))
        seq[b] = counts[b] - data.draw(st.integers(1, 9))
        words = ("seq_lens[", "appended count")
    elif kind == "start":
        indptr = [data.draw(st.integers(1, 3))] + indptr[1:]
        words = ("append_indptr[0]",)
    elif kind == "order":
        if len(indptr) < 3:
            return
        i = data.draw(st.integers(1, len(indptr) - 2))
        indptr[i] = indptr[i + 1] + data.draw(st.integers(1, 4))
        words = ("append_indptr[", "non-decreasing")
    else:
        nnz += data.draw(st.sampled_from([-1, 1, 5])) if nnz else 3
        words = ("append_indptr[", "nnz")
    with raises_naming("get_batch_indices_positions", *words):
        flashinfer.get_batch_indices_positions(torch.tensor(indptr), torch.tensor(seq), nnz)


@pytest.mark.parametrize("bad", [
    dict(nnz=-1, match="nnz"), dict(nnz=1.5, match="nnz", error=TypeError),
    dict(seq_lens=[1], match="seq_lens"), dict(append_indptr=[[0, 1]], match="append_indptr"),
    dict(batch_indices=torch.zeros(3, dtype=torch.int32), match="batch_indices"),
    dict(positions=torch.zeros(2, dtype=torch.float32), match="positions"),
])
def test_batch_indices_positions_bad_arguments(bad):
    args = {"append_indptr": [0, 1, 2], "seq_lens": [3, 4], "nnz": 2}
    error, match = bad.pop("error", ValueError), bad.pop("match")
    args.update(bad)
    for name in ("append_indptr", "seq_lens"):
        args[name] = torch.tensor(args[name])
    with pytest.raises(error, match=match):
        flashinfer.get_batch_indices_positions(**args)


@FUZZ
@given(pages=st.lists(st.integers(0, 4), min_size=1, max_size=5), page_size=st.integers(1, 8),
       data=st.data())
def test_seq_lens_match_upstream_formula_and_reject_bad_last_page_len(pages, page_size, data):
    last = [data.draw(st.integers(1 if n else 0, page_size)) for n in pages]
    indptr = torch.tensor(_indptr(pages))
    got = flashinfer.get_seq_lens(indptr, torch.tensor(last), page_size)
    assert got.dtype == torch.int32
    assert got.tolist() == [max(n - 1, 0) * page_size + l for n, l in zip(pages, last)]
    b = data.draw(st.integers(0, len(pages) - 1))
    last[b] = data.draw(st.sampled_from([-1, page_size + 1, 0 if pages[b] else -3]))
    if 0 <= last[b] <= page_size and (last[b] or not pages[b]):
        return  # the drawn value happens to be allowed
    with raises_naming("get_seq_lens", f"kv_last_page_len[{b}]", f"page_size = {page_size}"):
        flashinfer.get_seq_lens(indptr, torch.tensor(last), page_size)


def test_seq_lens_bad_arguments():
    ind, last = torch.tensor([0, 2, 1]), torch.tensor([1, 1])
    with raises_naming("kv_indptr[2] = 1", "non-decreasing"):
        flashinfer.get_seq_lens(ind, last, 4)
    with pytest.raises(ValueError, match="page_size"):
        flashinfer.get_seq_lens(torch.tensor([0, 1]), torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="kv_last_page_len must have 1 entries"):
        flashinfer.get_seq_lens(torch.tensor([0, 1]), torch.tensor([1, 1]), 4)
    with pytest.raises(ValueError, match="kv_indptr must be a 1-D int32 or int64"):
        flashinfer.get_seq_lens(torch.tensor([0.0, 1.0]), torch.tensor([1]), 4)


# --------------------------------------------------------------------------------------------
# GPU: the arrays on the device, every backend of the op


GPU_BACKENDS = ["reference", "triton"]
GPU_FUZZ = settings(FUZZ, max_examples=60)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@GPU_FUZZ
@given(case=append_cases(bad=False))
def test_gpu_valid_append_matches_the_naive_loop(backend, case):
    cache, k, v, idx, last = _tensors(case, "cuda")
    want = _naive_append(cache, k, v, case)
    _append(cache, k, v, idx, last, case, backend)
    assert torch.equal(cache, want)
    flashinfer.check_errors()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@GPU_FUZZ
@given(case=append_cases(bad=True))
def test_gpu_bad_index_is_skipped_recorded_and_raised_later(backend, case):
    if case["kind"] == "skip":
        return
    cache, k, v, idx, last = _tensors(case, "cuda")
    want = _naive_append(cache, k, v, case, keep=lambda t: _valid_token(case, t))
    _append(cache, k, v, idx, last, case, backend)  # no synchronisation, no exception here
    with raises_naming("append_paged_kv_cache", ARGUMENT[case["kind"]] + "["):
        flashinfer.check_errors()
    assert torch.equal(cache, want)  # every valid token written, nothing else touched


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@FUZZ
@given(case=append_cases(bad=True))
def test_gpu_check_indices_env_raises_at_the_call(backend, case, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "1")
    if case["kind"] == "skip":
        return
    cache, k, v, idx, last = _tensors(case, "cuda")
    before = cache.clone()
    with raises_naming("append_paged_kv_cache", ARGUMENT[case["kind"]] + "["):
        _append(cache, k, v, idx, last, case, backend)
    assert torch.equal(cache, before)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_bad_append_surfaces_at_the_next_plan(backend):
    """A fault recorded by a kernel is raised by a later plan() without any wait (poll)."""
    dev = torch.device("cuda")
    cache = torch.randn(4, 2, 4, 2, 16, device=dev, dtype=torch.float16)
    k = v = torch.randn(1, 2, 16, device=dev, dtype=torch.float16)
    i32 = dict(dtype=torch.int32, device=dev)
    flashinfer.append_paged_kv_cache(k, v, torch.tensor([0], **i32), torch.tensor([9], **i32),
                                     cache, torch.tensor([1], **i32), torch.tensor([0, 1], **i32),
                                     torch.tensor([1], **i32), backend=backend)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8, device=dev))
    args = (torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32), 2, 2, 16, 4)
    w.plan(*args, q_data_type=torch.float16)  # queues the copy of the record
    torch.cuda.synchronize()
    with raises_naming("positions[0] = 9"):
        w.plan(*args, q_data_type=torch.float16)
    w.plan(*args, q_data_type=torch.float16)  # raised once, then cleared


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_bad_append_inside_a_cuda_graph(backend):
    from conftest import capture_cuda_graph

    dev = torch.device("cuda")
    cache = torch.randn(4, 2, 4, 2, 16, device=dev, dtype=torch.bfloat16)
    k = v = torch.randn(2, 2, 16, device=dev, dtype=torch.bfloat16)
    i32 = dict(dtype=torch.int32, device=dev)
    batch, pos = torch.tensor([0, 0], **i32), torch.tensor([0, 1], **i32)
    indices, indptr = torch.tensor([2], **i32), torch.tensor([0, 1], **i32)
    last = torch.tensor([2], **i32)
    graph = capture_cuda_graph(lambda: flashinfer.append_paged_kv_cache(
        k, v, batch, pos, cache, indices, indptr, last, backend=backend))
    flashinfer.check_errors()
    before = cache.clone()
    indices[0] = 4  # the next replay reads a page id past the cache
    graph.replay()
    with raises_naming("kv_indices[0] = 4"):
        flashinfer.check_errors()
    assert torch.equal(cache, before)


@pytest.mark.gpu
@FUZZ
@given(case=positions_cases())
def test_gpu_batch_indices_positions_short_seq_lens_is_recorded(case):
    counts, seq = case
    busy = [b for b, c in enumerate(counts) if c]
    if not busy:
        return
    seq[busy[0]] = counts[busy[0]] - 1
    dev = torch.device("cuda")
    flashinfer.get_batch_indices_positions(torch.tensor(_indptr(counts), device=dev),
                                           torch.tensor(seq, device=dev), sum(counts))
    with raises_naming("get_batch_indices_positions", f"seq_lens[{busy[0]}]"):
        index_checks.check_errors()
