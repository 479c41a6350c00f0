"""Fuzz suite, grouped / segment GEMM (``grouped_mm_bf16``, ``grouped_mm_fp8``,
``group_gemm_fp8_nt_groupwise``, ``SegmentGEMMWrapper.run`` with ``seg_indptr`` / ``seg_lens`` /
``weight_indices``): generated calls with one index wrong (offsets that decrease, pass the rows
or start below 0, negative lengths or lengths past the rows, weight indices out of range) must
raise a ValueError naming the function and the argument as the caller passed it, with the
first bad entry and its value, before anything is written (arrays on the CPU, or
FLASHINFER_CHECK_INDICES=1). With the arrays on a GPU (and for each backend's kernel called
directly on the CPU) the kernels compute the documented result (the segments before the first
bad offset; zero rows from it on and for a bad weight index), write nothing outside ``out``, and
leave the fault in the error record, raised by ``flashinfer.check_errors()``. Valid calls
(empty segments, rows no segment covers) must match float64 naive math; a non-finite scale
poisons only the rows it multiplies.

CPU: every backend serving the op here (reference, the torch loops, Triton in its interpreter)
at tiny shapes. GPU (marker ``gpu``): the same generated calls over every backend usable on the
device (``torch:grouped_mm`` included: bf16, k and n multiples of 8)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import flashinfer
from flashinfer import index_checks
from flashinfer.dispatch import kernel_for
from flashinfer.dispatch import Problem
from flashinfer.gemm import SegmentGEMMWrapper, group_gemm_fp8_nt_groupwise
from flashinfer.gemm.grouped import FAULTS, grouped_mm_bf16, grouped_mm_fp8

from conftest import FUZZ, FUZZ_SLOW, HAS_CUDA, TOLERANCE, raises_naming, rel_error, \
    usable_backends


E4M3 = torch.float8_e4m3fn
SENTINEL = 1024.0  # the rows around an output (exact in fp16 / bf16); a stray write changes it
FP8_TOL = 1e-2
RUN = "SegmentGEMMWrapper.run"
#: the public spelling of each caller: (function, offsets argument)
CALLERS = {"grouped_mm_bf16": ("grouped_mm_bf16", "m_indptr"),
           "grouped_mm_fp8": ("grouped_mm_fp8", "m_indptr"),
           "group_gemm_fp8_nt_groupwise": ("group_gemm_fp8_nt_groupwise", "m_indptr"),
           "seg_indptr": (RUN, "seg_indptr"), "seg_lens": (RUN, "seg_lens")}


def _backends(op: str, device: str) -> list[str]:
    if device == "cuda" and not HAS_CUDA:  # collected, then skipped by the gpu marker
        return {"segment_gemm": ["reference", "torch:grouped_mm", "torch:segment_loop", "triton"],
                "group_gemm_fp8_groupwise": ["reference", "torch:dequant_loop", "triton"]}[op]
    if op == "segment_gemm":
        problem = Problem.make(op, torch.device(device),
                               dtypes={"x": torch.bfloat16, "weights": torch.bfloat16,
                                       "out": torch.bfloat16},
                               shape={"num_groups": 4, "m": 8, "n": 16, "k": 16,
                                      "rows_per_group": 2},
                               features=("weight_indices",), layout="row_major")
    else:
        problem = Problem.make(op, torch.device(device),
                               dtypes={"a": E4M3, "b": E4M3, "out": torch.bfloat16},
                               shape={"num_groups": 4, "m": 8, "n": 16, "k": 128},
                               features=("scale_1x128",))
    return usable_backends(problem)


SEGMENT_CPU, SEGMENT_GPU = _backends("segment_gemm", "cpu"), _backends("segment_gemm", "cuda")
FP8_CPU = _backends("group_gemm_fp8_groupwise", "cpu")
FP8_GPU = _backends("group_gemm_fp8_groupwise", "cuda")


def _kernel(backend: str, op: str):
    name, _, variant = backend.partition(":")
    return kernel_for(name, op, variant or "default")


# --------------------------------------------------------------------------------------------
# the rules, written out independently of the library


def _first_bad(indptr: list[int], rows: int):
    """The first entry breaking "non-decreasing within [0, rows]" (entry 0 compared with 0)."""
    prev = 0
    for i, v in enumerate(indptr):
        if v < prev or v > rows:
            return i
        prev = v
    return None


def _guarded(indptr: list[int], rows: int) -> list[int]:
    """The offsets the kernels compute with: up to the first bad entry, then the last good one."""
    cut = _first_bad(indptr, rows)
    if cut is None:
        return list(indptr)
    kept = indptr[cut - 1] if cut else 0
    return list(indptr[:cut]) + [kept] * (len(indptr) - cut)


def _naive(x, weights, indptr, chosen, column_major, rows, alpha=1.0):
    """float64: segment s (of the guarded offsets) times weight ``chosen[s]``, zero rows where the
    weight index is bad and wherever no segment reaches."""
    x, weights = x.double().cpu(), weights.double().cpu()
    n = weights.shape[1] if column_major else weights.shape[2]
    y = torch.zeros(rows, n, dtype=torch.float64)
    g = _guarded(indptr, rows)
    for s, w in enumerate(chosen):
        if not 0 <= w < weights.shape[0]:
            continue
        mat = weights[w].t() if column_major else weights[w]
        for r in range(g[s], g[s + 1]):
            y[r] = alpha * (x[r] @ mat)
    return y


# --------------------------------------------------------------------------------------------
# generated cases


OFFSET_KINDS = ("decrease", "past", "negative")
LENS_KINDS = ("negative", "past")
WEIGHT_KINDS = ("weight_big", "weight_neg")


@st.composite
def segment_cases(draw, bad: bool, callers=("grouped_mm_bf16", "seg_indptr", "seg_lens"),
                  dtypes=(torch.float16, torch.bfloat16), dims=(8, 16), max_len=3):
    """A valid segment call, then, when ``bad``, one index made wrong; ``words`` is what the
    error must say (function, ``argument[entry] = value``)."""
    caller = draw(st.sampled_from(callers))
    grouped = caller.startswith("grouped_mm")
    lens = draw(st.lists(st.integers(0, max_len), min_size=1, max_size=4))
    head = 0 if caller == "seg_lens" else draw(st.integers(0, 2))
    tail = draw(st.integers(0, 2))
    indptr = [head]
    for n in lens:
        indptr.append(indptr[-1] + n)
    rows = indptr[-1] + tail
    segs = len(lens)
    with_indices = caller.startswith("seg_") and draw(st.booleans())
    kinds = OFFSET_KINDS if caller != "seg_lens" else LENS_KINDS
    kind = draw(st.sampled_from(kinds + (WEIGHT_KINDS if caller.startswith("seg_") else ()))) \
        if bad else None
    if kind in WEIGHT_KINDS:
        with_indices = True
    num_weights = draw(st.integers(1, 3)) if with_indices else segs
    case = {
        "caller": caller, "rows": rows, "lens": list(lens), "indptr": indptr,
        "dtype": torch.bfloat16 if grouped else draw(st.sampled_from(dtypes)),
        "k": draw(st.sampled_from(dims)), "n": draw(st.sampled_from(dims)),
        "column_major": True if grouped else draw(st.booleans()),
        "num_weights": num_weights,
        "weight_indices": [draw(st.integers(0, num_weights - 1)) for _ in range(segs)]
        if with_indices else None,
        "seed": draw(st.integers(0, 1 << 16)), "kind": kind, "words": None,
    }
    if not bad:
        return case
    function, argument = CALLERS[caller]
    extra = draw(st.integers(0, 1000))
    if kind in WEIGHT_KINDS:
        j = draw(st.integers(0, segs - 1))
        value = num_weights + extra if kind == "weight_big" else -1 - extra
        case["weight_indices"][j] = value
        case["words"] = (function, f"weight_indices[{j}] = {value}", f"[0, {num_weights})")
    elif caller == "seg_lens":
        i = draw(st.integers(0, segs - 1))
        value = -1 - extra if kind == "negative" else rows - indptr[i] + 1 + extra
        case["lens"][i] = value
        case["indptr"] = indptr = [0]
        for n in case["lens"]:
            indptr.append(indptr[-1] + n)
        case["words"] = (function, f"seg_lens[{i}] = {value}", f"within {rows}")
    else:
        i = 0 if kind == "negative" else draw(st.integers(1 if kind == "decrease" else 0, segs))
        value = {"negative": -1 - extra, "past": rows + 1 + extra,
                 "decrease": indptr[i - 1] - 1 - extra if i else 0}[kind]
        indptr[i] = value
        case["words"] = (function, f"{argument}[{i}] = {value}", f"within [0, {rows}]")
    return case


def _segment_tensors(case, device):
    g = torch.Generator().manual_seed(case["seed"])
    k, n, dtype = case["k"], case["n"], case["dtype"]
    x = torch.randn(case["rows"], k, generator=g).to(dtype).to(device)
    shape = (case["num_weights"], n, k) if case["column_major"] else (case["num_weights"], k, n)
    weights = (torch.randn(*shape, generator=g) / k ** 0.5).to(dtype).to(device)
    return x, weights


def _index(values, device, dtype=torch.int64):
    return None if values is None else torch.tensor(values, dtype=dtype, device=device)


def _embedded_out(rows, n, dtype, device):
    """``(buffer, out)``: a NaN-poisoned contiguous output with a SENTINEL row on each side."""
    big = torch.full((rows + 2, n), SENTINEL, dtype=dtype, device=device)
    out = big[1:-1]
    out.fill_(float("nan"))
    return big, out


def _intact(big) -> bool:
    return bool((big[0] == SENTINEL).all() and (big[-1] == SENTINEL).all())


def _chosen(case):
    return case["weight_indices"] or list(range(len(case["indptr"]) - 1))


def _segment_call(case, x, weights, out, backend, device):
    """The public call of ``case["caller"]``, index arrays on ``device`` (``seg_lens`` too)."""
    caller = case["caller"]
    if caller == "grouped_mm_bf16":
        return grouped_mm_bf16(x, weights, _index(case["indptr"], device, torch.int32), out=out,
                               out_dtype=out.dtype, backend=backend)
    wrapper = SegmentGEMMWrapper(torch.empty(1, device=device), backend=backend)
    lens_or_indptr = ({"seg_lens": _index(case["lens"], device)} if caller == "seg_lens" else
                      {"seg_indptr": _index(case["indptr"], device)})
    return wrapper.run(x, weights, len(case["lens"]), case["column_major"], out=out,
                       weight_indices=_index(case["weight_indices"], device), **lens_or_indptr)


def _device_words(case):
    """The error record's message: the same words, the entry found by the kernel."""
    return case["words"] + ("skipped",)


# --------------------------------------------------------------------------------------------
# CPU: segment GEMM


@pytest.mark.parametrize("backend", SEGMENT_CPU)
@FUZZ_SLOW
@given(case=segment_cases(bad=False))
def test_valid_segment_calls_match_float64(backend, case):
    x, weights = _segment_tensors(case, "cpu")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cpu")
    assert _segment_call(case, x, weights, out, backend, "cpu") is out
    assert _intact(big)
    want = _naive(x, weights, case["indptr"], _chosen(case), case["column_major"], case["rows"])
    assert rel_error(out, want) < TOLERANCE[case["dtype"]]


@FUZZ
@given(case=segment_cases(bad=True, callers=tuple(k for k in CALLERS if k not in
                                                  ("grouped_mm_fp8",
                                                   "group_gemm_fp8_nt_groupwise"))))
def test_bad_index_raises_naming_the_callers_argument_and_writes_nothing(case):
    x, weights = _segment_tensors(case, "cpu")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cpu")
    with raises_naming(*case["words"]):
        _segment_call(case, x, weights, out, "auto", "cpu")
    assert out.isnan().all() and _intact(big)


@pytest.mark.parametrize("backend", SEGMENT_CPU)
@FUZZ_SLOW
@given(case=segment_cases(bad=True))
def test_segment_kernel_follows_the_documented_result_and_records(backend, case):
    """Each backend's kernel itself (the GPU path: no host check in front of it), on the CPU."""
    index_checks.clear()  # per example (the fixture runs once per test)
    x, weights = _segment_tensors(case, "cpu")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cpu")
    _kernel(backend, "segment_gemm")(x, weights, _index(case["indptr"], "cpu"),
                                     _index(case["weight_indices"], "cpu"),
                                     case["column_major"], None, out, FAULTS[case["caller"]])
    assert _intact(big) and not out.isnan().any()
    want = _naive(x, weights, case["indptr"], _chosen(case), case["column_major"], case["rows"])
    assert rel_error(out, want) < TOLERANCE[case["dtype"]]
    with raises_naming(*_device_words(case)):
        flashinfer.check_errors()


@pytest.mark.parametrize("lens", [[0, 0], []])
def test_no_rows_or_no_segments_is_zero_and_still_checked(lens):
    """Calls that launch nothing check their index arrays too."""
    x = torch.randn(0, 8, dtype=torch.float16)
    weights = torch.randn(2, 8, 8, dtype=torch.float16)
    wrapper = SegmentGEMMWrapper(torch.empty(1))
    y = wrapper.run(x, weights, len(lens), False, seg_lens=torch.tensor(lens, dtype=torch.int64))
    assert y.shape == (0, 8)
    with raises_naming(RUN, "seg_indptr[1] = 1", "within [0, 0]"):
        wrapper.run(x, weights, 1, False, seg_indptr=torch.tensor([0, 1]))
    with raises_naming(RUN, "weight_indices[0] = 5"):
        wrapper.run(x, weights, 1, False, seg_indptr=torch.tensor([0, 0]),
                    weight_indices=torch.tensor([5]))


# --------------------------------------------------------------------------------------------
# CPU: fp8 (grouped_mm_fp8, group_gemm_fp8_nt_groupwise)


@st.composite
def fp8_cases(draw, bad: bool, callers=("grouped_mm_fp8", "group_gemm_fp8_nt_groupwise")):
    case = draw(segment_cases(bad=bad, callers=callers))
    case["dtype"] = E4M3
    case["k"] = 128  # one 128-wide scale block (every kernel's granularity)
    case["mode"] = draw(st.sampled_from(["MN", "K"]))
    return case


def _fp8_tensors(case, device):
    """``a [M, 128]``, ``b [G, n, 128]`` fp8 and (1, 128, 128) scales; K-major scale views for the
    kernels, the caller's layout for the public function, dequantised float64 copies."""
    g = torch.Generator().manual_seed(case["seed"])
    rows, n, groups = case["rows"], case["n"], len(case["indptr"]) - 1
    a = torch.randn(rows, 128, generator=g).to(E4M3)
    b = (torch.randn(groups, n, 128, generator=g) * 0.3).to(E4M3)
    a_scale = torch.rand(rows, 1, generator=g) + 0.5
    b_scale = torch.rand(groups, 1, 1, generator=g) + 0.5
    a_deq, b_deq = a.double() * a_scale.double(), b.double() * b_scale.double()
    if case["mode"] == "MN":
        given = a_scale.t().contiguous(), b_scale.transpose(1, 2).contiguous()
    else:
        given = a_scale, b_scale
    move = lambda t: t.to(device)  # noqa: E731
    return (*map(move, (a, b)), *map(move, given), a_deq, b_deq)


def _fp8_call(case, a, b, a_scale, b_scale, out, backend, device):
    m_indptr = _index(case["indptr"], device, torch.int32)
    if case["caller"] == "grouped_mm_fp8":
        return grouped_mm_fp8(a, b, m_indptr, out=out, out_dtype=out.dtype, backend=backend)
    return group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, m_indptr, (1, 128, 128),
                                       case["mode"], out=out, backend=backend)


@pytest.mark.parametrize("backend", FP8_CPU)
@settings(FUZZ, max_examples=4)
@given(case=fp8_cases(bad=False, callers=("group_gemm_fp8_nt_groupwise",)))
def test_valid_group_gemm_fp8_matches_float64(backend, case):
    a, b, a_scale, b_scale, a_deq, b_deq = _fp8_tensors(case, "cpu")
    big, out = _embedded_out(case["rows"], case["n"], torch.bfloat16, "cpu")
    assert _fp8_call(case, a, b, a_scale, b_scale, out, backend, "cpu") is out
    assert _intact(big)
    want = _naive(a_deq, b_deq, case["indptr"], _chosen(case), True, case["rows"])
    assert rel_error(out, want) < FP8_TOL


@FUZZ
@given(case=fp8_cases(bad=True))
def test_fp8_bad_m_indptr_raises_naming_the_function(case):
    a, b, a_scale, b_scale, _, _ = _fp8_tensors(case, "cpu")
    big, out = _embedded_out(case["rows"], case["n"], torch.bfloat16, "cpu")
    with raises_naming(*case["words"]):
        _fp8_call(case, a, b, a_scale, b_scale, out, "auto", "cpu")
    assert out.isnan().all() and _intact(big)


@pytest.mark.parametrize("backend", FP8_CPU)
@settings(FUZZ, max_examples=5)
@given(case=fp8_cases(bad=True, callers=("group_gemm_fp8_nt_groupwise",)))
def test_fp8_kernel_follows_the_documented_result_and_records(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    a, b, a_scale, b_scale, a_deq, b_deq = _fp8_tensors(case, "cpu")
    if case["mode"] == "MN":  # the kernels take K-major (logical [rows, blocks]) views
        a_scale, b_scale = a_scale.t(), b_scale.transpose(1, 2)
    big, out = _embedded_out(case["rows"], case["n"], torch.bfloat16, "cpu")
    _kernel(backend, "group_gemm_fp8_groupwise")(
        a, b, a_scale, b_scale, _index(case["indptr"], "cpu", torch.int32), (1, 128, 128), out,
        FAULTS[case["caller"]])
    assert _intact(big) and not out.isnan().any()
    want = _naive(a_deq, b_deq, case["indptr"], _chosen(case), True, case["rows"])
    assert rel_error(out, want) < FP8_TOL
    with raises_naming(*_device_words(case)):
        flashinfer.check_errors()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter
@pytest.mark.parametrize("backend", FP8_CPU)
@pytest.mark.parametrize("where", ["a_scale", "b_scale"])
def test_nonfinite_fp8_scale_poisons_only_its_rows(backend, where):
    torch.manual_seed(21)
    indptr = [1, 3, 3, 6]  # row 0 and rows 6.. uncovered, group 1 empty
    a = torch.randn(8, 128).to(E4M3)
    b = (torch.randn(3, 16, 128) * 0.3).to(E4M3)
    a_scale, b_scale = torch.ones(8, 1), torch.ones(3, 1, 1)
    poisoned = [4] if where == "a_scale" else [3, 4, 5]  # row 4, or group 2's rows
    if where == "a_scale":
        a_scale[4] = float("nan")
    else:
        b_scale[2] = float("inf")
    out = group_gemm_fp8_nt_groupwise(a, b, a_scale, b_scale, torch.tensor(indptr,
                                      dtype=torch.int32), (1, 128, 128), "K", backend=backend)
    assert not out[poisoned].isfinite().any()
    rest = [r for r in range(8) if r not in poisoned]
    a_deq = a.double() * a_scale.double().nan_to_num()
    want = _naive(a_deq, b.double(), indptr, [0, 1, 2], True, 8)
    assert out[rest].isfinite().all() and rel_error(out[rest], want[rest]) < FP8_TOL
    assert (out[[0, 6, 7]] == 0).all()


def test_nonfinite_alpha_poisons_the_segments_not_the_uncovered_rows():
    indptr = torch.tensor([2, 4, 4, 5], dtype=torch.int32)
    a, b = torch.randn(7, 16).to(E4M3), torch.randn(3, 8, 16).to(E4M3)
    for backend in ("reference", "torch:segment_loop"):
        out = grouped_mm_fp8(a, b, indptr, torch.tensor([float("nan")]), backend=backend)
        assert out[2:5].isnan().all() and (out[[0, 1, 5, 6]] == 0).all()


# --------------------------------------------------------------------------------------------
# GPU: the arrays on the device, every backend of the op


GPU_FUZZ = settings(FUZZ, max_examples=30)
GPU_SEGMENTS = dict(dtypes=(torch.bfloat16,), dims=(16, 32), max_len=40)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", SEGMENT_GPU)
@GPU_FUZZ
@given(case=segment_cases(bad=False, **GPU_SEGMENTS))
def test_gpu_valid_segment_calls_match_float64(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    x, weights = _segment_tensors(case, "cuda")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cuda")
    _segment_call(case, x, weights, out, backend, "cuda")
    assert _intact(big)
    want = _naive(x, weights, case["indptr"], _chosen(case), case["column_major"], case["rows"])
    assert rel_error(out.cpu(), want) < TOLERANCE[case["dtype"]]
    flashinfer.check_errors()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", SEGMENT_GPU)
@GPU_FUZZ
@given(case=segment_cases(bad=True, **GPU_SEGMENTS))
def test_gpu_bad_index_gives_the_documented_result_and_is_raised_later(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    x, weights = _segment_tensors(case, "cuda")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cuda")
    _segment_call(case, x, weights, out, backend, "cuda")  # no exception here
    with raises_naming(*_device_words(case)):
        flashinfer.check_errors()
    assert _intact(big) and not out.isnan().any()
    want = _naive(x, weights, case["indptr"], _chosen(case), case["column_major"], case["rows"])
    assert rel_error(out.cpu(), want) < TOLERANCE[case["dtype"]]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", SEGMENT_GPU)
@FUZZ
@given(case=segment_cases(bad=True, **GPU_SEGMENTS))
def test_gpu_check_indices_env_raises_at_the_call(backend, case, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "1")
    x, weights = _segment_tensors(case, "cuda")
    big, out = _embedded_out(case["rows"], case["n"], case["dtype"], "cuda")
    with raises_naming(*case["words"]):
        _segment_call(case, x, weights, out, backend, "cuda")
    assert out.isnan().all() and _intact(big)
    index_checks.check_errors()  # nothing was recorded


@pytest.mark.gpu
@pytest.mark.parametrize("backend", SEGMENT_GPU)
def test_gpu_host_seg_lens_are_checked_at_the_call(backend):
    """seg_lens may live on the host while x is on the GPU: checked there, no sync needed."""
    x = torch.randn(6, 16, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(2, 16, 16, device="cuda", dtype=torch.bfloat16)
    wrapper = SegmentGEMMWrapper(torch.empty(1, device="cuda"), backend=backend)
    with raises_naming(RUN, "seg_lens[1] = 5", "within 6"):
        wrapper.run(x, weights, 2, False, seg_lens=torch.tensor([2, 5]))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", FP8_GPU)
@GPU_FUZZ
@given(case=fp8_cases(bad=True, callers=("group_gemm_fp8_nt_groupwise",)))
def test_gpu_group_gemm_fp8_bad_m_indptr_is_recorded(backend, case):
    index_checks.clear()  # per example (the fixture runs once per test)
    a, b, a_scale, b_scale, a_deq, b_deq = _fp8_tensors(case, "cuda")
    big, out = _embedded_out(case["rows"], case["n"], torch.bfloat16, "cuda")
    _fp8_call(case, a, b, a_scale, b_scale, out, backend, "cuda")
    with raises_naming(*_device_words(case)):
        flashinfer.check_errors()
    assert _intact(big) and not out.isnan().any()
    want = _naive(a_deq, b_deq, case["indptr"], _chosen(case), True, case["rows"])
    assert rel_error(out.cpu(), want) < FP8_TOL


@pytest.mark.gpu
def test_gpu_bad_m_indptr_inside_a_cuda_graph():
    """The Triton and torch:grouped_mm paths never sync: a replay with a bad offset computes
    the segments before it, zeroes the rest and records the entry."""
    from conftest import capture_cuda_graph

    torch.manual_seed(7)
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, 16, 32, device="cuda", dtype=torch.bfloat16) * 0.2
    m_indptr = torch.tensor([0, 16, 32, 48, 64], device="cuda", dtype=torch.int32)
    for backend in ("triton", "torch:grouped_mm"):
        out = torch.empty(64, 16, device="cuda", dtype=torch.bfloat16)
        graph = capture_cuda_graph(lambda: grouped_mm_bf16(a, b, m_indptr, out=out,
                                                           backend=backend))
        flashinfer.check_errors()
        m_indptr[2] = 70
        graph.replay()
        with raises_naming("grouped_mm_bf16: m_indptr[2] = 70"):
            flashinfer.check_errors()
        want = _naive(a, b, m_indptr.tolist(), [0, 1, 2, 3], True, 64)
        assert rel_error(out.cpu(), want) < TOLERANCE[torch.bfloat16]
        assert (out[16:] == 0).all()
        m_indptr[2] = 32
