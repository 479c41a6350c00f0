"""The evidence behind the routing data, checked on the CPU (issue 22, deliverable 7).

* every results file a capability record or a dispatch rule cites (a ``benchmarks/results/``
  path, or a bare result name carrying a date, in a value or a comment) exists;
* every backend a rule row names has a wired record serving that op in that SM family;
* every ``verified = true`` record names the GPU test log (``verified_by``) in which its GPU test
  files (``tested_by``) ran with no failure, on the GPU of ``verified_on``, not skipped for a
  missing package. The reference is exempt: it is the oracle the GPU tests compare against, and
  the CPU suite checks it against float64 math;
* a basis is one line of at most 200 characters naming an existing results file, or saying
  "not measured";
* on the CPU, ``auto`` takes the reference unless the rule's ``cpu_basis`` says why another kernel
  goes first (torch's bf16 / fp16 CPU matmuls can be 100x slower than the reference's float32).
"""

import fnmatch
import re
from pathlib import Path

import pytest

from flashinfer.capability_db import DB_DIR, database
from flashinfer.device import SM_FAMILIES, simulated, sm_family
from flashinfer.dispatch import NoBackendError, Problem, select
from flashinfer.dispatch_rules import RULES_DIR, default_rules
from flashinfer.op_catalog import OPS

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DATA_FILES = sorted(DB_DIR.glob("*.toml")) + sorted(RULES_DIR.glob("*.toml"))
BASIS_MAX = 200
#: the GPU a log's file name names -> its SM (extend when logs from another GPU arrive)
GPU_SM = {"h200": (9, 0)}

_RESULT_PATH = re.compile(r"benchmarks/results/([\w.+-]+)")
_RESULT_NAME = re.compile(r"(?<![\w/.+-])([\w.+-]*\d{4}-\d{2}-\d{2}[\w.+-]*\.(?:json|txt|log|png|csv))")
_SCRIPT_PATH = re.compile(r"benchmarks/(?!results/)[\w/.-]+\.(?:py|sh)")
_SUMMARY = re.compile(r"^(?:=+ )?(?:result: )?\d+ (?:passed|failed|skipped|deselected|errors?)\b.* in "
                      r"[\d.]+s", re.M)
_FAILURE = re.compile(r"\b[1-9]\d* (?:failed|errors?)\b|^(?:FAILED|ERROR)\b", re.M)


def cited_results(text: str) -> set[str]:
    """File names under benchmarks/results/ that ``text`` cites."""
    names = {m.rstrip(".") for m in _RESULT_PATH.findall(text)}
    return names | {m.rstrip(".") for m in _RESULT_NAME.findall(text)}


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_cited_file_exists(path):
    text = path.read_text()
    missing = sorted(n for n in cited_results(text) if not (RESULTS / n).is_file())
    assert not missing, f"{path.name} cites results that do not exist: {missing}"
    scripts = sorted(s.rstrip(".") for s in _SCRIPT_PATH.findall(text))
    assert all((ROOT / s).is_file() for s in scripts), f"{path.name} cites missing scripts: {scripts}"


def test_the_citation_pattern_finds_paths_and_bare_names():
    text = ('basis = "benchmarks/results/a_h200_2026-11-30.json: x"  # see b_2026-11-30_1205utc.txt.'
            '\ndtypes.logits = ["float32"]')
    assert cited_results(text) == {"a_h200_2026-11-30.json", "b_2026-11-30_1205utc.txt"}


# --------------------------------------------------------------------------------------------
# rule rows name kernels that serve there


def _family_sms() -> dict[str, list[tuple[int, int]]]:
    out: dict[str, list[tuple[int, int]]] = {}
    for major in range(7, 14):
        for minor in range(10):
            out.setdefault(sm_family((major, minor)), []).append((major, minor))
    return out


FAMILY_SMS = _family_sms()


def serves(rec, family: str) -> bool:
    """A wired record runs somewhere in ``family`` (the CPU counts TRITON_INTERPRET kernels:
    rules list them after the reference as an opt-in debugging aid)."""
    if rec.planned:
        return False
    if family == "cpu":
        return "cpu" in rec.devices or rec.cpu_under_triton_interpret
    return "cuda" in rec.devices and any(rec.sm_min <= sm <= rec.sm_max for sm in FAMILY_SMS[family])


def records_named(op: str, entry: str):
    backend, _, variant = entry.partition(":")
    return [r for r in database().for_backend_op(backend, op) if not variant or r.variant == variant]


def rule_rows(rules):
    """(where, families, order, need) for every priority row and threshold; ``need`` is how many
    of the families an entry must serve: all for a named family, any for the default row."""
    listed = {family for family, _ in rules.priority}
    for family, order in rules.priority:
        if family == "default":
            yield "priority.default", [f for f in SM_FAMILIES if f not in listed], order, any
        else:
            yield f"priority.{family}", [family], order, all
    for rule in rules.thresholds:
        yield f"threshold {rule.name}", list(rule.families), rule.order, all


@pytest.mark.parametrize("op", sorted(default_rules()))
def test_every_rule_row_names_a_record_that_serves_there(op):
    """No planned record is named either: a rule ranks kernels that run (none is allowed now)."""
    problems = []
    for where, families, order, need in rule_rows(default_rules()[op]):
        if not families:
            problems.append(f"{where}: every SM family has its own row, so it is never read")
        for entry in order:
            recs = records_named(op, entry)
            if not recs:
                problems.append(f"{where}: {entry} has no {op} record")
            elif all(r.planned for r in recs):
                problems.append(f"{where}: {entry} is planned (no kernel wired)")
            elif families and not need(any(serves(r, f) for r in recs) for f in families):
                problems.append(f"{where}: no {entry} record for {op} runs in {families}")
    assert not problems, f"dispatch_rules/{op}.toml:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------------------------
# verified = true is backed by a clean GPU test log


def gpu_records():
    """Wired records other than the reference that run on CUDA."""
    return [r for r in database().records
            if r.backend != "reference" and not r.planned and "cuda" in r.devices]


def _rid(rec) -> str:
    return f"{rec.backend}:{rec.variant}:{rec.op}"


def log_problems(text: str) -> list[str]:
    """Why a GPU test log is not evidence: no pytest summary, no test passed, or any failure."""
    summaries = _SUMMARY.findall(text)
    problems = []
    if not summaries:
        problems.append("no pytest summary line")
    elif not any(int(n) for line in summaries for n in re.findall(r"(\d+) passed", line)):
        problems.append("no test passed")
    problems += [f"shows a failure: {m.group(0)!r}" for m in _FAILURE.finditer(text)][:3]
    return problems


def log_runs(text: str, test_file: str) -> bool:
    """The log names ``test_file`` (its base name: the file may have moved since), or one of its
    pytest command lines runs a directory or glob that holds it. Logs older than the family
    folders name the flat paths (``tests/test_x.py``, ``tests/test_[d-z]*.py``): a glob also
    counts when it matches the file's old flat path."""
    name = Path(test_file).name
    if re.search(r"(?<!\w)" + re.escape(name), text):
        return True
    for line in text.splitlines():
        if "pytest" not in line:
            continue
        for token in line.split("pytest", 1)[1].split():
            if token.startswith("("):
                break
            token = token.rstrip(";,")
            if token in ("tests", "tests/") or (token.startswith("tests/") and any(
                    fnmatch.fnmatch(path, token) or path.startswith(token.rstrip("/") + "/")
                    for path in (test_file, "tests/" + name))):
                return True
    return False


def import_failed(text: str, module: str) -> bool:
    """The log skipped tests because ``module`` did not import."""
    m = re.escape(module)
    return bool(re.search(rf"No module named '{m}'|(?<![\w.]){m}(?:: import failed| does not "
                          rf"import)", text))


def test_the_log_checks_on_examples():
    good = "# python -m pytest -m gpu tests/test_[a-c]*.py (H200)\n12 passed, 3 skipped in 4.1s\n"
    assert log_problems(good) == [] and log_runs(good, "tests/attention/test_cudnn.py")
    assert not log_runs(good, "tests/norm/test_norm.py")
    assert log_runs("command: python3 -m pytest -m gpu -q tests   (inside x)",
                    "tests/norm/test_norm.py")
    assert log_runs("python3 -m pytest -m gpu tests/test_norm.py", "tests/norm/test_norm.py")
    family = "python3 -m pytest -m gpu tests/attention tests/gemm/test_gemm_*.py"
    assert log_runs(family, "tests/attention/test_cudnn.py")
    assert log_runs(family, "tests/gemm/test_gemm_gpu.py")
    assert not log_runs(family, "tests/norm/test_norm.py")
    assert not log_runs(family, "tests/attention_more/test_x.py")
    assert log_problems("1 failed, 12 passed in 4.1s")
    assert log_problems("FAILED tests/test_x.py::t - boom\n12 passed in 4.1s")
    assert log_problems("12 deselected in 1.0s") == ["no test passed"]
    assert import_failed("flash_attn: import failed: ModuleNotFoundError", "flash_attn")
    assert not import_failed("flash_attn_interface does not import", "flash_attn")


@pytest.mark.parametrize("rec", [r for r in gpu_records() if r.verified], ids=_rid)
def test_verified_record_cites_a_clean_log_that_ran_its_tests(rec):
    assert rec.verified_by and rec.tested_by, (
        "verified = true needs verified_by (the GPU test log) and tested_by (its test files)")
    log = ROOT / rec.verified_by
    assert log.is_file() and log.name.startswith("gpu_tests_"), f"{rec.verified_by}: no GPU test log"
    text = log.read_text()
    assert not log_problems(text), f"{log.name}: {log_problems(text)}"
    not_run = [t for t in rec.tested_by if not log_runs(text, t)]
    assert not not_run, f"{log.name} does not show {not_run} running"
    missing = [m for m in rec.requires if import_failed(text, m)]
    if rec.requires_any and all(import_failed(text, m) for m in rec.requires_any):
        missing.append(" / ".join(rec.requires_any))
    assert not missing, f"{log.name}: its tests were skipped, {missing} did not import"
    gpus = [sm for tag, sm in GPU_SM.items() if f"_{tag}_" in log.name]
    assert gpus, f"{log.name}: name the GPU in the file name (known: {sorted(GPU_SM)})"
    assert rec.verified_on is not None and gpus[0] in rec.verified_on, (
        f"{log.name} ran on SM {gpus[0]}, verified_on is {rec.verified_on}")


@pytest.mark.parametrize("rec", gpu_records(), ids=_rid)
def test_every_gpu_record_names_the_gpu_tests_that_verify_it(rec):
    """So a GPU run of tested_by is what turns verified = false into true."""
    assert rec.tested_by, "tested_by: the GPU test files that compare this kernel with the reference"
    for test_file in rec.tested_by:
        path = ROOT / test_file
        assert path.is_file() and "mark.gpu" in path.read_text(), f"{test_file}: no GPU tests"


def test_the_reference_is_the_oracle():
    """Exempt from verified_by: it is what every GPU test compares with."""
    for rec in database().records:
        if rec.backend == "reference":
            assert rec.verified and rec.verified_on is None and "cpu" in rec.devices, rec


# --------------------------------------------------------------------------------------------
# bases: one line, a file or "not measured"


def bases():
    for op, rules in sorted(default_rules().items()):
        yield op, "priority_basis", rules.priority_basis
        if rules.cpu_basis:
            yield op, "cpu_basis", rules.cpu_basis
        for rule in rules.thresholds:
            yield op, f"threshold {rule.name}", rule.basis


@pytest.mark.parametrize("op, where, basis", list(bases()), ids=lambda v: v if len(v) < 60 else "")
def test_basis_is_one_line_naming_a_file_or_not_measured(op, where, basis):
    assert "\n" not in basis and len(basis) <= BASIS_MAX, (
        f"{op}.toml {where}: {len(basis)} characters; keep the story in a comment")
    files = {m.rstrip(".") for m in _RESULT_PATH.findall(basis)}
    assert files or "not measured" in basis, f"{op}.toml {where}: cite a results file or say not measured"
    assert all((RESULTS / f).is_file() for f in files), f"{op}.toml {where}: {files}"
    if where == "priority_basis":  # its rows cover the families the H200 (SM 9.0) is not in
        assert "not measured" in basis, f"{op}.toml: say which families are not measured"


# --------------------------------------------------------------------------------------------
# the CPU: the reference unless the rule says why not


@pytest.mark.parametrize("op", sorted(default_rules()))
def test_cpu_order_starts_with_the_reference_unless_justified(op):
    rules = default_rules()[op]
    order = rules.family_order("cpu")
    ref = order.index("reference") if "reference" in order else len(order)
    ahead = []
    for rec in database().for_op(op):
        if rec.backend == "reference" or rec.planned or "cpu" not in rec.devices:
            continue
        names = (rec.backend, f"{rec.backend}:{rec.variant}")
        pos = next((i for i, entry in enumerate(order) if entry in names), None)
        if pos is None or pos < ref:  # unlisted kernels go just before the reference
            ahead.append(names[1])
    assert not ahead or rules.cpu_basis, (
        f"{op}.toml: {ahead} run before the reference on the CPU: list them after it, or say why "
        f"in cpu_basis")
    assert all("cpu" not in rule.families for rule in rules.thresholds)


def _cpu_problem(op: str, dtype: str) -> Problem:
    """A CPU call with every dtype role in ``dtype`` where a record takes it."""
    spec = OPS[op]
    allowed = {role: set(names) for rec in database().for_op(op) for role, names in rec.dtypes}
    dtypes = {role: dtype for role in spec.dtype_roles if dtype in allowed.get(role, {dtype})}
    return Problem.make(op, simulated(None), dtypes=dtypes)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("op", sorted(default_rules()))
def test_cpu_auto_picks_the_reference_or_a_justified_kernel(op, dtype):
    try:
        decision = select(_cpu_problem(op, dtype), assume_installed=True)
    except NoBackendError:
        pytest.skip(f"no {op} kernel takes {dtype}")
    rules = default_rules()[op]
    assert decision.backend == "reference" or (rules.cpu_basis and decision.basis == rules.cpu_basis), (
        f"auto picks {decision.name} for {op} on the CPU without a cpu_basis")


@pytest.mark.parametrize("op", ["mm_bf16", "segment_gemm", "fused_moe"])
def test_cpu_bf16_matmuls_go_to_the_reference(op):
    """torch.mm in bf16 without bf16 instructions (oneDNN held to AVX2): 52 s at 2048^3 against
    the float32 reference's 0.3 s on the CI machine (issue 22 saw 15 s against 0.15 s)."""
    assert select(_cpu_problem(op, "bfloat16"), assume_installed=True).backend == "reference"
