"""The ``flashinfer`` command line and the representative-problem builder behind it.

The entry point (``python -m flashinfer``) is exercised in subprocesses with a controlled
environment; the explain matrix (ops with a rules file x simulated SMs) calls ``cli.main`` in
process, to keep the suite fast. The matrix grows by itself as ``dispatch_rules/*.toml`` appear.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashinfer
from flashinfer import cli, dispatch_rules, envs
from flashinfer.backend_names import BACKEND_NAMES
from flashinfer.capability_db import database
from flashinfer.device import simulated
from flashinfer.dispatch import select
from flashinfer.dispatch_rules import ordering
from flashinfer.op_catalog import OPS
from flashinfer.backend_names import known_backend_spellings
from flashinfer.problems import default_shape, representative

REPO = Path(__file__).resolve().parents[2]
SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]
RULE_OPS = sorted(p.stem for p in Path(dispatch_rules.__file__).parent.glob("*.toml"))


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without any FLASHINFER_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashinfer", *args], cwd=REPO, env=clean_env(**env),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def no_flashinfer_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("FLASHINFER_"):
            monkeypatch.delenv(name)


def call(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``cli.main`` in process; argparse errors become exit status 2 as on the command line."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------------------------
# entry point, show-config, list-backends (subprocess)


def test_version_and_help():
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == (
        f"flashinfer {flashinfer.__version__} (upstream API; package "
        f"{flashinfer.__package_version__})")


def test_version_policy():
    """__version__: the upstream release whose API this package matches (engines compare it
    against upstream's); __package_version__: this package's own release, pyproject's."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert flashinfer.__package_version__ == project["version"]
    spec = (REPO.parent / "shared" / "api-spec.md")
    if spec.is_file():  # the studied release, when the spec is beside the checkout
        assert f"**{flashinfer.__version__}**" in spec.read_text()
    assert tuple(map(int, flashinfer.__version__.split("."))) >= (0, 6)
    res = run_cli()
    assert res.returncode == 0
    for command in ("show-config", "list-backends", "explain", "clear-cache"):
        assert command in res.stdout


def test_show_config_text():
    res = run_cli("show-config", FLASHINFER_NORM_BACKEND="bogus")
    assert res.returncode == 0, res.stderr
    for section in ("=== Versions ===", "=== Backend packages ===", "=== Device ===",
                    "=== Environment variables ===", "=== Ops x backends"):
        assert section in res.stdout
    for name in envs.REGISTRY:
        assert name in res.stdout
    for op in OPS:
        assert f"\n{op} " in res.stdout
    assert cli.UNVERIFIED_LEGEND in res.stdout
    if any(not r.verified for r in database().records):
        assert "* " in res.stdout  # an unverified record is starred
    # a malformed variable is shown with its error, and does not stop the report
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("FLASHINFER_NORM_BACKEND"))
    assert "'bogus'" in line and "INVALID" in line and "reference" in line


def test_show_config_json_and_malformed_env():
    res = run_cli("show-config", "--json", FLASHINFER_STRICT="maybe", FLASHINFER_LOGLEVEL="2")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["flashinfer"] == flashinfer.__version__
    assert data["device"]["kind"] == ("cuda" if __import__("torch").cuda.is_available() else "cpu")
    assert set(data["packages"]) == set(BACKEND_NAMES)
    assert {"cudnn", "cutlass_cppgen", "flash_attn_interface", "tensorrt_llm", "triton"} <= {
        p["module"] for pkgs in data["packages"].values() for p in pkgs}
    rows = {row["name"]: row for row in data["env"]}
    assert set(rows) == set(envs.REGISTRY)
    strict = rows["FLASHINFER_STRICT"]
    assert strict["raw"] == "maybe" and strict["value"] is None
    assert "FLASHINFER_STRICT" in strict["error"] and "true/false" in strict["error"]
    assert rows["FLASHINFER_LOGLEVEL"]["value"] == 2 and rows["FLASHINFER_LOGLEVEL"]["error"] is None
    assert rows["FLASHINFER_CACHE_DIR"]["default"] == envs.CACHE_DIR.default
    assert set(data["ops"]) == set(OPS)
    for op, entry in data["ops"].items():
        declared = {r.backend for r in database().for_op(op)}
        assert {k["backend"] for k in entry["kernels"]} == set(BACKEND_NAMES)
        planned = {(r.backend, r.variant) for r in database().for_op(op) if r.planned}
        for k in entry["kernels"]:
            if k["backend"] not in declared:
                assert k["status"] == "no kernel"
            elif (k["backend"], k["variant"]) in planned:
                assert k["status"] == "planned" and k["reason"] is None
            else:
                assert k["status"] in ("usable", "rejected")
                assert (k["reason"] is None) == (k["status"] == "usable")
    assert data["planned_backends"] == cli.planned_backends()


def test_planned_records_are_shown_as_planned_not_as_backends(capsys):
    """A record with ``planned = true`` (declared, no kernel wired) is never a backend that runs:
    show-config's op table and list-backends say planned, and a backend with nothing but
    planned records is marked so (its packages get no pip hint: installing them changes nothing)."""
    db = database()
    planned = [r for r in db.records if r.planned]
    assert planned, "no planned record left: drop this test or keep one as a fixture"
    wholly_planned = cli.planned_backends()
    assert wholly_planned == [b for b in BACKEND_NAMES
                              if all(r.planned for r in db.records if r.backend == b)]
    rc, text, _ = call(capsys, "show-config")
    assert rc == 0
    table = text.split("=== Ops x backends", 1)[1]
    for rec in planned:
        block = table.split(f"\n{rec.op} ", 1)[1].split("(auto picks)", 2)[1]
        line = next(ln for ln in block.splitlines() if ln.split()[:1] == [rec.key.removesuffix(":default")])
        assert cli.PLANNED_RECORD in line and "usable" not in line and "*" not in line
    packages = text.split("=== Backend packages ===", 1)[1].split("===", 1)[0]
    for backend in wholly_planned:
        line = next(ln for ln in packages.splitlines() if ln.startswith(backend + " "))
        assert cli.PLANNED_BACKEND in line and "pip install" not in line
    rc, text, _ = call(capsys, "list-backends")
    for rec in planned:
        name = rec.op if rec.variant == "default" else f"{rec.op}:{rec.variant}"
        section = text.split(f"\n{rec.backend}: ", 1)[1].split("\n\n", 1)[0]
        line = next(ln for ln in section.splitlines() if ln.split()[:1] == [name])
        assert cli.PLANNED_RECORD in line
    for backend in wholly_planned:
        assert f"[{cli.PLANNED_BACKEND}]" in text.split(f"\n{backend}: ", 1)[1].splitlines()[0]


def test_list_backends(capsys):
    res = run_cli("list-backends", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    db = database()
    assert list(data) == list(BACKEND_NAMES)
    for backend, info in data.items():
        assert info["description"] == db.descriptions[backend]
        records = [r for r in db.records if r.backend == backend]
        assert [(o["op"], o["variant"], o["verified"], o["planned"]) for o in info["ops"]] == [
            (r.op, r.variant, r.verified, r.planned) for r in records]
        assert info["planned"] == (backend in cli.planned_backends())
        for pkg in info["packages"]:
            assert pkg["installed"] == (pkg["error"] is None)
    rc, text, _ = call(capsys, "list-backends")
    assert rc == 0
    for backend in BACKEND_NAMES:
        assert f"{backend}: {db.descriptions[backend]}" in text


# --------------------------------------------------------------------------------------------
# explain


def expected_choice(problem, candidates) -> str:
    """What the rules promise: the first usable kernel in the rule's order, else by registry order."""
    usable = [c for c in candidates if c.usable]
    for spec in ordering(problem, None).order:
        for c in usable:
            if spec in (c.backend, f"{c.backend}:{c.variant}"):
                return c.name
    rest = sorted((c for c in usable if c.backend != "reference"),
                  key=lambda c: BACKEND_NAMES.index(c.backend))
    return (rest or usable)[0].name


@pytest.mark.parametrize("sm", SMS + ["cpu"])
@pytest.mark.parametrize("op", RULE_OPS)
def test_explain_matrix(op, sm, capsys, no_flashinfer_env):
    where = ["--cpu"] if sm == "cpu" else ["--sm", sm]
    rc, out, err = call(capsys, "explain", op, *where, "--assume-installed", "--json")
    assert rc == 0, err
    data = json.loads(out)
    problem = representative(op, simulated(None if sm == "cpu" else sm))
    decision = select(problem, assume_installed=True, triton_interpret=envs.TRITON_INTERPRET.get())
    assert data == decision.as_dict()
    assert data["source"] == "default"
    assert decision.name == expected_choice(problem, decision.candidates)
    records = {(r.backend, r.variant): r for r in database().for_op(op)}
    for cand in decision.candidates:
        rec = records[(cand.backend, cand.variant)]
        fields = {r.field for r in cand.reasons}
        if sm == "cpu":
            runs_on_cpu = "cpu" in rec.devices or (rec.cpu_under_triton_interpret
                                                  and envs.TRITON_INTERPRET.get())
            assert ("device" in fields) == (not runs_on_cpu)
        else:
            in_range = rec.sm_min <= problem.sm <= rec.sm_max
            assert ("sm" in fields) == (not in_range), (cand.name, fields)


@pytest.mark.parametrize("op", RULE_OPS)
def test_explain_text(op, capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", op, "--sm", "9.0")
    assert rc == 0
    assert "device:  simulated SM 9.0" in out and "chosen:" in out and "order:" in out
    for rec in database().for_op(op):
        assert rec.key.removesuffix(":default") in out


def test_explain_builds_problem_from_options(capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", "single_prefill", "--cpu", "--dtype", "bf16", "--head-dim", "64",
                      "--num-qo-heads", "16", "--num-kv-heads", "16", "--qo-len", "100", "--kv-len",
                      "300", "--causal", "--feature", "lse", "soft_cap", "--layout", "HND", "--json")
    assert rc == 0
    problem = json.loads(out)["problem"]
    assert problem["dtypes"] == {"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"}
    assert problem["shape"] == {"head_dim_qk": 64, "head_dim_vo": 64, "num_qo_heads": 16,
                                "num_kv_heads": 16, "qo_len": 128, "kv_len": 512}
    assert problem["features"] == ["causal", "lse", "soft_cap"]  # no gqa: equal head counts
    assert problem["layout"] == "HND" and problem["device"] == "cpu"


def test_explain_shape_option_and_index_roles(capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", "rope", "--sm", "9.0", "--dtype", "float32",
                      "--shape", "rotary_dim=64", "--json")
    assert rc == 0
    problem = json.loads(out)["problem"]
    assert problem["dtypes"]["input"] == "float32" and problem["dtypes"]["pos"] != "float32"
    assert problem["shape"]["rotary_dim"] == 64 and "partial_rotary" in problem["features"]


def test_explain_backend_argument_goes_through_overrides(capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", "rmsnorm", "--sm", "9.0", "--backend", "ref", "--json")
    assert rc == 0
    data = json.loads(out)
    assert (data["backend"], data["source"]) == ("reference", "argument")


def test_explain_backend_that_cannot_run_exits_1(capsys, no_flashinfer_env):
    rc, out, err = call(capsys, "explain", "rmsnorm", "--sm", "7.0", "--backend", "triton")
    assert rc == 1 and out == ""
    assert "BackendUnavailableError" in err and "triton" in err and "requires SM" in err
    rc, out, _ = call(capsys, "explain", "rmsnorm", "--sm", "7.0", "--backend", "triton", "--json")
    data = json.loads(out)
    assert rc == 1 and data["error"] == "BackendUnavailableError"
    assert any("requires SM" in r for c in data["candidates"] for r in c["reasons"])


def test_explain_no_backend_exits_1(capsys, no_flashinfer_env):
    rc, _, err = call(capsys, "explain", "single_decode", "--cpu", "--dtype", "int8")
    assert rc == 1
    assert "NoBackendError" in err and "q dtype int8" in err


@pytest.mark.parametrize("argv, words", [
    (["explain", "no_such_op"], ["'no_such_op'", "neither an op nor a public function",
                                  "explain --list"]),
    (["explain"], ["name an op or a public function", "explain --list"]),
    (["explain", "mm_fp9"], ["did you mean", "mm_fp8", "bmm_fp8", "mm_fp4"]),
    (["explain", "decode"], ["did you mean", "single_decode", "batch_decode",
                             "single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper"]),
    (["explain", "get_seq_lens"], ["get_seq_lens", "flashinfer.page", "dispatches no op"]),
    (["explain", "rmsnorm", "--sm", "0.9"], ["SM 0.9", "not the SM of a CUDA GPU", "5.0"]),
    (["explain", "rmsnorm", "--sm", "99"], ["'99'", "9.9", "not the SM of a CUDA GPU", "9.0"]),
    (["explain", "mm_fp8", "--num-qo-heads", "8"], ["--num-qo-heads", "mm_fp8", "m, n, k"]),
    (["explain", "rmsnorm", "--feature", "window"], ["window", "fused_add", "gemma_weight"]),
    (["explain", "rmsnorm", "--dtype", "fp9"], ["fp9", "bfloat16", "float16"]),
    (["explain", "rmsnorm", "--sm", "abc"], ["abc", "9.0"]),
    (["explain", "rmsnorm", "--sm", "9.0", "--cpu"], ["not allowed"]),
    (["explain", "rmsnorm", "--layout", "HND"], ["HND", "no layout"]),
    (["explain", "rmsnorm", "--head-dim", "128"], ["--head-dim", "hidden_size"]),
    (["explain", "rmsnorm", "--shape", "nope=3"], ["nope", "hidden_size", "num_rows"]),
    (["explain", "rmsnorm", "--shape", "num_rows"], ["fact=value"]),
    (["explain", "rmsnorm", "--hidden-size", "0"], ["positive"]),
    (["explain", "rmsnorm", "--backend", "bogus"], ["bogus", "reference", "triton", "fa3"]),
])
def test_explain_bad_arguments_exit_2(argv, words, capsys, no_flashinfer_env):
    rc, out, err = call(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 or err.startswith("usage:"), err  # one clear line
    for word in words:
        assert word in err


@pytest.mark.parametrize("text", ["9", "9.0", "90", "sm_90a"])
def test_explain_sm_spellings_mean_the_same_device(text, capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", "rmsnorm", "--sm", text, "--json")
    assert rc == 0 and json.loads(out)["problem"]["sm"] == "9.0"
    assert simulated(text).sm == (9, 0)


def test_sm_parsing_reads_majors_and_rejects_impossible_sms():
    from flashinfer.device import cuda_sm, parse_sm

    assert [parse_sm(t) for t in ("12", "120", "100", "10.3", "13.9")] == [
        (12, 0), (12, 0), (10, 0), (10, 3), (13, 9)]
    assert cuda_sm("13.0") == (13, 0)  # newer than the table: taken as given
    for text in ("0.9", "4.0", "99", "9.9", "8.8", "12.5"):
        with pytest.raises(ValueError, match="not the SM of a CUDA GPU"):
            cuda_sm(text)
    with pytest.raises(ValueError, match="SM version"):
        parse_sm("9.10")


@pytest.mark.parametrize("name, op", [
    ("mm_fp8", "bmm_fp8"), ("single_decode_with_kv_cache", "single_decode"),
    ("BatchDecodeWithPagedKVCacheWrapper", "batch_decode"),
    ("BatchDecodeWithPagedKVCacheWrapper.run", "batch_decode"),
    ("flashinfer.gemm.mm_fp8", "bmm_fp8"),
])
def test_explain_a_public_function_explains_its_op(name, op, capsys, no_flashinfer_env):
    row = cli.explain_target(name)[0]
    rc, out, _ = call(capsys, "explain", name, "--sm", "9.0", "--assume-installed", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["problem"]["op"] == op
    rc, same, _ = call(capsys, "explain", op, "--sm", "9.0", "--assume-installed", "--json",
                       *[arg for f in row.features for arg in ("--feature", f)])
    assert json.loads(same) == data  # the op with the row's features: the same Decision
    rc, text, _ = call(capsys, "explain", name, "--sm", "9.0")
    assert rc == 0 and text.startswith(f"{row.name} ({row.module}) dispatches op {op}")
    assert "chosen:" in text


def test_explain_a_public_function_adds_what_a_typical_call_uses(capsys, no_flashinfer_env):
    rc, out, _ = call(capsys, "explain", "top_k_top_p_sampling_from_probs", "--cpu", "--json")
    problem = json.loads(out)["problem"]
    assert rc == 0 and problem["op"] == "sampling_from_probs"
    assert {"top_k", "top_p"} <= set(problem["features"]) and problem["shape"]["top_k"] == 64
    rc, out, _ = call(capsys, "explain", "grouped_mm_fp8", "--sm", "9.0", "--json")
    problem = json.loads(out)["problem"]
    assert problem["layout"] == "column_major"
    assert problem["dtypes"] == {"x": "float8_e4m3fn", "weights": "float8_e4m3fn", "out": "bfloat16"}
    rc, out, _ = call(capsys, "explain", "grouped_mm_fp8", "--sm", "9.0", "--dtype", "bf16", "--json")
    assert set(json.loads(out)["problem"]["dtypes"].values()) == {"bfloat16"}  # --dtype wins


def test_explain_a_public_function_of_several_ops_explains_each(capsys, no_flashinfer_env):
    name = "trtllm_fp8_block_scale_moe"
    ops = list(cli.PUBLIC_FUNCTIONS[name].ops)
    assert len(ops) > 1
    rc, out, _ = call(capsys, "explain", name, "--sm", "9.0", "--assume-installed", "--json",
                      "--hidden-size", "7168")
    assert rc == 0
    data = json.loads(out)
    assert [d["problem"]["op"] for d in data] == ops
    assert data[1]["problem"]["shape"]["hidden_size"] == 7168  # set where the op has the fact
    assert "fp8_block_scale" in data[1]["problem"]["features"]
    rc, text, _ = call(capsys, "explain", name, "--sm", "9.0")
    assert rc == 0 and f"dispatches {len(ops)} ops: {', '.join(ops)}" in text.splitlines()[0]
    for i, op in enumerate(ops):
        assert f"--- op {i + 1} of {len(ops)}: {op} ---" in text
    assert text.count("chosen:") == len(ops)


def test_explain_list_shows_every_name(capsys):
    rc, out, _ = call(capsys, "explain", "--list", "--json")
    data = json.loads(out)
    assert rc == 0 and set(data["ops"]) == set(OPS)
    assert set(data["public"]) == set(cli.PUBLIC_FUNCTIONS)
    assert set(data["not_dispatched"]) == set(cli.NOT_DISPATCHED)
    rc, text, _ = call(capsys, "explain", "--list")
    for name, row in cli.PUBLIC_FUNCTIONS.items():
        assert re.search(rf"\n  {name} +{row.module} +-> {', '.join(row.ops)}", text), name


def test_explain_environment_override_subprocess():
    res = run_cli("explain", "rmsnorm", "--sm", "9.0", "--json", FLASHINFER_BACKEND="reference")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["backend"], data["source"]) == ("reference", "environment")
    assert "FLASHINFER_BACKEND" in data["rule"]


@pytest.mark.parametrize("command", ["show-config", "list-backends"])
def test_piping_into_head_exits_cleanly(command):
    """``flashinfer show-config | head -1``: the reader closes the pipe after one line."""
    proc = subprocess.Popen([sys.executable, "-m", "flashinfer", command], cwd=REPO,
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.strip() and err == ""


def test_bad_backend_variable_is_one_line_in_show_config():
    res = run_cli("show-config", FLASHINFER_BACKEND="nope")
    assert res.returncode == 0
    message = "environment variable FLASHINFER_BACKEND='nope' is not valid"
    assert res.stdout.count(message) == 1  # in the Environment variables section, once
    assert res.stdout.count("FLASHINFER_BACKEND is invalid: see Environment variables") == len(OPS)
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    for name in sorted(known_backend_spellings()):
        assert name in res.stderr


def test_bad_backend_variable_in_a_python_call_is_one_valueerror():
    code = ("import torch, flashinfer\n"
            "try:\n"
            "    flashinfer.rmsnorm(torch.randn(2, 8), torch.ones(8))\n"
            "except ValueError as exc:\n"
            "    print(type(exc).__name__, exc.__context__, exc, sep='|')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=clean_env(FLASHINFER_BACKEND="nope"), timeout=120)
    kind, context, message = res.stdout.strip().split("|")
    assert res.returncode == 0 and kind == "ValueError" and context == "None"
    assert "\n" not in message and "FLASHINFER_BACKEND='nope'" in message
    for name in sorted(known_backend_spellings()):
        assert name in message


def test_explain_bad_environment_override_subprocess():
    res = run_cli("explain", "rmsnorm", "--sm", "9.0", FLASHINFER_NORM_BACKEND="bogus")
    assert res.returncode == 2 and res.stdout == ""
    assert "FLASHINFER_NORM_BACKEND" in res.stderr and "'bogus'" in res.stderr
    for name in sorted(known_backend_spellings()):
        assert name in res.stderr


# --------------------------------------------------------------------------------------------
# clear-cache


def test_clear_cache_empties_the_directory(tmp_path):
    cache = tmp_path / "cache"
    (cache / "cudnn_graphs").mkdir(parents=True)
    (cache / "cudnn_graphs" / "plan.bin").write_bytes(b"x")
    (cache / "tuned.json").write_text("{}")
    res = run_cli("clear-cache", FLASHINFER_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stderr
    assert cache.is_dir() and not any(cache.iterdir())
    assert "cudnn_graphs" in res.stdout and "tuned.json" in res.stdout
    res = run_cli("clear-cache", FLASHINFER_CACHE_DIR=str(cache))
    assert res.returncode == 0 and "nothing to remove" in res.stdout


def test_clear_cache_refuses_home(tmp_path, capsys, monkeypatch):
    (tmp_path / "keep.txt").write_text("precious")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path))
    rc, _, err = call(capsys, "clear-cache")
    assert rc == 2 and "refusing" in err
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_clear_cache_missing_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path / "absent"))
    rc, out, _ = call(capsys, "clear-cache")
    assert rc == 0 and "nothing to remove" in out


# --------------------------------------------------------------------------------------------
# representative problems


@pytest.mark.parametrize("op", sorted(OPS))
def test_representative_problem_covers_the_catalog(op):
    spec = OPS[op]
    problem = representative(op, simulated("9.0"))
    assert set(dict(problem.dtypes)) == set(spec.dtype_roles)
    assert set(dict(problem.shape)) == set(default_shape(op)) <= set(spec.shape_facts)
    assert problem.features <= set(spec.features)
    assert problem.layout == (spec.layouts[0] if spec.layouts else None)


def test_representative_problem_rejects_unknown_names():
    with pytest.raises(ValueError, match="hidden_size"):
        representative("rmsnorm", simulated("9.0"), shape={"head_dim": 64})
    with pytest.raises(ValueError, match="fused_add"):
        representative("rmsnorm", simulated("9.0"), features=["causal"])
    with pytest.raises(ValueError, match="NHD"):
        representative("single_decode", simulated("9.0"), layout="XYZ")


# --------------------------------------------------------------------------------------------
# the README stays true to the code


def _section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_setup_is_exactly_the_two_commands():
    setup = _section((REPO / "README.md").read_text(), "Set-up")
    blocks = [b.split("\n", 1)[1].strip() for b in setup.split("```")[1::2]]
    assert blocks == ['pip install -e . && python examples/quickstart.py',
                      'pip install -e ".[test]" && python -m pytest -q -n auto']


def test_ci_runs_the_readme_test_command():
    setup = _section((REPO / "README.md").read_text(), "Set-up")
    command = [b.split("\n", 1)[1].strip() for b in setup.split("```")[1::2]][1]
    ci = (REPO / ".ci" / "run").read_text()
    assert command.replace("python ", "python3 ").replace("pip install", "python3 -m pip install -q") in ci


def test_readme_says_how_to_get_the_cpu_build_of_torch():
    setup = _section((REPO / "README.md").read_text(), "Set-up")
    assert "`pip install torch --index-url https://download.pytorch.org/whl/cpu`" in setup


def test_readme_names_the_wired_and_the_planned_backends_as_the_records_do():
    intro = (REPO / "README.md").read_text().split("\n## ", 1)[0]
    wired_text, planned_text = intro.split("Wired today:", 1)[1].split("Declared but not wired", 1)
    records = database().records
    assert {n for n in re.findall(r"`(\w+)`", wired_text) if n in BACKEND_NAMES} == {
        r.backend for r in records if not r.planned}
    assert set(re.findall(r"`(\w+)`:\s+`(\w+)`", planned_text)) == {
        (r.backend, r.op) for r in records if r.planned}


def test_readme_paths_exist():
    """The files and folders of the package, the examples and the tests the README names (the
    tuned rules among them), and the layout section's packages."""
    readme = (REPO / "README.md").read_text()
    for path in re.findall(r"(?<![/\w])((?:examples|flashinfer|tests)/[\w/.*-]*[\w*])", readme):
        assert list(REPO.glob(path)), path
    layout = _section(readme, "Repository layout")
    for name in re.findall(r"\b(\w+)/", layout.split("backends/", 1)[1].split("backend_names", 1)[0]):
        assert (REPO / "flashinfer" / "backends" / name / "__init__.py").exists(), name
    for package in ("attention", "gemm", "sampling", "quantization", "fused_moe"):
        assert f"{package}/" in layout and (REPO / "flashinfer" / package / "__init__.py").exists()
    for example in (REPO / "examples").iterdir():
        assert example.name in layout, example.name


def test_readme_alias_table_matches_overrides():
    from flashinfer.backend_names import ALIASES

    readme = (REPO / "README.md").read_text()
    rows = {}
    for line in _section(readme, "Choosing and forcing backends").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")] if line.startswith("| `") else []
        for spelling in re.findall(r"`([^`]+)`", cells[0]) if cells else ():
            rows[spelling] = set(re.findall(r"`([^`]+)`", cells[1].split("(")[0]))
    assert rows.pop("auto") == set()
    assert rows == {name: set(targets) for name, targets in ALIASES.items()}


def test_quickstart_runs():
    res = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart.py")], cwd=REPO,
                         env=clean_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for name in ("single_decode_with_kv_cache", "rmsnorm"):
        assert f"== {name}: ran on backend" in res.stdout
    errors = [float(e) for e in re.findall(r"max \|auto - reference\| = (\S+)", res.stdout)]
    assert len(errors) == 2 and all(e < 5e-2 for e in errors)  # fp16 outputs of size ~10


def test_warmup_without_a_gpu_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the warm-up would compile")
    assert cli.main(["warmup", "--vocab", "1000"]) == 0
    assert "no CUDA device" in capsys.readouterr().out


def test_warm_sampling_calls_every_function_in_both_threshold_forms():
    from flashinfer.warmup import sampling_calls, warm_sampling

    results = warm_sampling([300], "cpu")
    names = [r["function"] for r in results]
    assert names == [name for name, _ in sampling_calls()]
    assert any("[per_row]" in n for n in names) and "softmax" in names
    assert all(r["kernel"] == "reference" and r["seconds"] >= 0 for r in results)


def test_warmup_only_picks_functions_and_rejects_unknown_names(capsys):
    from flashinfer.warmup import warm_sampling

    results = warm_sampling([300], "cpu", only="top_k_top_p, softmax")
    assert [r["function"] for r in results] == [
        "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_probs[per_row]",
        "top_k_top_p_sampling_from_logits", "softmax", "softmax[many_rows]",
        "top_k_top_p_sampling_from_logits[bf16]", "softmax[bf16]"]
    assert cli.main(["warmup", "--only", "no_such_function"]) == 2
    err = capsys.readouterr().err
    assert "matches no warm-up call" in err and "top_k_mask_logits" in err and "bmm_fp8" in err


def test_warm_gemm_runs_each_gemm_call_once_and_only_selects_them():
    from flashinfer.warmup import gemm_calls, warm_gemm, warm_sampling

    results = warm_gemm("cpu")
    assert [r["function"] for r in results] == [name for name, _ in gemm_calls()]
    assert all(r["kernel"] == "reference" for r in results)
    assert warm_sampling([300], "cpu", only="bmm_fp8") == []
    assert [r["function"] for r in warm_gemm("cpu", only="bmm_fp8[m64]")] == ["bmm_fp8[m64]"]


def test_mla_warm_up_covers_the_deepseek_grid_and_selects_by_name():
    """Every (heads, page, cache dtype) at every warm batch; a selected call runs (on the CPU:
    the reference) and names its kernel; ``--only mla`` picks no sampling or GEMM call."""
    from flashinfer.warmup import (MLA_BATCHES, MLA_HEADS, MLA_KV_DTYPES, MLA_PAGES, mla_calls,
                                   warm_gemm, warm_mla)

    names = [name for name, _ in mla_calls()]
    assert len(set(names)) == len(MLA_HEADS) * len(MLA_PAGES) * len(MLA_KV_DTYPES) * len(MLA_BATCHES)
    one = "mla[h16:page64:float8_e4m3fn:b4:kv200]"
    results = warm_mla("cpu", only=one)
    assert [(r["function"], r["kernel"]) for r in results] == [(one, "reference")]
    assert warm_gemm("cpu", only="mla[") == []


def test_merge_warm_up_covers_each_merge_and_the_block_table_kernel(monkeypatch):
    """One call per merge function, heads, head dim and dtype, plus the block-table kernel; the
    calls run (on the CPU: the merges' reference; the block table in the Triton interpreter)
    and build the right table."""
    from flashinfer.warmup import (MERGE_DIMS, MERGE_DTYPES, MERGE_HEADS, _block_table_call,
                                   merge_calls, warm_merge)

    names = [name for name, _ in merge_calls()]
    assert len(set(names)) == 4 * len(MERGE_HEADS) * len(MERGE_DIMS) * len(MERGE_DTYPES) + 1 + 3
    results = warm_merge("cpu", only="merge[merge_state_in_place+mask:h8:d64:float16]")
    assert [r["kernel"] for r in results] == ["reference"]
    assert {r["kernel"] for r in warm_merge("cpu", only="merge[merge_states:h32")} == {"reference"}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    table = _block_table_call("cpu", "auto")
    assert table.shape == (64, 64) and sorted(table.reshape(-1).tolist()) == list(range(4096))


def test_gemm_warm_up_reaches_each_triton_tile_height_on_sm90():
    """On SM 9.0 every bmm_fp8 warm-up call goes to the Triton kernel (the batched rule), each
    with another tile height, so each compiles a kernel a serving call would need."""
    from flashinfer.backends.triton.gemm import block_m_for
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem, length_bucket, select

    heights = set()
    for m in (16, 64, 512):
        problem = Problem.make("bmm_fp8", simulated("9.0"),
                               dtypes={"a": "float8_e4m3fn", "b": "float8_e4m3fn",
                                       "out": "bfloat16"},
                               shape={"batch": 2, "m": length_bucket(m), "n": 512, "k": 128})
        assert select(problem, assume_installed=True).backend == "triton"
        heights.add(block_m_for(m))
    assert heights == {16, 64, 128}


def test_warm_moe_runs_the_layer_at_each_token_count():
    from flashinfer.warmup import moe_calls, warm_moe

    results = warm_moe("cpu", 4, 2, 128, 128, "fp8_block")
    assert [r["function"] for r in results] == [name for name, _ in moe_calls(4, 2, 128, 128)]
    assert all(r["kernel"] and r["seconds"] >= 0 for r in results)
    with pytest.raises(ValueError, match="quant"):
        moe_calls(4, 2, 128, 128, "int4")


@pytest.mark.parametrize("w8a8", [True, False])
@pytest.mark.parametrize("experts, top_k", [(256, 8), (64, 6), (8, 2)])
def test_moe_warm_up_reaches_every_tile_bucket(w8a8, experts, top_k):
    """The Triton MoE picks its tiles from the pairs per expert; the warm-up's token counts
    must land in every bucket a serving call can (checked against launch_config itself)."""
    from flashinfer.backends.triton.moe import launch_config
    from flashinfer.warmup import moe_calls

    counts = [int(name.rsplit(",T", 1)[1].rstrip("]"))
              for name, _ in moe_calls(experts, top_k, 7168, 2048)]
    warmed = {launch_config(t * top_k, experts, True, w8a8) for t in counts}
    every = {launch_config(t * top_k, experts, True, w8a8) for t in range(1, 300 * experts // top_k)}
    assert warmed == every


def test_warmup_moe_argument_is_checked(capsys):
    for value, message in (("256,8,7168", "four positive integers"),
                           ("4,8,16,16", "more than the 4 experts")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["warmup", "--moe", value])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
