"""The capability database: shipped records load, are consistent with the adapters, and the
loader rejects malformed files with the file and key named."""

from pathlib import Path

import pytest

from flashinfer.backend_names import BACKEND_NAMES
from flashinfer.capability_db import CapabilityDBError, database, load, parse_file
from flashinfer.device import simulated
from flashinfer.dispatch import Problem
from flashinfer.op_catalog import OPS


def test_every_backend_has_a_file_and_description():
    db = database()
    assert set(db.descriptions) == set(BACKEND_NAMES)
    assert all(db.descriptions[b] for b in BACKEND_NAMES)


def test_every_record_names_a_function_that_exists_or_is_planned():
    from flashinfer.backends import resolve

    for rec in database().records:
        if rec.planned:
            assert not rec.verified and rec.check_ref is None, rec
            continue
        assert rec.kernel.split(":")[0].split(".")[0] == rec.backend, rec  # its own package
        assert callable(resolve(rec.kernel)), rec
        if rec.check_ref is not None:
            assert rec.check_ref.split(":")[0].split(".")[0] == rec.backend, rec
            assert callable(resolve(rec.check_ref)), rec


def test_a_planned_record_is_never_usable():
    from flashinfer.device import simulated
    from flashinfer.dispatch import evaluate_candidates

    planned = [r for r in database().records if r.planned]
    assert planned  # the trtllm MoE, the CUTLASS FP4 GEMM
    for rec in planned:
        problem = Problem.make(rec.op, simulated(rec.sm_max or "9.0"))
        (cand,) = [c for c in evaluate_candidates(problem, assume_installed=True)
                   if c.backend == rec.backend and c.variant == rec.variant]
        assert cand.planned and not cand.usable
        assert any(r.field == "planned" for r in cand.reasons)


def test_reference_serves_every_op_on_cpu_with_every_feature():
    ops_with_records = {r.op for r in database().records}
    for op in ops_with_records:
        recs = database().for_backend_op("reference", op)
        assert recs, f"reference has no record for {op}"
        assert "cpu" in recs[0].devices
        assert recs[0].features == frozenset(OPS[op].features)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
backend = "triton"
description = "x"
[[op]]
name = "rmsnorm"
kernel = "triton.norm:rmsnorm"
sm_min = "8.0"
sm_max = "9.0"
verified = false
"""


def test_good_file_parses(tmp_path):
    backend, _, records = parse_file(_write(tmp_path, "triton.toml", GOOD), BACKEND_NAMES)
    assert backend == "triton" and records[0].sm_min == (8, 0) and records[0].variant == "default"
    assert records[0].verified_by is None and records[0].tested_by == ()


def test_evidence_keys_parse(tmp_path):
    text = GOOD.replace("verified = false", 'verified = true\nverified_on = ["9.0"]\n'
                        'tested_by = ["tests/norm/test_norm.py"]\n'
                        'verified_by = "benchmarks/results/gpu_tests_h200_2026-11-30.txt"')
    _, _, (rec,) = parse_file(_write(tmp_path, "triton.toml", text), BACKEND_NAMES)
    assert rec.tested_by == ("tests/norm/test_norm.py",)
    assert rec.verified_by == "benchmarks/results/gpu_tests_h200_2026-11-30.txt"


@pytest.mark.parametrize("change, where", [
    (('name = "rmsnorm"', 'name = "rmsnorm"\nhead_dims = [64]'), "head_dims"),
    (('name = "rmsnorm"', 'name = "rms_norm"'), "name"),
    (('sm_min = "8.0"', 'sm_min = "9.5"'), "sm_min/sm_max"),
    (('sm_min = "8.0"', 'sm_min = "eight"'), "sm_min/sm_max"),
    (('verified = false', ''), "verified"),
    (('verified = false', 'verified = false\ndtypes.q = ["float16"]'), "dtypes.q"),
    (('verified = false', 'verified = false\ndtypes.input = ["float17"]'), "dtypes.input"),
    (('verified = false', 'verified = false\nshape.head_dim = { max = 8 }'), "shape.head_dim"),
    (('verified = false', 'verified = false\nshape.hidden_size = { most = 8 }'), "shape.hidden_size"),
    (('verified = false', 'verified = false\nfeatures = ["causal"]'), "features"),
    (('backend = "triton"', 'backend = "tritonx"'), "backend"),
    (('kernel = "triton.norm:rmsnorm"', 'kernel = "triton.norm.rmsnorm"'), "kernel"),
    (('kernel = "triton.norm:rmsnorm"', ''), "planned"),
    (('kernel = "triton.norm:rmsnorm"', 'kernel = "triton.norm:rmsnorm"\nplanned = true'),
     "planned"),
    (('kernel = "triton.norm:rmsnorm"', 'planned = true\ncheck = "triton.norm:reasons"'),
     "planned"),
    (('kernel = "triton.norm:rmsnorm"', 'kernel = "triton.norm:rmsnorm"\ncheck = "x"'), "check"),
    (('verified = false', 'verified = false\nverified_by = "benchmarks/results/gpu_tests_x.txt"'),
     "verified_by"),
    (('verified = false', 'verified = true\nverified_by = "gpu_tests_x.txt"'), "verified_by"),
    (('verified = false', 'verified = false\ntested_by = ["test_norm.py"]'), "tested_by"),
    (('verified = false', 'verified = false\ntested_by = ["tests/test_norm.py"]'), "tested_by"),
    (('verified = false', 'verified = false\ntested_by = "tests/norm/test_norm.py"'), "tested_by"),
])
def test_malformed_record_names_file_and_key(tmp_path, change, where):
    text = GOOD.replace(*change)
    with pytest.raises(CapabilityDBError) as err:
        parse_file(_write(tmp_path, "triton.toml", text), BACKEND_NAMES)
    assert "triton.toml" in str(err.value) and where in str(err.value)


def test_invalid_toml_and_duplicate_variants(tmp_path):
    with pytest.raises(CapabilityDBError, match="not valid TOML"):
        parse_file(_write(tmp_path, "triton.toml", "backend = "), BACKEND_NAMES)
    with pytest.raises(CapabilityDBError, match="duplicate variant"):
        parse_file(_write(tmp_path, "triton.toml", GOOD + GOOD.split("description = \"x\"")[1]),
                   BACKEND_NAMES)


def test_missing_backend_file_is_an_error(tmp_path):
    _write(tmp_path, "triton.toml", GOOD)
    with pytest.raises(CapabilityDBError, match="no capability file"):
        load(tmp_path)


def _norm_problem(sm, dtype="bfloat16", hidden=4096, features=()):
    return Problem.make("rmsnorm", simulated(sm), dtypes={"input": dtype, "weight": dtype},
                        shape={"hidden_size": hidden, "num_rows": 8}, features=features)


def test_record_check_collects_every_reason(tmp_path):
    text = GOOD.replace('verified = false', 'verified = false\ndtypes.input = ["float16"]\n'
                        'shape.hidden_size = { max = 1024, multiple_of = 64 }\nrequires = ["no_such_mod_x"]')
    _, _, (rec,) = parse_file(_write(tmp_path, "triton.toml", text), BACKEND_NAMES)
    reasons = rec.check(_norm_problem("7.5", "bfloat16", 4100, ["fused_add"]))
    fields = [r.field for r in reasons]
    assert fields == ["sm", "dtype.input", "hidden_size", "feature", "import"]
    assert "requires SM 8.0..9.0, device is SM 7.5" in reasons[0].message
    assert "no_such_mod_x" in reasons[-1].message
    assert rec.check(_norm_problem("7.5", "bfloat16", 4100, ["fused_add"]), assume_installed=True)[-1].field != "import"
    assert rec.check(_norm_problem("cpu"))[0].field == "device"
    assert rec.check(_norm_problem("8.6", "float16", 512)) == [reasons[-1]]
