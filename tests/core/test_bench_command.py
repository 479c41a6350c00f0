"""``flashinfer bench`` and the benchmark runners it runs (benchmarks/<family>.py), on the CPU:
the family list, every runner at its tiny shapes through the reference backend (the JSON-lines
output: header, one line per case, end line), the side-by-side summary of two outputs, and
the generated results README."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from flashinfer import bench_command, cli

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("activation", "attention", "gemm", "mla", "moe", "norm", "rope", "sampling")


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch):
    """Loading a runner puts benchmarks/ on ``sys.path`` and its modules (``harness``,
    ``timing``, the runner) into ``sys.modules``: both undone after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name, module in list(sys.modules.items()):
        if name not in before and str(getattr(module, "__file__", None) or "").startswith(
                str(ROOT / "benchmarks")):
            del sys.modules[name]


def bench(*argv: str) -> int:
    """``flashinfer bench ARGV`` through the CLI."""
    return cli.main(["bench", *argv])


def read_output(path: Path) -> tuple[dict, list[dict], dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return lines[0]["header"], lines[1:-1], lines[-1]["end"]


def test_list_names_every_family(capsys):
    assert bench("--list") == 0
    out = capsys.readouterr().out
    assert all(f"\n{name} " in "\n" + out for name in FAMILIES)


def test_unknown_family_gets_a_suggestion(capsys):
    assert bench("samplng") == 2
    assert "did you mean 'sampling'" in capsys.readouterr().err


def test_no_checkout_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_command, "BENCHMARKS", tmp_path)
    assert bench("gemm") == 2
    err = capsys.readouterr().err
    assert "no benchmark runners at" in err and "pip install -e ." in err


def test_runner_options_reach_the_runner(capsys):
    assert bench("norm", "--list", "--shapes", "quick") == 0
    out = capsys.readouterr().out
    assert "rmsnorm 4096x4096: auto, reference" in out and "2 cases (quick)" in out


@pytest.mark.parametrize("family", FAMILIES)
def test_runner_tiny_shapes_on_the_cpu(family, tmp_path, capsys):
    out = tmp_path / f"{family}.jsonl"
    assert bench(family, "--shapes", "tiny", "--iters", "1", "--no-plot", "--out", str(out)) == 0
    head, records, end = read_output(out)
    assert head["command"].startswith(f"flashinfer bench {family} --shapes tiny")
    assert head["family"] == family and head["device"].startswith("cpu") and head["date"]
    assert head["shows"] and head["versions"]["torch"] and head["versions"]["flashinfer"]
    assert "triton" in head["versions"] and head["impl"] == "ours"
    assert records and end["cases"] == len(records) and end["timed"] > 0
    for record in records:
        assert record["case"] and "reference" in record["backends"]
        assert any("ms" in e for e in record["backends"].values()), record
    assert str(out) in capsys.readouterr().out


def test_plot_or_a_message_without_matplotlib(tmp_path, capsys):
    out = tmp_path / "act.jsonl"
    assert bench("activation", "--iters", "1", "--only", "silu", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    assert out.with_suffix(".png").exists() if has_mpl else "matplotlib is not installed" in printed


def test_side_by_side_summary_of_two_outputs(tmp_path, capsys):
    """``--plot`` merges ours and an ``--impl upstream`` output (here both made by this package:
    the upstream run calls the same functions without ``backend=``)."""
    ours, up = tmp_path / "moe_a.jsonl", tmp_path / "moe_upstream_a.jsonl"
    common = ("--iters", "1", "--no-plot", "--tokens", "3", "--plain-routing")
    assert bench("moe", *common, "--out", str(ours)) == 0
    assert bench("moe", "--impl", "upstream", *common, "--out", str(up)) == 0
    assert read_output(up)[0]["impl"] == "upstream"
    capsys.readouterr()
    assert bench("moe", "--plot", str(ours), str(up), "--png", str(tmp_path / "both.png")) == 0
    table = capsys.readouterr().out
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == ["3"])
    assert len(row) == 5 and row[-1] != "-"  # tokens, auto, reference, upstream, upstream/auto


def test_declared_kernels_come_from_the_capability_database():
    """What a GPU run times beside ``auto`` (on the CPU the runners time auto and the reference)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness  # noqa: PLC0415 - the runners' helper module, by script name

    kernels = harness.declared_kernels("rmsnorm")
    assert "reference:default" in kernels and "triton:default" in kernels
    assert "flash_attn:fa3" in harness.declared_kernels("single_decode")


def _results_readme():
    spec = importlib.util.spec_from_file_location("results_readme", ROOT / "benchmarks" / "results_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_results_readme_is_generated():
    module = _results_readme()
    committed = (module.RESULTS / "README.md").read_text()
    assert committed == module.render(), "run: python benchmarks/results_readme.py"


def test_latest_full_runs_are_kept():
    module = _results_readme()
    missing = [n for runs in module.LATEST_FULL_RUNS.values() for n in runs
               if not (module.RESULTS / n).is_file()]
    assert not missing


def test_headers_of_each_format(tmp_path):
    module = _results_readme()
    (tmp_path / "a.jsonl").write_text(json.dumps({"header": {"command": "c", "date": "d"}}) + "\n{}\n")
    (tmp_path / "b.json").write_text(json.dumps({"command": "c", "device": "v", "header": {"shows": "s"}}))
    (tmp_path / "c.txt").write_text("# command: c\n# shows: s\nbody\n# date: not a header line\n")
    (tmp_path / "d.log").write_text("no header here\n")
    assert module.read_header(tmp_path / "a.jsonl") == {"command": "c", "date": "d"}
    assert module.read_header(tmp_path / "b.json") == {"command": "c", "device": "v", "shows": "s"}
    assert module.read_header(tmp_path / "c.txt") == {"command": "c", "shows": "s"}
    assert module.read_header(tmp_path / "d.log") == {}
    assert "| `d.log` | no header |" in module.render(tmp_path)


def test_overhead_report_reads_the_committed_run():
    """benchmarks/overhead.py --report: the side-by-side table and the issue's targets, from a
    results file (the measuring modes need CUDA)."""
    import subprocess

    results = sorted((ROOT / "benchmarks" / "results").glob("overhead_*.jsonl"))
    assert results, "no overhead run in benchmarks/results"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--report",
                           str(results[-1])], capture_output=True, text=True, timeout=120)
    assert "decode_run_kv512" in done.stdout and " direct (+" in done.stdout
    assert done.returncode == (1 if "MISS" in done.stdout else 0)
