"""Capability database: what each backend can run, as data.

One TOML file per backend (``<backend>.toml`` beside this file). Each ``[[op]]`` table is one
record: a (backend, op, variant) triple and the conditions under which it runs. The loader turns
them into frozen :class:`Record` objects and validates every key against
:mod:`flashinfer.op_catalog`; a mistake raises :class:`CapabilityDBError` naming the file and key.

Record keys (all but ``name`` and ``verified`` optional)::

    name = "single_prefill"          # op, from op_catalog.OPS
    variant = "flash_varlen"         # default "default"; one backend may have several kernels
    kernel = "torch.attention:flash_varlen"   # the function that runs it: a module of
                                     # flashinfer.backends, then the function (imported lazily)
    check = "torch.attention:flash_reasons"   # optional: the adapter's reasons for what a table
                                     # cannot say (strides, alignment); same form
    planned = true                   # instead of kernel: declared so explain shows it, not wired
    devices = ["cuda"]               # "cuda" and/or "cpu"
    sm_min = "8.0"  sm_max = "12.1"  # inclusive SM range, required when devices has "cuda"
    dtypes.q = ["float16", "bfloat16"]          # per dtype role; a role not listed takes any
    shape.head_dim_qk = { max = 256, multiple_of = 8 }   # or { values = [64, 128, 256] }, min
    features = ["causal", "gqa"]     # the optional behaviours this kernel serves
    layouts = ["NHD"]                # default: every layout the op has
    requires = ["cudnn"]             # modules that must all import
    requires_any = ["flash_attn_interface", "fa3_fwd_interface"]   # at least one must import
    cpu_under_triton_interpret = true  # also runs on CPU when TRITON_INTERPRET=1
    verified = false                 # true only once run on real hardware against the reference
    verified_on = ["9.0"]            # the SMs it ran on; elsewhere in its range it counts as
                                     # unverified (omit: verified everywhere, e.g. the reference)
    tested_by = ["tests/gemm/test_gemm_gpu.py"]   # the GPU test files that compare it with
                                     # the reference: a clean GPU run of them verifies it
    verified_by = "benchmarks/results/gpu_tests_gemm_h200_2026-11-30_2123utc.txt"
                                     # with verified = true: the GPU test log in which tested_by
                                     # ran with no failure (the one place to update after a re-run)
    deterministic = true
    emulation = true                 # a slow stand-in for a missing native kernel (e.g. FP4
                                     # dequantised to bf16): strict mode refuses it on CUDA
    note = "free text shown by explain"

Evidence: every ``verified = true`` record of a backend other than the reference (the oracle,
checked against float64 math by the CPU suite) names ``tested_by`` and ``verified_by``;
``tests/core/test_evidence.py`` checks that the log exists, shows no failure, ran those files on
the GPU of ``verified_on``, and did not skip them for a missing package. The loader checks the
form.

:meth:`Record.check` turns a :class:`~flashinfer.dispatch.Problem` into a list of reasons (empty =
can run). It never raises and collects every reason, not only the first.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from ..backend_names import BACKEND_NAMES
from ..device import parse_sm
from ..op_catalog import OPS
from ..optional_packages import import_error
from ..reasons import Reason

DB_DIR = Path(__file__).resolve().parent

DTYPE_NAMES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "uint8",
    "int8", "int32", "int64", "bool",
)

_RECORD_KEYS = {
    "name", "variant", "devices", "sm_min", "sm_max", "dtypes", "shape", "features", "layouts",
    "requires", "requires_any", "cpu_under_triton_interpret", "verified", "verified_on",
    "deterministic", "emulation", "note", "kernel", "check", "planned", "verified_by", "tested_by",
}
_SHAPE_KEYS = {"values", "min", "max", "multiple_of"}
_REF = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_LOG = re.compile(r"benchmarks/results/[A-Za-z0-9_.+-]+")
_TEST_FILE = re.compile(r"tests/[a-z]+/test_[A-Za-z0-9_]+\.py")


class CapabilityDBError(ValueError):
    """A capability data file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class ShapeLimit:
    values: tuple[int, ...] | None = None
    min: int | None = None
    max: int | None = None
    multiple_of: int | None = None

    def describe(self) -> str:
        parts = []
        if self.values is not None:
            parts.append("{" + ",".join(map(str, self.values)) + "}")
        if self.min is not None:
            parts.append(f">={self.min}")
        if self.max is not None:
            parts.append(f"<={self.max}")
        if self.multiple_of is not None:
            parts.append(f"multiple of {self.multiple_of}")
        return ", ".join(parts)

    def admits(self, value: int) -> bool:
        return ((self.values is None or value in self.values)
                and (self.min is None or value >= self.min)
                and (self.max is None or value <= self.max)
                and (self.multiple_of is None or value % self.multiple_of == 0))


@dataclass(frozen=True)
class Record:
    backend: str
    op: str
    variant: str
    devices: tuple[str, ...]
    sm_min: tuple[int, int] | None
    sm_max: tuple[int, int] | None
    dtypes: tuple[tuple[str, tuple[str, ...]], ...]
    shape: tuple[tuple[str, ShapeLimit], ...]
    features: frozenset[str]
    layouts: tuple[str, ...]
    requires: tuple[str, ...]
    requires_any: tuple[str, ...]
    cpu_under_triton_interpret: bool
    verified: bool
    verified_on: tuple[tuple[int, int], ...] | None
    deterministic: bool
    note: str
    emulation: bool = False
    kernel: str | None = None  # "module:function" under flashinfer.backends; None when planned
    check_ref: str | None = None  # the adapter's extra check, same form
    verified_by: str | None = None  # the GPU test log behind verified = true
    tested_by: tuple[str, ...] = ()  # the GPU test files that compare it with the reference
    source: str = field(compare=False, default="")

    @property
    def planned(self) -> bool:
        """Declared (explain and show-config show it), but no kernel is wired yet."""
        return self.kernel is None

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.variant}"

    def verified_for(self, sm: tuple[int, int] | None) -> bool:
        """Has this kernel been run against the reference on this SM (or anywhere, for CPU)?"""
        if not self.verified:
            return False
        return self.verified_on is None or sm is None or sm in self.verified_on

    def check(self, problem, *, assume_installed: bool = False, triton_interpret: bool = False
              ) -> list[Reason]:
        """Every reason this record cannot serve ``problem`` (empty list = it can)."""
        reasons: list[Reason] = []
        if self.planned:
            reasons.append(Reason("planned", "declared only", "a wired kernel",
                                  "planned: declared so explain shows it; no kernel is wired yet"))
        devices = self.devices
        if triton_interpret and self.cpu_under_triton_interpret and "cpu" not in devices:
            devices = devices + ("cpu",)
        if problem.device not in devices:
            reasons.append(Reason("device", problem.device, "/".join(devices),
                                  f"runs on {'/'.join(devices)} only, tensors are on {problem.device}"))
        elif problem.device == "cuda" and problem.sm is not None:
            sm = problem.sm
            if (self.sm_min and sm < self.sm_min) or (self.sm_max and sm > self.sm_max):
                allowed = f"{_sm_text(self.sm_min)}..{_sm_text(self.sm_max)}"
                reasons.append(Reason("sm", _sm_text(sm), allowed,
                                      f"requires SM {allowed}, device is SM {_sm_text(sm)}"))
        given = dict(problem.dtypes)
        for role, allowed_dtypes in self.dtypes:
            actual = given.get(role)
            if actual is not None and actual not in allowed_dtypes:
                reasons.append(Reason(f"dtype.{role}", actual, "{" + ",".join(allowed_dtypes) + "}",
                                      f"{role} dtype {actual} not in {{{','.join(allowed_dtypes)}}}"))
        facts = dict(problem.shape)
        for fact, limit in self.shape:
            actual = facts.get(fact)
            if actual is not None and not limit.admits(actual):
                reasons.append(Reason(fact, actual, limit.describe(),
                                      f"{fact}={actual} not in {limit.describe()}"))
        for feature in sorted(problem.features - self.features):
            reasons.append(Reason("feature", feature, "{" + ",".join(sorted(self.features)) + "}",
                                  f"feature '{feature}' not supported"))
        if problem.layout is not None and self.layouts and problem.layout not in self.layouts:
            reasons.append(Reason("layout", problem.layout, "{" + ",".join(self.layouts) + "}",
                                  f"layout {problem.layout} not in {{{','.join(self.layouts)}}}"))
        if not assume_installed:
            for module in self.requires:
                error = import_error(module)
                if error:
                    reasons.append(Reason("import", module, "importable", f"{module}: {error}"))
            if self.requires_any:
                errors = [(m, import_error(m)) for m in self.requires_any]
                if all(err for _, err in errors):
                    msg = "; ".join(f"{m}: {err}" for m, err in errors)
                    reasons.append(Reason("import", "/".join(self.requires_any), "one importable",
                                          f"none of {'/'.join(self.requires_any)} imports ({msg})"))
        return reasons


def _sm_text(sm: tuple[int, int] | None) -> str:
    return "" if sm is None else f"{sm[0]}.{sm[1]}"


# --------------------------------------------------------------------------------------------
# loading and validation


def _fail(source: str, where: str, message: str) -> CapabilityDBError:
    return CapabilityDBError(f"{source}: {where}: {message}")


def _str_list(value: Any, source: str, where: str, allowed: Iterable[str] | None = None
              ) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(source, where, f"expected a list of strings, got {value!r}")
    if allowed is not None:
        allowed = tuple(allowed)
        for v in value:
            if v not in allowed:
                raise _fail(source, where, f"unknown value {v!r}; allowed: {', '.join(allowed)}")
    return tuple(value)


def _parse_record(backend: str, raw: dict, source: str, index: int) -> Record:
    where = f"op[{index}]"
    unknown = set(raw) - _RECORD_KEYS
    if unknown:
        raise _fail(source, f"{where}.{sorted(unknown)[0]}",
                    f"unknown key; allowed keys: {', '.join(sorted(_RECORD_KEYS))}")
    op = raw.get("name")
    if op not in OPS:
        raise _fail(source, f"{where}.name", f"unknown op {op!r}; known ops: {', '.join(sorted(OPS))}")
    spec = OPS[op]
    where = f"op[{index}] ({op})"
    if not isinstance(raw.get("verified"), bool):
        raise _fail(source, f"{where}.verified", "required: true once run on hardware, else false")
    devices = _str_list(raw.get("devices", ["cuda"]), source, f"{where}.devices", ("cuda", "cpu"))
    sm_min = sm_max = None
    if "cuda" in devices:
        for key in ("sm_min", "sm_max"):
            if not isinstance(raw.get(key), str):
                raise _fail(source, f"{where}.{key}", "required for cuda records, e.g. \"8.0\"")
        try:
            sm_min, sm_max = parse_sm(raw["sm_min"]), parse_sm(raw["sm_max"])
        except ValueError as exc:
            raise _fail(source, f"{where}.sm_min/sm_max", str(exc)) from None
        if sm_min > sm_max or sm_min < (7, 0) or sm_max > (13, 9):
            raise _fail(source, f"{where}.sm_min/sm_max",
                        f"bad SM range {raw['sm_min']}..{raw['sm_max']} (need 7.0 <= min <= max <= 13.x)")
    dtypes_raw = raw.get("dtypes", {})
    if not isinstance(dtypes_raw, dict):
        raise _fail(source, f"{where}.dtypes", "expected a table of role = [dtype names]")
    dtypes = []
    for role, names in dtypes_raw.items():
        if role not in spec.dtype_roles:
            raise _fail(source, f"{where}.dtypes.{role}",
                        f"unknown dtype role; {op} has: {', '.join(spec.dtype_roles)}")
        dtypes.append((role, _str_list(names, source, f"{where}.dtypes.{role}", DTYPE_NAMES)))
    shape_raw = raw.get("shape", {})
    if not isinstance(shape_raw, dict):
        raise _fail(source, f"{where}.shape", "expected a table of fact = { values/min/max/multiple_of }")
    shape = []
    for fact, limit in shape_raw.items():
        if fact not in spec.shape_facts:
            raise _fail(source, f"{where}.shape.{fact}",
                        f"unknown shape fact; {op} has: {', '.join(spec.shape_facts)}")
        if not isinstance(limit, dict) or set(limit) - _SHAPE_KEYS or not limit:
            raise _fail(source, f"{where}.shape.{fact}",
                        f"expected a table with keys from {sorted(_SHAPE_KEYS)}, got {limit!r}")
        values = limit.get("values")
        shape.append((fact, ShapeLimit(tuple(values) if values is not None else None,
                                       limit.get("min"), limit.get("max"), limit.get("multiple_of"))))
    features = _str_list(raw.get("features", []), source, f"{where}.features", spec.features)
    layouts = _str_list(raw.get("layouts", list(spec.layouts)), source, f"{where}.layouts", spec.layouts)
    verified_on = None
    if "verified_on" in raw:
        try:
            verified_on = tuple(parse_sm(sm) for sm in _str_list(raw["verified_on"], source,
                                                                  f"{where}.verified_on"))
        except ValueError as exc:
            raise _fail(source, f"{where}.verified_on", str(exc)) from None
        if not raw["verified"]:
            raise _fail(source, f"{where}.verified_on", "only meaningful with verified = true")
    kernel, check, planned = raw.get("kernel"), raw.get("check"), raw.get("planned", False)
    for key, ref in (("kernel", kernel), ("check", check)):
        if ref is not None and (not isinstance(ref, str) or not _REF.fullmatch(ref)):
            raise _fail(source, f"{where}.{key}", f"expected 'module:function' (a module of "
                        f"flashinfer.backends), got {ref!r}")
    if planned is not True and planned is not False:
        raise _fail(source, f"{where}.planned", f"expected true or false, got {planned!r}")
    if (kernel is None) != planned:
        raise _fail(source, where, "a record names its kernel (kernel = 'module:function') or "
                    "says planned = true, not both and not neither")
    if planned and (raw["verified"] or check is not None):
        raise _fail(source, where, "a planned record has no kernel: verified must be false and "
                    "there is no check")
    verified_by, tested_by = _evidence(raw, source, where)
    return Record(
        backend=backend,
        op=op,
        variant=str(raw.get("variant", "default")),
        devices=devices,
        sm_min=sm_min,
        sm_max=sm_max,
        dtypes=tuple(dtypes),
        shape=tuple(shape),
        features=frozenset(features),
        layouts=layouts,
        requires=_str_list(raw.get("requires", []), source, f"{where}.requires"),
        requires_any=_str_list(raw.get("requires_any", []), source, f"{where}.requires_any"),
        cpu_under_triton_interpret=bool(raw.get("cpu_under_triton_interpret", False)),
        verified=raw["verified"],
        verified_on=verified_on,
        deterministic=bool(raw.get("deterministic", True)),
        note=str(raw.get("note", "")),
        emulation=bool(raw.get("emulation", False)),
        kernel=kernel,
        check_ref=check,
        verified_by=verified_by,
        tested_by=tested_by,
        source=source,
    )


def _evidence(raw: dict, source: str, where: str) -> tuple[str | None, tuple[str, ...]]:
    """The form of ``verified_by`` / ``tested_by`` (tests/core/test_evidence.py checks the files)."""
    verified_by = raw.get("verified_by")
    if verified_by is not None:
        if not isinstance(verified_by, str) or not _LOG.fullmatch(verified_by):
            raise _fail(source, f"{where}.verified_by", "expected 'benchmarks/results/<GPU test "
                        f"log>', got {verified_by!r}")
        if raw["verified"] is not True:
            raise _fail(source, f"{where}.verified_by", "only meaningful with verified = true")
    tested_by = _str_list(raw.get("tested_by", []), source, f"{where}.tested_by")
    for path in tested_by:
        if not _TEST_FILE.fullmatch(path):
            raise _fail(source, f"{where}.tested_by",
                        f"expected 'tests/<family>/test_<name>.py', got {path!r}")
    return verified_by, tested_by


def parse_file(path: Path, backend_names: Iterable[str]) -> tuple[str, str, tuple[Record, ...]]:
    """Parse one backend file → (backend, description, records)."""
    source = path.name
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise CapabilityDBError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"backend", "description", "op"}
    if unknown:
        raise _fail(source, sorted(unknown)[0], "unknown top-level key; allowed: backend, description, op")
    backend = data.get("backend")
    if backend != path.stem or backend not in tuple(backend_names):
        raise _fail(source, "backend", f"must equal the file name and be a registered backend, got {backend!r}")
    records = tuple(_parse_record(backend, raw, source, i) for i, raw in enumerate(data.get("op", [])))
    seen = set()
    for rec in records:
        if (rec.op, rec.variant) in seen:
            raise _fail(source, f"op {rec.op}", f"duplicate variant {rec.variant!r}")
        seen.add((rec.op, rec.variant))
    return backend, str(data.get("description", "")), records


@dataclass(frozen=True)
class CapabilityDB:
    descriptions: dict[str, str]
    records: tuple[Record, ...]

    def for_op(self, op: str) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.op == op)

    def for_backend_op(self, backend: str, op: str) -> tuple[Record, ...]:
        return tuple(r for r in self.records if r.backend == backend and r.op == op)


def load(directory: Path = DB_DIR) -> CapabilityDB:
    descriptions, records = {}, []
    for path in sorted(directory.glob("*.toml")):
        backend, description, recs = parse_file(path, BACKEND_NAMES)
        descriptions[backend] = description
        records.extend(recs)
    missing = set(BACKEND_NAMES) - set(descriptions)
    if missing:
        raise CapabilityDBError(f"{directory}: no capability file for backend(s) {sorted(missing)}")
    return CapabilityDB(descriptions, tuple(records))


@functools.lru_cache(maxsize=1)
def database() -> CapabilityDB:
    """The capability database shipped with the package (loaded once)."""
    return load()
