"""cuDNN backend adapter (flashinfer/backends/cudnn): capability record, adapter checks, the pure
planning code (row segments, graph keys, LRU cache) on CPU; on a GPU with ``cudnn``, prefill and
decode against a float64 oracle written here and against the reference backend."""

import itertools
import math
import random
import sys
import threading

import pytest
import torch

from conftest import TOLERANCE, rel_error
from flashinfer.backends import cudnn as cudnn_backend
from flashinfer.backends.cudnn import single_calls as plan, support
from flashinfer.capability_db import database
from flashinfer.dispatch import kernel_for
from flashinfer.optional_packages import import_error
from flashinfer.device import simulated
from flashinfer.dispatch import Problem, clear_cache, select

OPS = ("single_prefill", "single_decode")
DECLARED = {"causal", "gqa", "window", "lse", "large_sm_scale"}  # finite at sm_scale 1e4 on the H200
SMS = ("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu")


def attn_problem(op="single_prefill", sm="9.0", *, dtype="bfloat16", head_dim=128, qo_len=512,
                 kv_len=1024, heads=(32, 8), features=("causal", "gqa"), layout="NHD"):
    device = simulated(None if sm == "cpu" else sm)
    return Problem.make(op, device, dtypes={"q": dtype, "kv": dtype, "o": dtype},
                        shape={"head_dim_qk": head_dim, "head_dim_vo": head_dim,
                               "num_qo_heads": heads[0], "num_kv_heads": heads[1],
                               "qo_len": 1 if op == "single_decode" else qo_len, "kv_len": kv_len},
                        features=features, layout=layout)


def cudnn_candidate(decision_or_problem, **select_kw):
    decision = select(decision_or_problem, **select_kw)
    return next(c for c in decision.candidates if c.backend == "cudnn")


@pytest.fixture
def versions(monkeypatch):
    """Pin what the adapter believes is installed: None (unknown) unless a test sets a value."""
    pinned = {"value": None}
    monkeypatch.setattr(support, "installed_versions", lambda: pinned["value"])

    def set_versions(value):
        pinned["value"] = value
        clear_cache()
    return set_versions


# ---------------------------------------------------------------------------------------------
# capability record


@pytest.mark.parametrize("op", OPS)
def test_record_declares_what_the_adapter_implements(op):
    (rec,) = database().for_backend_op("cudnn", op)
    assert rec.variant == "default" and rec.devices == ("cuda",)
    assert rec.sm_min == (8, 0) and rec.sm_max == (12, 1)
    assert dict(rec.dtypes) == {role: ("float16", "bfloat16") for role in ("q", "kv", "o")}
    assert rec.features == DECLARED
    assert set(rec.layouts) == {"NHD", "HND"}
    limits = dict(rec.shape)
    for fact in ("head_dim_qk", "head_dim_vo"):
        assert limits[fact].max == 256 and limits[fact].multiple_of == 8
    assert rec.requires == ("cudnn",)
    assert rec.verified and rec.verified_on == ((9, 0),)  # GPU tests passed on the H200 only
    assert database().descriptions["cudnn"].startswith("NVIDIA cuDNN")


@pytest.mark.parametrize("op", OPS)
def test_record_names_a_kernel_and_a_check(op):
    (rec,) = database().for_backend_op("cudnn", op)
    assert rec.kernel.startswith("cudnn") and rec.check_ref.startswith("cudnn")
    assert callable(kernel_for("cudnn", op))


def test_adapter_does_not_import_cudnn_at_top_level():
    assert "cudnn" not in vars(cudnn_backend) and "cudnn" not in vars(plan)
    assert "cudnn" not in vars(support)


def test_rejected_with_an_import_reason_without_cudnn(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # "import cudnn" now fails
    clear_cache()
    cand = cudnn_candidate(attn_problem())
    assert not cand.usable
    (reason,) = [r for r in cand.reasons if r.field == "import"]
    assert reason.actual == "cudnn" and "cudnn" in reason.message


# ---------------------------------------------------------------------------------------------
# decisions on simulated SMs (assume_installed: the vendor module need not import here)


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op", OPS)
def test_decision_per_sm(versions, sm, op):
    problem = attn_problem(op, sm, features=("causal", "gqa", "lse"))
    decision = select(problem, assume_installed=True)
    cand = next(c for c in decision.candidates if c.backend == "cudnn")
    if sm == "cpu":
        assert [r.field for r in cand.reasons] == ["device"]
    elif sm == "7.5":
        assert [r.field for r in cand.reasons] == ["sm"]
        assert cand.reasons[0].actual == "7.5" and "8.0" in cand.reasons[0].allowed
    else:
        assert cand.usable, cand.reasons
        assert "cudnn" in decision.order


@pytest.mark.parametrize("sm, verified", [("9.0", True), ("8.0", False), ("10.0", False)])
def test_causal_gqa_bf16_usable_and_verified_only_on_sm90(versions, sm, verified):
    cand = cudnn_candidate(attn_problem(sm=sm, features=("causal", "gqa")), assume_installed=True)
    assert cand.usable and cand.verified == verified


@pytest.mark.parametrize("feature", ["alibi", "soft_cap", "custom_mask", "rope_llama",
                                     "head_dim_differs", "kv_dtype_differs", "o_dtype_differs"])
def test_undeclared_features_are_rejected(versions, feature):
    cand = cudnn_candidate(attn_problem(features=("causal", feature)), assume_installed=True)
    assert [(r.field, r.actual) for r in cand.reasons] == [("feature", feature)]


def test_float32_is_rejected(versions):
    cand = cudnn_candidate(attn_problem(dtype="float32"), assume_installed=True)
    assert {r.field for r in cand.reasons} == {"dtype.q", "dtype.kv", "dtype.o"}


@pytest.mark.parametrize("sm, op, head_dim, qo_len, usable", [
    ("9.0", "single_prefill", 256, 512, True),
    ("9.0", "single_decode", 256, 1, True),
    ("10.0", "single_prefill", 256, 512, True),
    ("10.0", "single_decode", 256, 1, False),
    ("10.0", "single_prefill", 256, 1, False),   # one query row is cuDNN's decode mode
    ("8.0", "single_prefill", 256, 512, False),  # needs cuDNN >= 9.10, unknown here
    ("8.6", "single_decode", 192, 1, False),
    ("12.0", "single_prefill", 256, 512, False),
    ("8.0", "single_prefill", 128, 512, True),
    ("12.0", "single_decode", 128, 1, True),
    ("9.0", "single_prefill", 96, 512, True),
])
def test_head_dim_limits_per_sm(versions, sm, op, head_dim, qo_len, usable):
    cand = cudnn_candidate(attn_problem(op, sm, head_dim=head_dim, qo_len=qo_len),
                           assume_installed=True)
    assert cand.usable == usable, cand.reasons
    if not usable:
        assert {r.field for r in cand.reasons} == {"head_dim_qk", "head_dim_vo"}
        assert all("128" in r.message for r in cand.reasons)


@pytest.mark.parametrize("head_dim, field", [(100, "head_dim_qk"), (512, "head_dim_qk")])
def test_head_dim_outside_the_record(versions, head_dim, field):
    cand = cudnn_candidate(attn_problem(head_dim=head_dim), assume_installed=True)
    assert field in {r.field for r in cand.reasons}


def test_known_backend_version_widens_sm80_prefill(versions):
    versions(support.Versions((1, 32, 0), 91900))
    assert cudnn_candidate(attn_problem(sm="8.0", head_dim=256), assume_installed=True).usable
    assert not cudnn_candidate(attn_problem("single_decode", "8.0", head_dim=256),
                               assume_installed=True).usable


def test_version_gates_show_up_as_reasons(versions):
    versions(support.Versions((1, 12, 0), 90500))
    cand = cudnn_candidate(attn_problem(features=("causal", "window")), assume_installed=True)
    by_field = {}
    for r in cand.reasons:
        by_field.setdefault(r.field, []).append(r)
    assert by_field["cudnn_frontend"][0].actual == "1.12.0"
    assert sorted(r.allowed for r in by_field["cudnn_version"]) == [">=9.10.2", ">=9.6.0"]


@pytest.mark.parametrize("op, features, backend, expected", [
    ("single_prefill", ("causal",), 91900, []),
    ("single_prefill", ("causal",), 90500, [">=9.6.0"]),
    ("single_decode", ("causal",), 90500, []),  # one row: the causal mask is dropped
    ("single_decode", ("window",), 91000, [">=9.10.2"]),
    ("single_prefill", (), 80906, [">=9.0.0"]),
    ("single_prefill", ("causal", "window"), None, []),  # library absent: nothing to gate
])
def test_version_gate_table(op, features, backend, expected):
    problem = attn_problem(op, features=features)
    found = support.reasons(problem, support.Versions((1, 32, 0), backend))
    assert sorted(r.allowed for r in found if r.field == "cudnn_version") == expected


def test_no_reasons_off_cuda():
    assert support.reasons(attn_problem(sm="cpu", head_dim=256), None) == []


@pytest.mark.parametrize("value, text", [(91002, "9.10.2"), (91900, "9.19.0"), (90000, "9.0.0"),
                                         (8906, "8.9.6")])
def test_version_text(value, text):
    assert support.version_text(value) == text


@pytest.mark.parametrize("text, parsed", [("1.32.0", (1, 32, 0)), ("1.8.0.post1", (1, 8, 0)),
                                          ("1.13", (1, 13, 0)), ("2.0.0rc1", (2, 0, 0))])
def test_parse_frontend(text, parsed):
    assert support.parse_frontend(text) == parsed


# ---------------------------------------------------------------------------------------------
# row segments


def contract_mask(n, m, causal, window_left):
    """The visibility the public contract defines: bottom-right aligned causal and window."""
    r_abs = torch.arange(n)[:, None] + (m - n)
    j = torch.arange(m)[None, :]
    mask = torch.ones(n, m, dtype=torch.bool)
    if causal:
        mask &= j <= r_abs
    if window_left >= 0:
        mask &= j >= r_abs - window_left
    return mask


def planned_mask(n, m, empty_rows, segments):
    """The visibility cuDNN computes when each segment runs on its row slice (BOTTOM_RIGHT band)."""
    mask = torch.zeros(n, m, dtype=torch.bool)
    covered = torch.zeros(n, dtype=torch.bool)
    for seg in segments:
        rows = seg.rows
        if seg.causal or seg.left_bound is not None:
            assert rows <= m, "cuDNN refuses a band with s_q > s_kv"
        diag = torch.arange(rows)[:, None] + (m - rows)
        j = torch.arange(m)[None, :]
        seg_mask = torch.ones(rows, m, dtype=torch.bool)
        if seg.causal:
            seg_mask &= j <= diag
        if seg.left_bound is not None:
            assert seg.left_bound >= 1
            seg_mask &= j > diag - seg.left_bound
        assert not covered[seg.start:seg.stop].any(), "segments overlap"
        covered[seg.start:seg.stop] = True
        mask[seg.start:seg.stop] = seg_mask
    assert covered[empty_rows:].all() and not covered[:empty_rows].any()
    return mask


@pytest.mark.parametrize("n, m, causal, window, expected", [
    (5, 40, False, -1, (0, [(0, 5, False, None)])),
    (5, 40, True, -1, (0, [(0, 5, True, None)])),
    (64, 40, True, -1, (24, [(24, 64, True, None)])),
    (40, 40, True, 7, (0, [(0, 40, True, 8)])),
    (64, 40, False, 7, (0, [(0, 24, False, None), (24, 64, False, 8)])),
    (1, 300, True, -1, (0, [(0, 1, False, None)])),
    (1, 300, False, 15, (0, [(0, 1, True, 16)])),
    (5, 40, True, 39, (0, [(0, 5, True, None)])),   # a window that hides nothing is dropped
    (5, 40, True, 38, (0, [(0, 5, True, 39)])),
    (3, 0, True, -1, (3, [])),
    (0, 5, True, 2, (0, [])),
])
def test_plan_segments_table(n, m, causal, window, expected):
    empty, segments = plan.plan_segments(n, m, causal, window)
    assert (empty, [(s.start, s.stop, s.causal, s.left_bound) for s in segments]) == \
        (expected[0], expected[1])


def test_plan_segments_reproduce_the_contract_mask():
    rng = random.Random(0)
    cases = list(itertools.product([1, 2, 7, 33], [1, 2, 7, 33], [False, True], [-1, 0, 1, 5, 40]))
    cases += [(rng.randint(1, 90), rng.randint(1, 90), rng.random() < 0.5, rng.randint(-1, 60))
              for _ in range(300)]
    for n, m, causal, window in cases:
        empty, segments = plan.plan_segments(n, m, causal, window)
        expected = contract_mask(n, m, causal, window)
        assert torch.equal(planned_mask(n, m, empty, segments), expected), (n, m, causal, window)
        # rows the plan leaves out are exactly the rows that see no key
        assert not expected[:empty].any() and expected[empty:].any(dim=1).all()


# ---------------------------------------------------------------------------------------------
# graph keys and views (CPU tensors: only shapes and strides matter)


def spec_for(q, k, v, *, causal=True, window=-1, stats=True, scale=0.125, seg=None):
    """The spec of segment ``seg`` (default: the plan's only segment), built from plain views."""
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    if seg is None:
        _, (seg,) = plan.plan_segments(q.shape[0], k.shape[0], causal, window)
    return plan.GraphSpec.make(plan.bhsd(q[seg.start:seg.stop]), plan.bhsd(k), plan.bhsd(v),
                               plan.bhsd(out[seg.start:seg.stop]), seg, stats=stats,
                               sm_scale=scale)


def qkv(n=6, m=20, hq=8, hk=2, d=64, dtype=torch.float16, layout="NHD"):
    if layout == "HND":
        return (torch.randn(hq, n, d, dtype=dtype).transpose(0, 1),
                torch.randn(hk, m, d, dtype=dtype).transpose(0, 1),
                torch.randn(hk, m, d, dtype=dtype).transpose(0, 1))
    return (torch.randn(n, hq, d, dtype=dtype), torch.randn(m, hk, d, dtype=dtype),
            torch.randn(m, hk, d, dtype=dtype))


def test_spec_depends_on_geometry_not_data():
    torch.manual_seed(0)
    a, b = spec_for(*qkv()), spec_for(*qkv())
    assert a == b and hash(a) == hash(b)


def test_spec_separates_everything_the_graph_depends_on():
    torch.manual_seed(0)
    base = spec_for(*qkv())
    variants = [
        spec_for(*qkv(layout="HND")), spec_for(*qkv(dtype=torch.bfloat16)),
        spec_for(*qkv(m=21)), spec_for(*qkv(n=5)), spec_for(*qkv(hk=4)), spec_for(*qkv(d=128)),
        spec_for(*qkv(), causal=False), spec_for(*qkv(), window=3), spec_for(*qkv(), stats=False),
        spec_for(*qkv(), scale=0.1),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_hnd_layout_changes_only_strides():
    torch.manual_seed(0)
    nhd, hnd = spec_for(*qkv()), spec_for(*qkv(layout="HND"))
    assert nhd.q_dims() == hnd.q_dims() and nhd.k_dims() == hnd.k_dims()
    assert nhd.k_stride != hnd.k_stride and nhd.o_stride == hnd.o_stride


def test_single_row_query_layouts_share_a_graph():
    torch.manual_seed(0)
    q_nhd, k, v = qkv(n=1)
    q_hnd = torch.randn(8, 1, 64, dtype=torch.float16).transpose(0, 1)
    assert spec_for(q_nhd, k, v) == spec_for(q_hnd, k, v)


def test_bhsd_is_a_view_with_distinct_strides():
    for layout in ("NHD", "HND"):
        q, k, _ = qkv(n=5, layout=layout)
        for t in (q, k, q[2:3], k[:, :1]):
            view = plan.bhsd(t)
            assert view.data_ptr() == t.data_ptr() and view.shape[0] == 1
            assert torch.equal(view[0].transpose(0, 1), t)
            big = [s for n_, s in zip(view.shape, view.stride()) if n_ > 1]
            assert len(set(big)) == len(big)


def test_stats_shape_matches_the_declared_stats_layout():
    q, k, v = qkv(n=6, hq=8)
    (step,) = plan.plan_call(q, k, v, causal=True, window_left=-1, stats=True, sm_scale=0.1).steps
    buf = torch.empty(step.stats_shape, dtype=torch.float32)
    assert list(buf.shape) == step.spec.stats_dims()
    assert list(buf.stride()) == step.spec.stats_stride()
    assert plan.plan_call(q, k, v, causal=True, window_left=-1, stats=False,
                          sm_scale=0.1).steps[0].stats_shape is None


# ---------------------------------------------------------------------------------------------
# call plans: computed once per geometry, re-applied to the tensors of later calls


def in_buffer(t, pad):
    """A copy of ``t`` with its strides, placed ``pad`` elements into a larger buffer."""
    flat = torch.randn(pad + t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype,
                       device=t.device)
    return flat.as_strided(t.shape, t.stride(), pad).copy_(t)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("n, m, causal, window", [(6, 20, True, -1), (1, 20, False, -1),
                                                  (1, 20, False, 5), (30, 20, True, -1),
                                                  (30, 20, False, 5), (10, 20, False, 4),
                                                  (4, 0, True, -1)])
def test_call_plan_reapplied_gives_the_per_call_views(layout, n, m, causal, window):
    torch.manual_seed(0)
    q, k, v = qkv(n=n, m=m, layout=layout)
    kw = dict(causal=causal, window_left=window, stats=True, sm_scale=0.125)
    cached = plan.plan_call(q, k, v, **kw)
    # a later call: same geometry, other data at other storage offsets
    q2, k2, v2 = (in_buffer(t, pad) for t, pad in zip((q, k, v), (8, 24, 40)))
    assert plan.call_key(q2, k2, v2, **kw) == plan.call_key(q, k, v, **kw)
    assert plan.plan_call(q2, k2, v2, **kw) == cached
    empty, segments = plan.plan_segments(n, m, causal, window)
    assert cached.empty_rows == empty and cached.out_shape == (n, 8, 64)
    out = torch.randn(cached.out_shape, dtype=q.dtype)  # what the kernel allocates: contiguous
    for t, view in ((k2, cached.k), (v2, cached.v)):
        got, want = plan.apply_view(t, view), plan.bhsd(t)
        assert (got.shape, got.stride(), got.data_ptr()) == (want.shape, want.stride(), want.data_ptr())
    assert len(cached.steps) == len(segments)
    for step, seg in zip(cached.steps, segments):
        assert (step.start, step.stop) == (seg.start, seg.stop)
        assert step.spec == spec_for(q2, k2, v2, causal=causal, window=window, seg=seg)
        for t, view in ((q2, step.q), (out, step.o)):
            got, want = plan.apply_view(t, view), plan.bhsd(t[seg.start:seg.stop])
            assert (got.shape, got.stride(), got.data_ptr()) == (want.shape, want.stride(), want.data_ptr())
            assert torch.equal(got, want)


def test_call_key_separates_what_the_plan_depends_on():
    torch.manual_seed(0)
    q, k, v = qkv()
    kw = dict(causal=True, window_left=-1, stats=True, sm_scale=0.125)
    base = plan.call_key(q, k, v, **kw)
    variants = [
        plan.call_key(*qkv(layout="HND"), **kw), plan.call_key(*qkv(dtype=torch.bfloat16), **kw),
        plan.call_key(*qkv(m=21), **kw), plan.call_key(*qkv(n=5), **kw),
        plan.call_key(*qkv(hk=4), **kw), plan.call_key(*qkv(d=128), **kw),
        plan.call_key(q, k, v, **{**kw, "causal": False}),
        plan.call_key(q, k, v, **{**kw, "window_left": 3}),
        plan.call_key(q, k, v, **{**kw, "stats": False}),
        plan.call_key(q, k, v, **{**kw, "sm_scale": 0.1}),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_needs_copy():
    base = torch.randn(6, 4, 64, dtype=torch.float16)
    assert not plan.needs_copy(base) and not plan.needs_copy(base.transpose(0, 1))
    assert plan.needs_copy(base[..., ::2])                                  # strided innermost
    assert plan.needs_copy(torch.randn(6 * 4 * 64 + 1, dtype=torch.float16)[1:].view(6, 4, 64))
    assert plan.needs_copy(torch.randn(6, 4, 68, dtype=torch.float16)[..., :64])  # 8-byte row
    assert not plan.needs_copy(torch.randn(6, 4, 72, dtype=torch.float16)[..., :64])
    assert plan.needs_copy(torch.randn(1, 4, 64, dtype=torch.float16).expand(6, 4, 64))
    assert not plan.needs_copy(base[:1])


# ---------------------------------------------------------------------------------------------
# LRU graph cache


def test_graph_cache_hits_misses_and_eviction():
    cache = plan.GraphCache(maxsize=2)
    built = []

    def builder(key):
        return lambda: built.append(key) or f"graph-{key}"
    assert cache.get("a", builder("a")) == "graph-a"
    assert cache.get("a", builder("a")) == "graph-a"
    cache.get("b", builder("b"))
    cache.get("a", builder("a"))       # a is now the most recent
    cache.get("c", builder("c"))       # evicts b
    assert built == ["a", "b", "c"] and "b" not in cache and "a" in cache
    assert cache.info() == {"hits": 2, "misses": 3, "evictions": 1, "size": 2, "maxsize": 2}
    cache.clear()
    assert len(cache) == 0 and cache.info()["hits"] == 0


def test_graph_cache_builds_once_under_contention():
    cache = plan.GraphCache(maxsize=4)
    calls = []
    gate = threading.Event()

    def build():
        gate.wait(1.0)
        calls.append(1)
        return object()
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", build)))
               for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(r) for r in results}) == 1


def test_graph_cache_does_not_keep_failed_builds():
    cache = plan.GraphCache()

    def fail():
        raise RuntimeError("no plan")
    with pytest.raises(RuntimeError, match="no plan"):
        cache.get("k", fail)
    assert "k" not in cache and cache.get("k", lambda: 1) == 1


def test_graph_cache_rejects_bad_size():
    with pytest.raises(ValueError, match="maxsize"):
        plan.GraphCache(maxsize=0)


# ---------------------------------------------------------------------------------------------
# graph declaration with the installed frontend (pure Python IR in cudnn-frontend >= 1.2x: no GPU)


def _python_ir_frontend():
    if import_error("cudnn"):
        return None
    import cudnn

    return cudnn if getattr(cudnn.pygraph, "__module__", "") == "cudnn._pygraph" else None


@pytest.mark.skipif(_python_ir_frontend() is None,
                    reason="needs nvidia-cudnn-frontend with the Python graph IR (>= 1.2x)")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal, window, n, m", [(True, -1, 6, 20), (True, 5, 6, 20),
                                                  (False, 5, 6, 20), (False, -1, 1, 20),
                                                  (False, 5, 1, 20)])
def test_declared_graph_validates(layout, causal, window, n, m):
    from flashinfer.backends.cudnn import _graphs

    torch.manual_seed(0)
    spec = spec_for(*qkv(n=n, m=m, dtype=torch.bfloat16, layout=layout), causal=causal,
                    window=window)
    entry = _graphs._declare(spec, None)
    entry.graph.validate()
    assert entry.stats is not None


# ---------------------------------------------------------------------------------------------
# GPU: cuDNN against a float64 oracle and against the reference backend


def oracle(q, k, v, sm_scale, causal, window_left):
    """float64 attention with the contract's semantics; lse base 2, rows with no key: 0 / -inf."""
    n, hq, _ = q.shape
    m, hk, _ = k.shape
    kd = k.double().repeat_interleave(hq // hk, dim=1)
    vd = v.double().repeat_interleave(hq // hk, dim=1)
    scores = torch.einsum("nhd,mhd->hnm", q.double(), kd) * sm_scale
    visible = contract_mask(n, m, causal, window_left).to(q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.nan_to_num(torch.exp(scores - lse[..., None]), nan=0.0)
    out = torch.einsum("hnm,mhd->nhd", probs, vd)
    return out, (lse / math.log(2.0)).t()


def gpu_inputs(n, m, hq, hk, d, dtype, layout, seed=0):
    torch.manual_seed(seed)
    dev = "cuda"
    if layout == "HND":
        return (torch.randn(hq, n, d, dtype=dtype, device=dev).transpose(0, 1),
                torch.randn(hk, m, d, dtype=dtype, device=dev).transpose(0, 1),
                torch.randn(hk, m, d, dtype=dtype, device=dev).transpose(0, 1))
    return (torch.randn(n, hq, d, dtype=dtype, device=dev),
            torch.randn(m, hk, d, dtype=dtype, device=dev),
            torch.randn(m, hk, d, dtype=dtype, device=dev))


def params_for(dtype, d, causal=False, window=-1, lse=True):
    from flashinfer.attention.params import AttentionParams

    return AttentionParams(sm_scale=d ** -0.5, causal=causal, window_left=window,
                           return_lse=lse, o_dtype=dtype)


def skip_unless_cudnn_serves(op, q, k, v, features, layout):
    """Skip (with the dispatcher's reasons) when cuDNN cannot run this case on this GPU."""
    if import_error("cudnn"):
        pytest.skip(f"cudnn does not import: {import_error('cudnn')}")
    names = {"q": q.dtype, "kv": k.dtype, "o": q.dtype}
    problem = Problem.make(op, q.device, dtypes=names,
                           shape={"head_dim_qk": q.shape[2], "head_dim_vo": v.shape[2],
                                  "num_qo_heads": q.shape[1], "num_kv_heads": k.shape[1],
                                  "qo_len": q.shape[0], "kv_len": k.shape[0]},
                           features=features, layout=layout)
    cand = cudnn_candidate(problem)
    if not cand.usable:
        pytest.skip("cudnn cannot serve this case here: " + "; ".join(map(str, cand.reasons)))


def run_cudnn(op, q, k, v, params):
    from flashinfer.dispatch import kernel_for

    return kernel_for("cudnn", op, "default")(q, k, v, params)


def assert_matches(out, lse, ref_out, ref_lse, dtype):
    assert out.shape == ref_out.shape and out.dtype == dtype
    assert rel_error(out, ref_out) <= TOLERANCE[dtype]
    if ref_lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
        torch.testing.assert_close(lse.double(), ref_lse.double().to(lse.device),
                                   atol=2e-2, rtol=1e-3)


PREFILL_CASES = [
    # qo_len, kv_len, hq, hk, d, causal, window
    (128, 128, 8, 8, 128, False, -1),
    (37, 301, 8, 2, 128, True, -1),      # causal, qo_len < kv_len, GQA
    (64, 64, 4, 1, 64, True, -1),        # MQA
    (48, 16, 4, 2, 64, True, -1),        # qo_len > kv_len: 32 rows see no key
    (100, 257, 8, 2, 128, True, 31),     # causal + window
    (90, 200, 8, 4, 64, False, 17),      # window without causal
    (80, 50, 4, 2, 64, False, 9),        # window without causal, qo_len > kv_len (2 graphs)
    (33, 70, 4, 4, 256, True, -1),       # head_dim 256 (SM 9.x / 10.x only)
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: "x".join(map(str, c)))
def test_gpu_prefill_matches_oracle(dtype, layout, case):
    n, m, hq, hk, d, causal, window = case
    q, k, v = gpu_inputs(n, m, hq, hk, d, dtype, layout)
    features = {"lse"} | ({"causal"} if causal else set()) | ({"gqa"} if hq > hk else set()) \
        | ({"window"} if window >= 0 else set())
    skip_unless_cudnn_serves("single_prefill", q, k, v, features, layout)
    params = params_for(dtype, d, causal, window)
    out, lse = run_cudnn("single_prefill", q, k, v, params)
    ref_out, ref_lse = oracle(q, k, v, params.sm_scale, causal, window)
    assert_matches(out, lse, ref_out, ref_lse, dtype)
    if causal and n > m:
        assert out[: n - m].eq(0).all() and torch.isneginf(lse[: n - m]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_len, hq, hk, d, window", [
    (1, 8, 8, 128, -1), (300, 32, 8, 128, -1), (1025, 8, 1, 64, -1), (513, 16, 4, 128, 100),
    (77, 4, 4, 256, -1),
])
def test_gpu_decode_matches_oracle(dtype, layout, kv_len, hq, hk, d, window):
    q, k, v = gpu_inputs(1, kv_len, hq, hk, d, dtype, layout)
    features = {"lse"} | ({"gqa"} if hq > hk else set()) | ({"window"} if window >= 0 else set())
    skip_unless_cudnn_serves("single_decode", q, k, v, features, layout)
    params = params_for(dtype, d, causal=False, window=window)
    out, lse = run_cudnn("single_decode", q, k, v, params)
    assert_matches(out, lse, *oracle(q, k, v, params.sm_scale, False, window), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("op, n", [("single_prefill", 40), ("single_decode", 1)])
def test_gpu_without_lse(op, n):
    q, k, v = gpu_inputs(n, 96, 8, 2, 128, torch.bfloat16, "NHD")
    skip_unless_cudnn_serves(op, q, k, v, {"causal", "gqa"}, "NHD")
    params = params_for(torch.bfloat16, 128, causal=True, lse=False)
    out, lse = run_cudnn(op, q, k, v, params)
    assert lse is None
    assert rel_error(out, oracle(q, k, v, params.sm_scale, True, -1)[0]) <= TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_misaligned_and_strided_operands_are_copied():
    base = torch.randn(64 * 8 * 128 + 8, dtype=torch.float16, device="cuda")
    q = base[1:1 + 64 * 8 * 128].view(64, 8, 128)            # 2-byte offset: misaligned
    _, k, v = gpu_inputs(64, 160, 8, 2, 128, torch.float16, "NHD")
    v = torch.randn(160, 2, 136, dtype=torch.float16, device="cuda")[..., :128]  # padded rows
    skip_unless_cudnn_serves("single_prefill", q, k, v, {"causal", "gqa", "lse"}, "NHD")
    params = params_for(torch.float16, 128, causal=True)
    out, lse = run_cudnn("single_prefill", q, k, v, params)
    assert_matches(out, lse, *oracle(q, k, v, params.sm_scale, True, -1), torch.float16)


@pytest.mark.gpu
def test_gpu_second_call_hits_the_graph_cache():
    q, k, v = gpu_inputs(50, 130, 8, 2, 128, torch.bfloat16, "NHD", seed=1)
    skip_unless_cudnn_serves("single_prefill", q, k, v, {"causal", "gqa", "lse"}, "NHD")
    params = params_for(torch.bfloat16, 128, causal=True)
    run_cudnn("single_prefill", q, k, v, params)
    before = cudnn_backend.graph_cache_state()
    q2, k2, v2 = gpu_inputs(50, 130, 8, 2, 128, torch.bfloat16, "NHD", seed=2)
    out, lse = run_cudnn("single_prefill", q2, k2, v2, params)
    after = cudnn_backend.graph_cache_state()
    assert after["misses"] == before["misses"] and after["hits"] == before["hits"] + 1
    assert_matches(out, lse, *oracle(q2, k2, v2, params.sm_scale, True, -1), torch.bfloat16)


# two graphs (window, qo_len > kv_len); empty rows (causal, qo_len > kv_len); decode with a window
REUSE_CASES = [(80, 50, False, 9), (48, 16, True, -1), (1, 300, False, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("n, m, causal, window", REUSE_CASES)
def test_gpu_cached_plan_reapplied_at_other_offsets(n, m, causal, window):
    """A cache hit re-applies the recorded views to new tensors that sit at other offsets."""
    op = "single_decode" if n == 1 else "single_prefill"
    q, k, v = gpu_inputs(n, m, 8, 2, 64, torch.bfloat16, "HND", seed=5)
    features = {"lse", "gqa"} | ({"causal"} if causal else set()) | ({"window"} if window >= 0 else set())
    skip_unless_cudnn_serves(op, q, k, v, features, "HND")
    params = params_for(torch.bfloat16, 64, causal, window)
    run_cudnn(op, q, k, v, params)
    before = cudnn_backend.graph_cache_state()
    q2, k2, v2 = (in_buffer(t, pad) for t, pad in zip(gpu_inputs(n, m, 8, 2, 64, torch.bfloat16,
                                                                 "HND", seed=6), (8, 64, 640)))
    out, lse = run_cudnn(op, q2, k2, v2, params)
    after = cudnn_backend.graph_cache_state()
    assert after["misses"] == before["misses"] and after["hits"] == before["hits"] + 1
    assert_matches(out, lse, *oracle(q2, k2, v2, params.sm_scale, causal, window), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("n, m, causal, window", REUSE_CASES)
def test_gpu_call_captured_in_a_cuda_graph(n, m, causal, window):
    """Warm on a side stream, capture there, replay on new data; then eager on the default
    stream again (the handle is re-bound when the stream changes)."""
    op = "single_decode" if n == 1 else "single_prefill"
    q, k, v = gpu_inputs(n, m, 8, 2, 128, torch.float16, "NHD", seed=7)
    features = {"lse", "gqa"} | ({"causal"} if causal else set()) | ({"window"} if window >= 0 else set())
    skip_unless_cudnn_serves(op, q, k, v, features, "NHD")
    params = params_for(torch.float16, 128, causal, window)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_cudnn(op, q, k, v, params)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out, lse = run_cudnn(op, q, k, v, params)
    q2, k2, v2 = gpu_inputs(n, m, 8, 2, 128, torch.float16, "NHD", seed=8)
    for dst, src in ((q, q2), (k, k2), (v, v2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    expected = oracle(q2, k2, v2, params.sm_scale, causal, window)
    assert_matches(out, lse, *expected, torch.float16)
    assert_matches(*run_cudnn(op, q2, k2, v2, params), *expected, torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("op, n, m, causal, window", [
    ("single_prefill", 37, 301, True, -1), ("single_prefill", 90, 200, False, 17),
    ("single_decode", 1, 513, False, 100),
])
def test_gpu_matches_reference_backend(op, n, m, causal, window):
    from flashinfer.dispatch import kernel_for

    try:
        reference = kernel_for("reference", op, "default")
    except LookupError as exc:
        pytest.skip(f"reference backend has no {op} kernel yet: {exc}")
    q, k, v = gpu_inputs(n, m, 8, 2, 128, torch.bfloat16, "HND")
    features = {"lse", "gqa"} | ({"causal"} if causal else set()) | ({"window"} if window >= 0 else set())
    skip_unless_cudnn_serves(op, q, k, v, features, "HND")
    params = params_for(torch.bfloat16, 128, causal, window)
    out, lse = run_cudnn(op, q, k, v, params)
    ref_out, ref_lse = reference(q, k, v, params)
    assert_matches(out, lse, ref_out, ref_lse, torch.bfloat16)
