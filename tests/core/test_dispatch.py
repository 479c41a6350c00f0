"""The dispatcher core: Problem, select(), overrides and their precedence, strict mode, tuned
rules. Everything runs on simulated devices, without a GPU."""

import json
import threading

import pytest

from flashinfer import use_backend
from flashinfer.device import parse_sm, simulated, sm_family
from flashinfer.dispatch import (
    BackendUnavailableError, NoBackendError, Problem, StrictModeError, decide, length_bucket,
    select,
)
from flashinfer.dispatch_rules import DispatchRulesError, default_rules, parse_file
from flashinfer.backend_names import family_spelling
from flashinfer.overrides import collect, resolve_spelling


def norm_problem(sm="9.0", features=(), dtype="bfloat16"):
    return Problem.make("rmsnorm", simulated(sm), dtypes={"input": dtype, "weight": dtype},
                        shape={"hidden_size": 4096, "num_rows": 16}, features=features)


def test_problem_is_hashable_and_value_equal():
    assert norm_problem() == norm_problem() and hash(norm_problem()) == hash(norm_problem())
    assert norm_problem("8.0") != norm_problem("9.0")
    assert {norm_problem(): 1}[norm_problem()] == 1


def test_select_rejects_features_the_op_lacks():
    with pytest.raises(AssertionError, match="no feature"):
        select(norm_problem(features=["causal"]))


def test_select_is_cached_on_the_problem_key():
    first = select(norm_problem(), assume_installed=True)
    assert select(norm_problem(), assume_installed=True) is first
    assert select(norm_problem("8.0"), assume_installed=True) is not first


@pytest.mark.parametrize("text, expected", [("9.0", (9, 0)), ("90", (9, 0)), ("sm_90a", (9, 0)),
                                            ("12.0", (12, 0)), ("120", (12, 0)), ("8.6", (8, 6))])
def test_parse_sm(text, expected):
    assert parse_sm(text) == expected


def test_parse_sm_rejects_garbage():
    with pytest.raises(ValueError, match="SM version"):
        parse_sm("hopper")


@pytest.mark.parametrize("sm, family", [((7, 5), "7.5"), ((8, 0), "8.0"), ((8, 6), "8.0"),
                                        ((8, 9), "8.9"), ((9, 0), "9.0"), ((10, 0), "10"),
                                        ((10, 3), "10"), ((12, 0), "12"), (None, "cpu")])
def test_sm_family(sm, family):
    assert sm_family(sm) == family


def test_length_bucket():
    assert [length_bucket(n) for n in (0, 1, 2, 3, 4, 5, 1000, 1024)] == [1, 1, 2, 4, 4, 8, 1024, 1024]


def test_default_decision_records_source_and_rejections():
    d = select(norm_problem("cpu"))
    assert d.backend == "reference" and d.source == "default" and d.rule == "priority[cpu]"
    triton = next(c for c in d.candidates if c.backend == "triton")
    assert not triton.usable and triton.reasons[0].field == "device"
    assert "reference" in d.explain() and "triton" in d.explain()
    assert d.as_dict()["candidates"]


# --- overrides -------------------------------------------------------------------------------

def test_alias_spellings():
    assert resolve_spelling("auto") is None
    assert resolve_spelling("fa3") == ("flash_attn:fa3",)
    assert resolve_spelling("trtllm-gen") == ("trtllm",)
    assert resolve_spelling("cublas") == ("torch",)
    assert resolve_spelling("CUDNN") == ("cudnn",)
    assert resolve_spelling("torch:flash_varlen") == ("torch:flash_varlen",)
    with pytest.raises(ValueError, match="valid:.*cudnn"):
        resolve_spelling("cudnnn")
    with pytest.raises(TypeError):
        resolve_spelling(3)


@pytest.mark.parametrize("family,spelling,means", [
    ("gemm", "cublas", "cublas"), ("gemm", "cudnn", "cudnn"),
    ("segment_gemm", "sm90", "torch"), ("moe", "cutlass", "auto"), ("moe", "torch", "torch"),
    ("fp8_quantization", "cutile", "torch"), ("fp4_quantization", "cute-dsl", "torch"),
    ("fp4_quantization", "reference", "reference"),
])
def test_family_spellings_come_from_one_table(family, spelling, means):
    assert family_spelling(family, spelling) == means


@pytest.mark.parametrize("family,spelling,match", [
    ("gemm", "tinygemm", "no counterpart"), ("segment_gemm", "cake", "no counterpart"),
    ("moe", "cake", "no counterpart"), ("fp8_quantization", "cuda", "allowed: auto, torch"),
    ("fp4_quantization", "triton", "allowed: auto, torch, reference, cuda, cute-dsl"),
])
def test_family_spellings_without_a_counterpart_are_errors(family, spelling, match):
    with pytest.raises(ValueError, match=match):
        family_spelling(family, spelling)
    with pytest.raises(TypeError, match="backend must be a str"):
        family_spelling(family, None)


def test_argument_override_is_strict_and_raises_with_reasons():
    with pytest.raises(BackendUnavailableError) as err:
        select(norm_problem("cpu"), collect("norm", "triton"))
    assert "runs on cuda only" in str(err.value) and "backend='triton'" in str(err.value)
    d = select(norm_problem("cpu"), collect("norm", "reference"))
    assert d.backend == "reference" and d.source == "argument"


def test_argument_naming_a_backend_without_a_kernel_says_so():
    with pytest.raises(BackendUnavailableError, match="flash_attn has no kernel for rmsnorm"):
        select(norm_problem(), collect("norm", "flash_attn"))
    with pytest.raises(BackendUnavailableError, match="cutlass has no kernel for rmsnorm"):
        select(norm_problem(), collect("norm", "cutlass"), strict=True)


@pytest.mark.parametrize("spelling", ["cutlass", "fa3", "cudnn", "trtllm-gen"])
def test_an_upstream_kernel_name_as_argument_falls_through_and_says_why(spelling, monkeypatch):
    """Upstream code passes its kernel names where upstream's kernel runs anything: the kernels
    they map to when usable, else the next level or the rules, with a note; strict=True (what
    FLASHINFER_STRICT=1 sets) makes them strict."""
    auto = select(norm_problem(), collect("norm", None))
    d = select(norm_problem(), collect("norm", spelling))
    assert (d.name, d.source) == (auto.name, "default")
    assert f"backend={spelling!r} (upstream's kernel name)" in d.notes[0]
    with use_backend("cudnn"):  # global, and cudnn has no rmsnorm kernel: skipped too
        assert select(norm_problem(), collect("norm", spelling)).name == auto.name
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "reference")
    assert select(norm_problem(), collect("norm", spelling)).source == "environment"


def test_an_upstream_kernel_name_that_can_serve_is_used():
    problem = Problem.make("single_prefill", simulated("9.0"),
                           dtypes={"q": "float16", "kv": "float16", "o": "float16"},
                           shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 8,
                                  "num_kv_heads": 8, "qo_len": 128, "kv_len": 128},
                           features=["causal"], layout="NHD")
    d = select(problem, collect("attention", "fa3"), assume_installed=True)
    assert (d.name, d.source, d.notes) == ("flash_attn:fa3", "argument", ())


def test_precedence_argument_context_env(monkeypatch):
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "reference")
    assert select(norm_problem(), collect("norm", None), assume_installed=True).source == "environment"
    with use_backend(norm="triton"):
        d = select(norm_problem(), collect("norm", None), assume_installed=True)
        assert (d.backend, d.source) == ("triton", "context")
        d = select(norm_problem(), collect("norm", "reference"), assume_installed=True)
        assert (d.backend, d.source) == ("reference", "argument")
        # "auto" is no opinion: the context still decides
        assert select(norm_problem(), collect("norm", "auto"), assume_installed=True).source == "context"


def test_family_env_beats_global_env(monkeypatch):
    monkeypatch.setenv("FLASHINFER_BACKEND", "reference")
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "triton")
    d = select(norm_problem(), collect("norm", None), assume_installed=True)
    assert (d.backend, d.rule) == ("triton", "FLASHINFER_NORM_BACKEND=triton")


def test_global_override_is_skipped_for_ops_the_backend_lacks(monkeypatch):
    monkeypatch.setenv("FLASHINFER_BACKEND", "cudnn")
    d = select(norm_problem(), collect("norm", None), assume_installed=True)
    assert d.source == "default" and any("FLASHINFER_BACKEND=cudnn ignored" in n for n in d.notes)


def test_unknown_env_backend_lists_valid_names(monkeypatch):
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "bogus")
    with pytest.raises(ValueError, match="FLASHINFER_NORM_BACKEND='bogus'.*reference"):
        collect("norm", None)


def test_use_backend_restores_on_exit_and_on_error():
    with use_backend("reference"):
        assert collect("norm", None)[0].source == "context"
    assert collect("norm", None) == ()
    with pytest.raises(RuntimeError):
        with use_backend(norm="reference"):
            raise RuntimeError("boom")
    assert collect("norm", None) == ()


def test_use_backend_nests_and_validates():
    with use_backend(norm="reference"):
        with use_backend(norm="triton"):
            assert collect("norm", None)[0].spelling == "triton"
        assert collect("norm", None)[0].spelling == "reference"
    with pytest.raises(ValueError, match="unknown op family"):
        with use_backend(normz="triton"):
            pass
    with pytest.raises(ValueError, match="not a known backend"):
        with use_backend("nope"):
            pass


def test_use_backend_is_context_local():
    seen = {}
    with use_backend(norm="reference"):
        thread = threading.Thread(target=lambda: seen.setdefault("levels", collect("norm", None)))
        thread.start()
        thread.join()
    assert seen["levels"] == ()


# --- strict mode and nothing-fits ------------------------------------------------------------

def test_strict_mode_refuses_reference_on_gpu(monkeypatch):
    monkeypatch.setenv("FLASHINFER_STRICT", "1")
    problem = norm_problem("7.0")  # triton record starts at 7.5: only the reference is left
    with pytest.raises(StrictModeError, match="FLASHINFER_STRICT=1") as err:
        decide(problem)
    assert "requires SM 7.5..12.1" in str(err.value)
    assert decide(norm_problem("cpu")).backend == "reference"  # CPU fallback is not a slowdown


def test_nothing_fits_lists_every_backend():
    problem = norm_problem("9.0", dtype="int8")
    problem = Problem(problem.op, "cuda", (6, 0), problem.dtypes, problem.shape)
    with pytest.raises(NoBackendError) as err:
        select(problem)
    text = str(err.value)
    assert "no backend can run rmsnorm" in text and "reference:" in text and "triton:" in text


# --- rules -----------------------------------------------------------------------------------

def test_shipped_rules_parse_and_name_known_backends():
    rules = default_rules()
    assert "rmsnorm" in rules
    for op_rules in rules.values():
        assert op_rules.priority_basis
        assert all(t.basis for t in op_rules.thresholds)


def test_rules_validation(tmp_path):
    path = tmp_path / "rmsnorm.toml"
    path.write_text('op = "rmsnorm"\npriority_basis = "x"\n[priority]\n"9.5" = ["triton"]\n')
    with pytest.raises(DispatchRulesError, match="rmsnorm.toml: priority.9.5"):
        parse_file(path)
    path.write_text('op = "rmsnorm"\npriority_basis = "x"\n[priority]\ncpu = ["tritn"]\n')
    with pytest.raises(DispatchRulesError, match="unknown backend 'tritn'"):
        parse_file(path)
    path.write_text('op = "rmsnorm"\npriority_basis = "x"\n[priority]\ncpu = ["triton"]\n'
                    '[[threshold]]\nname = "t"\nfamilies = ["9.0"]\norder = ["triton"]\n')
    with pytest.raises(DispatchRulesError, match="threshold.0..basis"):
        parse_file(path)
    path.write_text('op = "rmsnorm"\npriority_basis = "x"\n[priority]\ncpu = ["triton"]\n'
                    '[[threshold]]\nname = "t"\nfamilies = ["9.0"]\nfeatures = ["fused"]\n'
                    'order = ["triton"]\nbasis = "b"\n')
    with pytest.raises(DispatchRulesError, match="threshold.0..features"):
        parse_file(path)


def test_threshold_rule_reorders(tmp_path, monkeypatch):
    rules = tmp_path / "tuned.json"
    rules.write_text(json.dumps({"rules": [{
        "op": "rmsnorm", "name": "small_rows_reference", "families": ["9.0"],
        "when": {"hidden_size": {"max": 4096}}, "order": ["reference", "triton"], "basis": "test"}]}))
    big = Problem.make("rmsnorm", simulated("9.0"), dtypes={"input": "bfloat16"},
                       shape={"hidden_size": 8192, "num_rows": 16})
    d = select(norm_problem(), tuned_path=str(rules), assume_installed=True)
    assert (d.backend, d.source, d.rule) == ("reference", "tuned", "small_rows_reference")
    assert select(big, tuned_path=str(rules), assume_installed=True).backend == "triton"
    monkeypatch.setenv("FLASHINFER_TUNED_RULES", str(rules))
    assert decide(norm_problem()).source == "tuned"


def test_threshold_rule_with_features_applies_only_to_calls_using_them(tmp_path):
    rules = tmp_path / "tuned.json"
    rules.write_text(json.dumps({"rules": [{
        "op": "rmsnorm", "name": "fused_reference", "families": ["9.0"], "features": ["fused_add"],
        "order": ["reference", "triton"], "basis": "test"}]}))
    fused = Problem.make("rmsnorm", simulated("9.0"), dtypes={"input": "bfloat16"},
                         shape={"hidden_size": 4096, "num_rows": 16}, features=["fused_add"])
    assert select(fused, tuned_path=str(rules), assume_installed=True).rule == "fused_reference"
    assert select(norm_problem(), tuned_path=str(rules), assume_installed=True).backend == "triton"


def test_bad_tuned_rules_file(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text('{"rules": [{"op": "nope"}]}')
    with pytest.raises(DispatchRulesError, match="unknown op"):
        select(norm_problem(), tuned_path=str(path))
    with pytest.raises(DispatchRulesError, match="cannot read"):
        select(norm_problem(), tuned_path=str(tmp_path / "missing.json"))


def test_record_decisions_sees_cached_decisions_too():
    from flashinfer import record_decisions

    problem = norm_problem("cpu")
    with record_decisions() as log:
        decide(problem)
        decide(problem)
    assert [d.backend for d in log] == ["reference", "reference"] and log[0] is log[1]
    decide(problem)
    assert len(log) == 2


def test_shipped_tuned_rules_example_flips_attention_to_cudnn():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "tuned_rules_cudnn_fixed_shapes.json"
    problem = Problem.make(
        "single_prefill", simulated("9.0"), dtypes={"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"},
        shape={"head_dim_qk": 128, "head_dim_vo": 128, "num_qo_heads": 32, "num_kv_heads": 8,
               "qo_len": 4096, "kv_len": 4096}, features=["causal", "gqa"], layout="NHD")
    assert select(problem, assume_installed=True).name == "flash_attn:fa3"
    tuned = select(problem, tuned_path=str(path), assume_installed=True)
    assert (tuned.name, tuned.source, tuned.rule) == ("cudnn", "tuned", "repeated_shapes_prefer_cudnn")


def test_unlisted_backends_rank_just_before_the_reference(tmp_path):
    rules = tmp_path / "tuned.json"
    rules.write_text(json.dumps({"rules": [{
        "op": "rmsnorm", "name": "forgets_triton", "families": ["9.0"], "order": ["reference"],
        "basis": "test"}]}))
    d = select(norm_problem(), tuned_path=str(rules), assume_installed=True)
    assert d.order == ("triton", "reference")


def test_decide_each_memo_follows_overrides_caches_and_recording(monkeypatch):
    from flashinfer.dispatch import clear_cache, decide_each, record_decisions

    monkeypatch.delenv("FLASHINFER_NORM_BACKEND", raising=False)
    problems = [Problem.make("rmsnorm", simulated("cpu"), dtypes={"input": "float32", "weight": "float32"},
                             shape={"hidden_size": 64, "num_rows": 3})]
    memo: dict = {}
    first = decide_each(problems, "auto", memo)
    assert decide_each(problems, "auto", memo) is first  # a plan() per step: reused
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "reference")
    forced = decide_each(problems, "auto", memo)
    assert forced is not first and forced[0].backend == "reference"
    clear_cache()
    assert decide_each(problems, "auto", memo) is not forced
    with record_decisions() as log:  # an open recording sees every decision
        decide_each(problems, "auto", memo)
    assert [d.backend for d in log] == ["reference"]
    assert isinstance(decide_each(problems, "flash_attn", memo)[0], (NoBackendError, BackendUnavailableError))


def test_keyed_decision_follows_overrides_backend_caches_and_recording(monkeypatch):
    """A memo entry's KeyedDecision answers like decide_keyed: it re-decides when the override
    state, the backend argument or the cache generation changes, and an open recording sees it."""
    from flashinfer import use_backend
    from flashinfer.dispatch import KeyedDecision, clear_cache, record_decisions

    monkeypatch.delenv("FLASHINFER_NORM_BACKEND", raising=False)
    problem = Problem.make("rmsnorm", simulated("9.0"), dtypes={"input": "bfloat16", "weight": "bfloat16"},
                           shape={"hidden_size": 4096, "num_rows": 8})
    made = []

    def make_problem():
        made.append(1)
        return problem

    slot = KeyedDecision(("rmsnorm", "test-slot", 4096), make_problem)
    first = slot.get("auto")
    assert slot.get("auto") is first and first.backend == decide(problem).backend
    assert slot.get("reference").backend == "reference"
    monkeypatch.setenv("FLASHINFER_NORM_BACKEND", "reference")
    assert slot.get("auto").source == "environment"
    monkeypatch.delenv("FLASHINFER_NORM_BACKEND")
    with use_backend(norm="reference"):
        assert slot.get("auto").source == "context"
    assert slot.get("auto") is first
    before = len(made)
    clear_cache()
    assert slot.get("auto") is not first and len(made) == before + 1
    with record_decisions() as log:
        slot.get("auto")
    assert [d.backend for d in log] == [first.backend]
