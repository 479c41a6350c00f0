"""Dispatch rules: which usable backend to prefer, per op and SM family.

One TOML file per op (``<op>.toml`` beside this file)::

    op = "single_prefill"
    priority_basis = "benchmarks/results/X.json: cudnn 0.26 ms vs FA2 0.51 at causal 4096; ..."
    cpu_basis = "not measured: ..."   # only where the cpu row puts a kernel before the reference

    [priority]                 # SM family -> backends (or "backend:variant"), best first
    "9.0" = ["cudnn", "torch:flash_varlen", "triton", "reference"]
    cpu = ["reference"]
    default = ["torch", "reference"]   # families not listed

    [[threshold]]              # named shape rule; the first that matches replaces the priority
    name = "short_prefill_prefers_flash"
    families = ["9.0"]
    when = { qo_len = { max = 64 } }   # same limit tables as the capability DB
    features = ["cuda_graph"]          # optional: the call must use all of these features
    order = ["torch:flash_varlen", "cudnn"]
    basis = "benchmarks/results/....json: flash 1.4x cuDNN below 64 query tokens"

SM families: 7.5, 8.0 (8.0/8.6/8.7), 8.9, 9.0, 10 (10.x/11.x), 12 (12.x), cpu.

A basis is one line: the results file and what it showed (``benchmarks/results/<file>: A 89 us vs
B 5479 at 256 x 128k``), or "not measured" and why the order is what it is; families without a
measurement say "not measured" there. ``cpu_basis`` (shown for CPU problems) justifies a CPU order
that does not start with the reference. tests/core/test_evidence.py checks the shipped rules:
every named backend has a record serving the op in that family, every cited file exists, bases
are one line of at most 200 characters.

Tuned rules (``FLASHINFER_TUNED_RULES=path.json``) have the threshold shape plus ``op``::

    {"rules": [{"op": "single_prefill", "families": ["9.0"], "when": {"kv_len": {"min": 4096}},
                "order": ["cudnn"], "basis": "flashinfer tune, 2026-11-30, H200"}]}

and are consulted before the default rules. A backend missing from an order list is still
usable: it is tried just before the reference (so a list that forgets a new kernel never ranks
it below the slow path); to prefer the reference over a kernel, list that kernel after it
(``cpu = ["reference", "triton"]``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..capability_db import ShapeLimit, _SHAPE_KEYS
from ..device import SM_FAMILIES, sm_family
from ..backend_names import BACKEND_NAMES
from ..op_catalog import OPS

RULES_DIR = Path(__file__).resolve().parent


class DispatchRulesError(ValueError):
    """A rules file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class ShapeRule:
    name: str
    families: tuple[str, ...]
    when: tuple[tuple[str, ShapeLimit], ...]
    order: tuple[str, ...]
    basis: str
    features: frozenset = frozenset()

    def matches(self, problem) -> bool:
        if sm_family(problem.sm) not in self.families:
            return False
        if not self.features <= set(problem.features):
            return False
        facts = dict(problem.shape)
        return all(fact in facts and limit.admits(facts[fact]) for fact, limit in self.when)


@dataclass(frozen=True)
class OpRules:
    op: str
    priority: tuple[tuple[str, tuple[str, ...]], ...]
    priority_basis: str
    thresholds: tuple[ShapeRule, ...]
    cpu_basis: str = ""  # why the cpu order puts a kernel before the reference ("" = it does not)

    def family_order(self, family: str) -> tuple[str, ...]:
        table = dict(self.priority)
        return table.get(family, table.get("default", ("reference",)))


def _fail(source: str, where: str, message: str) -> DispatchRulesError:
    return DispatchRulesError(f"{source}: {where}: {message}")


def _check_order(order: Any, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(order, list) or not order:
        raise _fail(source, where, f"expected a non-empty list of backend names, got {order!r}")
    for entry in order:
        backend = str(entry).split(":", 1)[0]
        if backend not in BACKEND_NAMES:
            raise _fail(source, where, f"unknown backend {entry!r}; known: {', '.join(BACKEND_NAMES)}")
    return tuple(order)


def _parse_rule(raw: dict, op: str, source: str, where: str) -> ShapeRule:
    allowed = {"name", "families", "when", "features", "order", "basis", "op"}
    unknown = set(raw) - allowed
    if unknown:
        raise _fail(source, f"{where}.{sorted(unknown)[0]}", f"unknown key; allowed: {sorted(allowed)}")
    for key in ("name", "basis"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise _fail(source, f"{where}.{key}", "required (basis names the measurement behind the rule)")
    families = raw.get("families")
    if not isinstance(families, list) or not families or any(f not in SM_FAMILIES for f in families):
        raise _fail(source, f"{where}.families", f"expected a list from {SM_FAMILIES}, got {families!r}")
    when = []
    for fact, limit in (raw.get("when") or {}).items():
        if fact not in OPS[op].shape_facts:
            raise _fail(source, f"{where}.when.{fact}", f"unknown shape fact; {op} has {OPS[op].shape_facts}")
        if not isinstance(limit, dict) or not limit or set(limit) - _SHAPE_KEYS:
            raise _fail(source, f"{where}.when.{fact}", f"expected a table with keys from {sorted(_SHAPE_KEYS)}")
        values = limit.get("values")
        when.append((fact, ShapeLimit(tuple(values) if values is not None else None,
                                      limit.get("min"), limit.get("max"), limit.get("multiple_of"))))
    features = raw.get("features", [])
    if not isinstance(features, list) or any(f not in OPS[op].features for f in features):
        raise _fail(source, f"{where}.features", f"expected a list from {OPS[op].features}, "
                                                  f"got {features!r}")
    return ShapeRule(raw["name"], tuple(families), tuple(when),
                     _check_order(raw.get("order"), source, f"{where}.order"), raw["basis"],
                     frozenset(features))


def parse_file(path: Path) -> OpRules:
    source = path.name
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise DispatchRulesError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"op", "priority", "priority_basis", "cpu_basis", "threshold"}
    if unknown:
        raise _fail(source, sorted(unknown)[0], "unknown top-level key")
    op = data.get("op")
    if op not in OPS or op != path.stem:
        raise _fail(source, "op", f"must be a known op equal to the file name, got {op!r}")
    if not isinstance(data.get("priority_basis"), str):
        raise _fail(source, "priority_basis", "required: the measurement behind the order")
    if not isinstance(data.get("cpu_basis", ""), str):
        raise _fail(source, "cpu_basis", "expected a string: why the cpu order is what it is")
    priority = []
    for family, order in (data.get("priority") or {}).items():
        if family not in SM_FAMILIES and family != "default":
            raise _fail(source, f"priority.{family}", f"unknown SM family; allowed: {SM_FAMILIES + ('default',)}")
        priority.append((family, _check_order(order, source, f"priority.{family}")))
    if not priority:
        raise _fail(source, "priority", "at least one family order is required")
    thresholds = tuple(_parse_rule(raw, op, source, f"threshold[{i}]")
                       for i, raw in enumerate(data.get("threshold", [])))
    return OpRules(op, tuple(priority), data["priority_basis"], thresholds,
                   data.get("cpu_basis", ""))


@functools.lru_cache(maxsize=1)
def default_rules() -> dict[str, OpRules]:
    rules = {}
    for path in sorted(RULES_DIR.glob("*.toml")):
        parsed = parse_file(path)
        rules[parsed.op] = parsed
    return rules


@functools.lru_cache(maxsize=8)
def _load_tuned(path: str, mtime: float) -> tuple[tuple[str, ShapeRule], ...]:
    source = os.path.basename(path)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DispatchRulesError(f"FLASHINFER_TUNED_RULES={path}: cannot read: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise DispatchRulesError(f"{source}: expected {{\"rules\": [...]}}")
    out = []
    for i, raw in enumerate(data["rules"]):
        op = raw.get("op") if isinstance(raw, dict) else None
        if op not in OPS:
            raise _fail(source, f"rules[{i}].op", f"unknown op {op!r}")
        out.append((op, _parse_rule(raw, op, source, f"rules[{i}]")))
    return tuple(out)


def tuned_rules(path: str | None) -> tuple[tuple[str, ShapeRule], ...]:
    if not path:
        return ()
    try:
        mtime = os.path.getmtime(path)
    except OSError as exc:
        raise DispatchRulesError(f"FLASHINFER_TUNED_RULES={path}: cannot read: {exc}") from None
    return _load_tuned(path, mtime)


@dataclass(frozen=True)
class Ordering:
    order: tuple[str, ...]
    source: str  # "tuned" or "default"
    rule: str    # the rule's name, or "priority[<family>]"
    basis: str


def ordering(problem, tuned_path: str | None) -> Ordering:
    """The preference order for ``problem``: a matching tuned rule, a threshold, else priority."""
    for op, rule in tuned_rules(tuned_path):
        if op == problem.op and rule.matches(problem):
            return Ordering(rule.order, "tuned", rule.name, rule.basis)
    rules = default_rules().get(problem.op)
    if rules is None:
        return Ordering((), "default", "no rules file", "")
    for rule in rules.thresholds:
        if rule.matches(problem):
            return Ordering(rule.order, "default", rule.name, rule.basis)
    family = sm_family(problem.sm)
    basis = rules.cpu_basis if family == "cpu" and rules.cpu_basis else rules.priority_basis
    return Ordering(rules.family_order(family), "default", f"priority[{family}]", basis)
