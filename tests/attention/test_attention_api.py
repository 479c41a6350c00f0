"""single_decode / single_prefill public API: validation (one test per rule), the Problem each
call builds, backend spellings, Decisions on simulated SMs, custom-op registration and
torch.compile."""

import pytest
import torch

from flashinfer import backend_names, dispatch, overrides
from flashinfer.backends.torch import attention as torch_native
from flashinfer.decode import single_decode_with_kv_cache
from flashinfer.device import simulated
from flashinfer.dispatch import (BackendUnavailableError, Problem, StrictModeError,
                                 record_decisions, select)
from flashinfer.overrides import use_backend
from flashinfer.prefill import single_prefill_with_kv_cache

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]


def qkv(qo_len=4, kv_len=9, hq=4, hk=2, d=16, dv=16, dtype=torch.float32):
    torch.manual_seed(0)
    return (torch.randn(qo_len, hq, d).to(dtype), torch.randn(kv_len, hk, d).to(dtype),
            torch.randn(kv_len, hk, dv).to(dtype))


# --- validation: one test per rule ---------------------------------------------------------

def _prefill(**kw):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v)
    args.update(kw)
    return single_prefill_with_kv_cache(**args)


def _decode(**kw):
    q, k, v = qkv()
    args = dict(q=q[0], k=k, v=v)
    args.update(kw)
    return single_decode_with_kv_cache(**args)


BAD_CALLS = {
    "q_not_tensor": (lambda: _prefill(q=[1.0]), TypeError, "q"),
    "q_rank": (lambda: _prefill(q=torch.randn(4, 16)), ValueError, "q must have rank 3"),
    "decode_q_rank": (lambda: _decode(q=torch.randn(1, 4, 16)), ValueError, "q must have rank 2"),
    "q_dtype": (lambda: _prefill(q=torch.ones(4, 4, 16, dtype=torch.int32)), ValueError, "q dtype"),
    "q_fp8": (lambda: _prefill(q=torch.zeros(4, 4, 16).to(torch.float8_e4m3fn)), ValueError, "fp8"),
    "k_rank": (lambda: _prefill(k=torch.randn(9, 32)), ValueError, "k must have rank 3"),
    "kv_dtype_mismatch": (lambda: _prefill(v=torch.randn(9, 2, 16, dtype=torch.float16)),
                          ValueError, "k and v must have the same dtype"),
    "device": (lambda: _prefill(k=torch.randn(9, 2, 16, device="meta"),
                                v=torch.randn(9, 2, 16, device="meta")), ValueError, "k is on meta"),
    "kv_layout_value": (lambda: _prefill(kv_layout="NDH"), ValueError, "NHD, HND"),
    "kv_layout_type": (lambda: _decode(kv_layout=0), TypeError, "kv_layout"),
    "heads_divide": (lambda: _prefill(k=torch.randn(9, 3, 16), v=torch.randn(9, 3, 16)),
                     ValueError, "num_qo_heads"),
    "k_head_dim": (lambda: _prefill(k=torch.randn(9, 2, 8)), ValueError, "head_dim of k"),
    "decode_v_head_dim": (lambda: _decode(v=torch.randn(9, 2, 8)), ValueError, "head_dim of v"),
    "kv_len_mismatch": (lambda: _prefill(v=torch.randn(8, 2, 16)), ValueError, "same kv_len"),
    "empty": (lambda: _prefill(k=torch.randn(0, 2, 16), v=torch.randn(0, 2, 16)), ValueError, "kv_len=0"),
    "custom_mask_shape": (lambda: _prefill(custom_mask=torch.ones(4, 8, dtype=torch.bool)),
                          ValueError, "custom_mask must have shape"),
    "custom_mask_dtype": (lambda: _prefill(custom_mask=torch.ones(4, 9)), ValueError,
                          "custom_mask must be a bool"),
    "custom_mask_device": (lambda: _prefill(custom_mask=torch.ones(4, 9, dtype=torch.bool, device="meta")),
                           ValueError, "custom_mask is on meta"),
    "packed_mask_size": (lambda: _prefill(packed_custom_mask=torch.zeros(4, dtype=torch.uint8)),
                         ValueError, "packed_custom_mask must be uint8 \\[5\\]"),
    "pos_encoding_mode": (lambda: _decode(pos_encoding_mode="ROPE"), ValueError, "pos_encoding_mode"),
    "rope_odd_head_dim": (lambda: _decode(q=torch.randn(4, 15), k=torch.randn(9, 2, 15),
                                          v=torch.randn(9, 2, 15), pos_encoding_mode="ROPE_LLAMA"),
                          ValueError, "even head_dim"),
    "window_left_value": (lambda: _prefill(window_left=-2), ValueError, "window_left"),
    "window_left_type": (lambda: _decode(window_left=2.0), TypeError, "window_left"),
    "soft_cap_negative": (lambda: _prefill(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    "sm_scale_type": (lambda: _decode(sm_scale=torch.tensor(0.1)), TypeError, "sm_scale"),
    "sm_scale_nan": (lambda: _prefill(sm_scale=float("nan")), ValueError, "sm_scale"),
    "rope_theta": (lambda: _prefill(rope_theta=0.0), ValueError, "rope_theta"),
    "rope_scale": (lambda: _decode(rope_scale=-1.0), ValueError, "rope_scale"),
    "o_dtype": (lambda: _prefill(o_dtype=torch.int8), ValueError, "o_dtype"),
    # the fp8-q path's dequantisation scales, given with a 16-bit q
    "scale_q": (lambda: _prefill(scale_q=torch.ones(4)), ValueError, "scale_q"),
    "scale_k": (lambda: _prefill(scale_k=torch.ones(2)), ValueError, "scale_k"),
    "scale_v": (lambda: _prefill(scale_v=torch.ones(2)), ValueError, "scale_v"),
    "kv_cache_sf": (lambda: _prefill(kv_cache_sf=(torch.ones(1), torch.ones(1))),
                    NotImplementedError, "kv_cache_sf"),
    "k_scale_tensor_shape": (lambda: _prefill(k_scale=torch.ones(3)), ValueError, "k_scale"),
    "q_scale_tensor": (lambda: _decode(q_scale=torch.tensor(1.0)), TypeError, "q_scale"),
    "q_scale_type": (lambda: _decode(q_scale="1"), TypeError, "q_scale"),
    "v_scale_inf": (lambda: _decode(v_scale=float("inf")), ValueError, "v_scale"),
    "backend_unknown": (lambda: _prefill(backend="fa9"), ValueError, "backend='fa9'"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_validation(name):
    call, exc, pattern = BAD_CALLS[name]
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.parametrize("name,good,bad,exc", [
    ("window_left", 1, True, TypeError), ("q_scale", 1.0, True, TypeError),
    ("sm_scale", 0.1, float("nan"), ValueError), ("kv_layout", "NHD", "nhd", ValueError),
])
def test_a_checked_decode_signature_never_admits_a_bad_argument(name, good, bad, exc):
    """The eager decode remembers calls that passed its checks (by the tensors' metadata and the
    arguments with their types): a value equal as a dict key (True == 1) is still checked."""
    for _ in range(2):  # the second call is a hit
        _decode(**{name: good})
    with pytest.raises(exc, match=name):
        _decode(**{name: bad})


def test_a_checked_decode_signature_follows_the_tensors():
    q, k, v = (torch.randn(4, 16), torch.randn(8, 2, 16), torch.randn(8, 2, 16))
    single_decode_with_kv_cache(q, k, v)
    with pytest.raises(ValueError, match="same dtype"):
        single_decode_with_kv_cache(q, k, v.half())
    with pytest.raises(ValueError, match="head_dim of k"):
        single_decode_with_kv_cache(q, k[..., :8], v[..., :8])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("extra", [{}, {"return_lse": True, "v_scale": 0.5, "window_left": 3},
                                   {"pos_encoding_mode": "ALIBI", "logits_soft_cap": 2.0}])
def test_a_remembered_decode_computes_and_dispatches_as_the_first_call(layout, extra):
    """A hit reuses the checked values and the dispatch facts: same result as the checked
    call, the same Problem, and an override made after the first call still applies."""
    torch.manual_seed(3)
    q, k, v = torch.randn(4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    if layout == "HND":
        k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
    with record_decisions() as log:
        first = single_decode_with_kv_cache(q, k, v, kv_layout=layout, **extra)
        second = single_decode_with_kv_cache(q, k, v, kv_layout=layout, **extra)
    assert log[0].problem == log[1].problem
    for a, b in zip(first if isinstance(first, tuple) else (first,),
                    second if isinstance(second, tuple) else (second,)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with use_backend("reference"), record_decisions() as log:
        single_decode_with_kv_cache(q, k, v, kv_layout=layout, **extra)
    assert log[0].backend == "reference" and log[0].source == "context"


def test_a_remembered_decode_runs_the_prepared_kernel_of_its_current_decision(monkeypatch):
    """A hit runs ``kernel.prepare(params, 1, kv_len, device)``'s function, made once per
    Decision: a new Decision (an override) binds its own kernel again."""
    from flashinfer.attention import single
    from flashinfer.checked_calls import CheckedCalls

    reference = dispatch.kernel_for("reference", "single_decode")
    prepared = []

    class Preparing:
        def __init__(self, name):
            self.name = name

        def __call__(self, q, k, v, params):  # the first (checked) call runs the kernel itself
            return reference(q, k, v, params)

        def prepare(self, params, qo_len, kv_len, device):
            prepared.append((self.name, qo_len, kv_len))
            return lambda q, k, v: reference(q, k, v, params)

    class Chosen:
        def __init__(self, name):
            self.kernel = Preparing(name)

    current = [Chosen("a")]
    monkeypatch.setattr(single, "_CHECKED_DECODES", CheckedCalls())
    monkeypatch.setattr(dispatch.KeyedDecision, "get", lambda self, backend="auto": current[0])
    monkeypatch.setattr(dispatch, "decide_keyed", lambda *a, **k: current[0])
    torch.manual_seed(4)
    q, k, v = torch.randn(4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    expected = single_decode_with_kv_cache(q, k, v, backend="reference")
    for _ in range(3):
        torch.testing.assert_close(single_decode_with_kv_cache(q, k, v), expected, rtol=0, atol=0)
    assert prepared == [("a", 1, 9)]  # call 1 checked and stored, call 2 bound, call 3 reused
    current[0] = Chosen("b")
    torch.testing.assert_close(single_decode_with_kv_cache(q, k, v), expected, rtol=0, atol=0)
    assert prepared == [("a", 1, 9), ("b", 1, 9)]


# --- the Problem each call builds ----------------------------------------------------------

def _problem(fn, *args, **kw):
    """The Problem of the kernel that ran (last in the block: a ROPE_LLAMA call also consults
    the call without it, flashinfer.attention.positions)."""
    with record_decisions() as log:
        fn(*args, **kw)
    assert len(log) == 1 or kw.get("pos_encoding_mode") == "ROPE_LLAMA"
    return log[-1].problem


def test_prefill_problem_facts():
    q, k, v = qkv(qo_len=5, kv_len=300, hq=8, hk=2, d=16, dv=8)
    p = _problem(single_prefill_with_kv_cache, q, k.transpose(0, 1), v.transpose(0, 1),
                 kv_layout="HND", causal=True, return_lse=True, o_dtype=torch.float16)
    assert p.op == "single_prefill" and p.layout == "HND" and p.device == "cpu"
    assert dict(p.dtypes) == {"q": "float32", "kv": "float32", "o": "float16"}
    assert dict(p.shape) == {"head_dim_qk": 16, "head_dim_vo": 8, "num_qo_heads": 8,
                             "num_kv_heads": 2, "qo_len": 8, "kv_len": 512}
    assert p.features == {"causal", "gqa", "lse", "head_dim_differs", "o_dtype_differs"}


@pytest.mark.parametrize("kw, features", [
    (dict(causal=True), {"causal"}),
    (dict(causal=True, custom_mask=torch.ones(4, 9, dtype=torch.bool)), {"custom_mask"}),
    (dict(window_left=7), {"window"}),
    (dict(window_left=8), set()),  # kv_len - 1: hides nothing
    (dict(logits_soft_cap=0.0), set()),
    (dict(logits_soft_cap=5.0), {"soft_cap"}),
    (dict(pos_encoding_mode="ALIBI"), {"alibi"}),
    (dict(pos_encoding_mode="ROPE_LLAMA"), {"rope_llama"}),
], ids=["causal", "mask_replaces_causal", "window", "wide_window", "cap0", "cap", "alibi", "rope"])
def test_prefill_features(kw, features):
    q, k, v = qkv(hk=4)
    assert _problem(single_prefill_with_kv_cache, q, k, v, **kw).features == features


def test_causal_dropped_for_one_query_row_and_decode_problem():
    q, k, v = qkv(qo_len=1, hk=4)
    assert _problem(single_prefill_with_kv_cache, q, k, v, causal=True).features == set()
    p = _problem(single_decode_with_kv_cache, q[0], k.half(), v.half(), return_lse=True)
    assert p.op == "single_decode" and p.features == {"lse", "kv_dtype_differs"}
    assert dict(p.shape)["qo_len"] == 1 and dict(p.dtypes)["o"] == "float32"


# --- backend spellings ---------------------------------------------------------------------

@pytest.mark.parametrize("spelling", sorted(backend_names.known_backend_spellings()))
def test_every_backend_spelling_is_accepted(spelling):
    """Reference spellings and upstream's kernel names (which fall through to the best backend,
    noted in the Decision) run on CPU; our other names are strict, so they fail with reasons."""
    q, k, v = qkv()
    allowed = backend_names.resolve_spelling(spelling)
    if backend_names.names_upstream_kernel(spelling):
        with record_decisions() as log:
            single_prefill_with_kv_cache(q, k, v, backend=spelling)
        assert log[-1].backend == "reference" and "upstream's kernel name" in log[-1].notes[0]
    elif allowed is None or all(a.split(":")[0] == "reference" for a in allowed):
        assert single_prefill_with_kv_cache(q, k, v, backend=spelling).shape == (4, 4, 16)
        assert single_decode_with_kv_cache(q[0], k, v, backend=spelling).shape == (4, 16)
    else:
        with pytest.raises(BackendUnavailableError):
            single_prefill_with_kv_cache(q, k, v, backend=spelling)


def test_explicit_torch_backend_on_cpu_lists_reasons():
    q, k, v = qkv()
    with pytest.raises(BackendUnavailableError, match="runs on cuda only") as info:
        single_prefill_with_kv_cache(q, k, v, backend="torch:sdpa_efficient")
    assert {c.name for c in info.value.candidates} == {"torch:sdpa_efficient"}


# --- Decisions on simulated SMs ------------------------------------------------------------

def make_problem(sm, op="single_prefill", dtype="float16", features=("causal", "gqa", "lse"),
                 head_dim=128, head_dim_vo=None, qo_len=64, kv_len=1024):
    return Problem.make(op, simulated(sm), dtypes={"q": dtype, "kv": dtype, "o": dtype},
                        shape={"head_dim_qk": head_dim, "head_dim_vo": head_dim_vo or head_dim,
                               "num_qo_heads": 32, "num_kv_heads": 8,
                               "qo_len": 1 if op == "single_decode" else qo_len, "kv_len": kv_len},
                        features=features, layout="NHD")


def candidate(decision, name):
    return next(c for c in decision.candidates if c.name == name)


def fields(decision, name):
    return {r.field for r in candidate(decision, name).reasons}


@pytest.mark.parametrize("op", ["single_decode", "single_prefill"])
@pytest.mark.parametrize("sm", SMS)
def test_decision_per_sm(sm, op):
    features = ("gqa", "lse") if op == "single_decode" else ("causal", "gqa", "lse")
    d = select(make_problem(sm, op, features=features), assume_installed=True)
    if sm == "cpu":
        assert d.name == "reference"
        assert fields(d, "torch:flash_varlen") == {"device"}
        assert fields(d, "torch:sdpa_efficient") == {"device"}
        return
    assert candidate(d, "torch:sdpa_efficient").usable
    if sm == "7.5":
        assert fields(d, "torch:flash_varlen") == {"sm"}
        assert d.name == "torch:sdpa_efficient"
        return
    assert candidate(d, "torch:flash_varlen").usable and candidate(d, "cudnn").usable
    # measured on the H200: FA2 before cuDNN (no per-shape build); single prefill on SM 9.0: FA3
    # first (no build either, 2.4x FA2 at causal 4096); see the rules' basis
    if op == "single_prefill" and sm == "9.0":
        assert d.name == "flash_attn:fa3" and "bench_runners_quick_h200" in d.basis
        assert d.order[0] == "flash_attn:fa3" and d.order.index("torch:flash_varlen") < d.order.index("cudnn")
    else:
        assert d.name == "torch:flash_varlen"
        assert d.order[:2] == ("torch:flash_varlen", "cudnn")
    assert d.order.index("torch:sdpa_efficient") < d.order.index("reference")


@pytest.mark.parametrize("sm", SMS[:-1])
def test_torch_backend_override_picks_variant(sm):
    levels = overrides.collect("attention", "torch")
    d = select(make_problem(sm), levels, assume_installed=True)
    assert d.source == "argument"
    assert d.name == ("torch:sdpa_efficient" if sm == "7.5" else "torch:flash_varlen")


def test_bfloat16_on_sm75_rejects_efficient_with_dtype_reason():
    d = select(make_problem("7.5", dtype="bfloat16"), assume_installed=True)
    assert fields(d, "torch:sdpa_efficient") == {"dtype.q"}
    assert d.name == "reference"
    assert candidate(select(make_problem("8.0", dtype="bfloat16"), assume_installed=True),
                     "torch:sdpa_efficient").usable


@pytest.mark.parametrize("sm", ["8.0", "9.0", "12.0"])
def test_soft_cap_rejects_torch_kernels_with_feature_reason(sm, monkeypatch):
    problem = make_problem(sm, features=("causal", "soft_cap"))
    d = select(problem, assume_installed=True)
    for name in ("torch:flash_varlen", "torch:sdpa_efficient"):
        reasons = candidate(d, name).reasons
        assert [(r.field, r.actual) for r in reasons] == [("feature", "soft_cap")]
    # FlashAttention serves soft cap (FA3 on 9.0, FA2 on 8.0+); below that only the reference
    expected = {"7.5": "reference", "9.0": "flash_attn:fa3"}.get(sm, "flash_attn:fa2")
    assert d.name == expected
    if expected == "reference":
        with pytest.raises(StrictModeError):
            select(problem, strict=True, assume_installed=True)


@pytest.mark.parametrize("feature, flash_ok, efficient_ok", [
    ("custom_mask", False, True),
    ("window", True, True),
    ("head_dim_differs", False, True),
    ("rope_llama", False, False),
])
def test_feature_support(feature, flash_ok, efficient_ok):
    head_dim_vo = 64 if feature == "head_dim_differs" else None
    d = select(make_problem("9.0", features=("gqa", feature), head_dim_vo=head_dim_vo),
               assume_installed=True)
    assert candidate(d, "torch:flash_varlen").usable == flash_ok
    assert candidate(d, "torch:sdpa_efficient").usable == efficient_ok
    if not flash_ok:
        assert fields(d, "torch:flash_varlen") == {"feature"}


def test_alibi_goes_to_the_efficient_kernel_not_torch_flash():
    # torch 2.11's FA2 build raises "does not support alibi" (seen on the H200)
    for features in (("alibi",), ("alibi", "causal")):
        d = select(make_problem("8.0", features=features), assume_installed=True)
        reasons = candidate(d, "torch:flash_varlen").reasons
        assert [(r.field, r.actual) for r in reasons] == [("feature", "alibi")]
        assert candidate(d, "torch:sdpa_efficient").usable


@pytest.mark.parametrize("head_dim, flash_field, efficient_ok", [
    (512, "head_dim_qk", True), (100, "head_dim_qk", False), (256, None, True), (64, None, True)])
def test_head_dim_limits(head_dim, flash_field, efficient_ok):
    d = select(make_problem("9.0", head_dim=head_dim), assume_installed=True)
    assert (flash_field in fields(d, "torch:flash_varlen")) if flash_field else \
        candidate(d, "torch:flash_varlen").usable
    assert candidate(d, "torch:sdpa_efficient").usable == efficient_ok


def test_float32_only_on_efficient():
    d = select(make_problem("8.0", dtype="float32"), assume_installed=True)
    assert {"dtype.q", "dtype.kv", "dtype.o"} <= fields(d, "torch:flash_varlen")
    assert d.name == "torch:sdpa_efficient"


def test_missing_schema_argument_is_a_reason(monkeypatch):
    monkeypatch.setattr(torch_native, "schema_arguments", lambda op: frozenset({"scale"}))
    d = select(make_problem("9.0", features=("causal", "window")), assume_installed=True)
    reasons = candidate(d, "torch:flash_varlen").reasons
    assert [(r.field, r.actual) for r in reasons] == [("torch_op", "window_size_left")]
    monkeypatch.setattr(torch_native, "schema_arguments", lambda op: None)
    dispatch.clear_cache()
    d = select(make_problem("9.0"), assume_installed=True)
    assert fields(d, "torch:sdpa_efficient") == {"torch_op"}


def test_installed_torch_has_the_schemas():
    flash = torch_native.schema_arguments("_flash_attention_forward")
    assert {"scale", "window_size_left", "window_size_right", "alibi_slopes"} <= flash
    assert "scale" in torch_native.schema_arguments("_scaled_dot_product_efficient_attention")


# --- custom ops and torch.compile ----------------------------------------------------------

def test_registered_as_custom_ops():
    assert hasattr(torch.ops.flashinfer, "single_prefill_with_kv_cache")
    assert hasattr(torch.ops.flashinfer, "single_decode_with_kv_cache")


def test_opcheck_prefill_and_decode():
    from flashinfer.attention import single

    q, k, v = qkv()
    mask = torch.rand(4, 9) > 0.3
    torch.library.opcheck(single._single_prefill_op.custom_op,
                          (q, k, v, mask, False, "NHD", "ALIBI", 0.25, 3, 0.0, 1.0, 1e4, True,
                           torch.float32, 1.0, "auto"))
    torch.library.opcheck(single._single_decode_op.custom_op,
                          (q[0], k, v, "NHD", "NONE", 0.25, -1, 0.0, 1.0, 1e4, False, 2.0, "auto"))


def test_compile_fullgraph_prefill():
    q, k, v = qkv()
    mask = torch.rand(4, 9) > 0.3

    def f(q, k, v, mask):
        out, lse = single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True,
                                                pos_encoding_mode="ALIBI")
        causal = single_prefill_with_kv_cache(q, k, v, causal=True, window_left=4)
        return out * 2, lse, causal

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, mask), f(q, k, v, mask))


def test_compile_fullgraph_decode():
    q, k, v = qkv()

    def f(q, k, v):
        out, lse = single_decode_with_kv_cache(q, k, v, return_lse=True, logits_soft_cap=3.0)
        return out + 1, lse

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q[0], k, v), f(q[0], k, v))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("per_head", [False, True])
def test_tensor_k_and_v_scales_equal_scaled_caches(layout, per_head):
    """k_scale / v_scale as tensors (one element or one per KV head) give what the same call
    gives on k and v multiplied by them (flashinfer.attention.scales)."""
    torch.manual_seed(11)
    q, k, v = torch.randn(3, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    ks, vs = (torch.tensor([0.5, 1.5]), torch.tensor([2.0, 0.25])) if per_head else (
        torch.tensor([0.5]), torch.tensor(2.0))
    kk, vv = k * ks.expand(2)[None, :, None], v * vs.reshape(-1).expand(2)[None, :, None]
    if layout == "HND":
        k, v, kk, vv = (t.transpose(0, 1).contiguous() for t in (k, v, kk, vv))
    got = single_prefill_with_kv_cache(q, k, v, causal=True, kv_layout=layout, k_scale=ks,
                                       v_scale=vs, return_lse=True)
    want = single_prefill_with_kv_cache(q, kk, vv, causal=True, kv_layout=layout, return_lse=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    got = single_decode_with_kv_cache(q[0], k, v, kv_layout=layout, k_scale=ks, v_scale=vs)
    torch.testing.assert_close(got, single_decode_with_kv_cache(q[0], kk, vv, kv_layout=layout),
                               rtol=1e-5, atol=1e-5)
