"""The dispatcher: from a public call to the kernel that runs it, and why.

Design note
-----------
Every public op builds a :class:`Problem` — a hashable summary of the call: the op, the dtype of
each tensor role, the shape facts that matter (head dims, head counts, bucketed lengths), the
optional features used (causal, window, lse, ...), the layout, and the device (``cpu`` or
``cuda`` with its SM version). Nothing in a Problem refers to a tensor, so a Problem can be built
for a GPU that is not here (``flashinfer explain --sm 9.0``).

:func:`select` turns a Problem into a :class:`Decision` in four steps:

1. **Capability** — for every record of the op in ``capability_db`` (one TOML per backend, one
   record per kernel variant), collect every :class:`Reason` it cannot run: SM range, dtypes,
   shape limits, features, layout, missing packages, plus the adapter's own checks for what a
   table cannot say. A record with no reasons is *usable*.
2. **Overrides** — ``backend=`` argument > ``use_backend(...)`` > ``FLASHINFER_<FAMILY>_BACKEND``
   > ``FLASHINFER_BACKEND`` (see :mod:`flashinfer.overrides`). The first level that applies
   restricts the candidates; if none of its kernels is usable the call raises
   :class:`BackendUnavailableError` with their reasons (explicit is strict). Except upstream's
   names of its own kernels as a ``backend=`` argument (``fa2``, ``cudnn``, ``cublas``, ...:
   code written for upstream passes them where upstream's kernel runs anything): they fall
   through to the next level with a note saying what was asked and why it could not run,
   unless ``FLASHINFER_STRICT=1``.
3. **Order** — without an override, the usable kernels are ordered by a tuned rule
   (``FLASHINFER_TUNED_RULES``), else a named threshold (shape limits, optionally features such
   as ``cuda_graph``: a captured call is ranked by GPU time, an eager one pays launch cost),
   else the per-SM-family priority of ``dispatch_rules/<op>.toml``; unlisted usable kernels go
   just before the reference, and a kernel listed after the reference is opt-in (how a kernel
   not yet run on a GPU is shipped: usable when asked for, never chosen by ``auto``; once the
   GPU tests pass, its benchmark moves it into place, as for the Triton fp8 GEMM and MoE).
4. **Strict** — with ``FLASHINFER_STRICT=1`` a fall back to ``reference``, or to a kernel whose
   record says ``emulation = true`` (FP4 dequantised to bf16), for a CUDA problem raises instead
   of silently running the slow path.

The Decision records the chosen (backend, variant), every candidate with its reasons, and the
source that decided (``argument``, ``context``, ``environment``, ``tuned`` or ``default``).
``select`` is a pure function of (Problem, overrides, policy flags) and is cached on that key. On
the hot path an op asks :func:`decide_keyed` with a tuple of the call's raw facts (device,
dtypes, bucketed ints, flags) and a function that builds the Problem: a steady-state call is the
argument checks, one dict lookup (plus the raw override state: the ``use_backend`` context and
the env strings) and the kernel; no Problem is rebuilt, and no view is made to fit a kernel
signature beyond what the vendor entry itself needs (kernels take the forms their ops receive;
single decode's q becomes aten FA2's 3-D form, a ``bmm_fp8`` batch entry cuBLASLt's 2-D one:
the views that keep those rows over direct + 8 us, ``benchmarks/overhead.py``). The public
functions on the decode path (single decode, RMSNorm, the fp8 GEMMs, the probability samplers)
also skip their argument checks for a call whose signature (metadata and scalars, :mod:`flashinfer.checked_calls`)
passed them before, keeping the dispatch facts with it as a :class:`KeyedDecision` (the
Decision and the override state it was made under: a hit compares that state instead of
hashing the key) and, for single decode, the kernel's prepared form (``kernel.prepare``,
:mod:`flashinfer.attention.params`); a batch ``run()`` skips the checks of the q (and
ragged k / v) facts its last call of the same plan passed, and a paged one keeps each cache's
checked page views by identity (``PagedCacheViews``). A new Decision is logged once (at
``FLASHINFER_LOGLEVEL>=1``) when it is first made. Wrappers decide in ``plan()``; ``run()`` only
executes the kernel the Decision names. ``benchmarks/overhead.py`` measures what this costs
against the vendor kernel called directly.

Compositions: where a call can be rewritten into one a faster kernel serves, the family does
it and asks again, and the kernel that ran is the last Decision recorded for the call
(:func:`record`). Today: ``pos_encoding_mode="ROPE_LLAMA"`` in single decode / prefill runs
the plain call's kernel on RoPE-rotated copies of q and k when that kernel is not the reference
(:mod:`flashinfer.attention.positions`), and the batch wrappers run a ragged plan without it on
gathered, rotated key rows (:mod:`flashinfer.attention.batch_rope`); the reference rotates
inside its kernel.

Wrappers made of other wrappers are not ops of their own: the cascade, shared-prefix,
block-sparse, POD and ``BatchAttention`` wrappers plan batch prefill / decode wrappers (and merge
their states), so each part is decided as that op and the composite exposes those Decisions
(``level_decisions``, ``decision``, ``decisions`` with its ``mode``); ``explain`` names the ops
each dispatches (:class:`~flashinfer.op_catalog.PublicFunction`). A new kernel for a part then
serves every composite built on it, and no record claims a composite the parts cannot show.

Observers: every Decision the dispatcher hands out passes the open observer (:func:`observe`),
which may hand on another one: :func:`record_decisions` logs them; ``flashinfer.autotune``
(:mod:`flashinfer.autotuner`) hands out Decisions whose kernel first measures every usable
kernel on the call's arguments, then writes the winners as tuned rules. Outside such a block
the hot path pays one context-variable read.

Layout as built
---------------
Layers, imports only downward (``tests/core/test_layering.py`` enforces it, no cycles):

* entry points: ``cli``, ``warmup``, ``problems`` (typical Problems for ``explain``);
* public API: ``flashinfer`` and upstream's module paths. ``decode``, ``prefill``, ``page``,
  ``grouped_mm``, ``fp4_quantization`` are thin re-exports of the family packages (the one
  scheme: a public module defines nothing); ``norm``, ``rope``, ``activation`` are small enough
  to be their family in one module;
* family machinery: ``attention/`` (checks, params, the wrapper base, plan upload, kernel
  contracts), ``gemm/``, ``sampling/``, ``quantization/``, ``fused_moe/``;
* this dispatcher, then the data: ``op_catalog`` (ops, and every public name mapped to its ops),
  ``capability_db/`` and ``dispatch_rules/`` (TOML + loaders that import no adapter);
* backends: one package per backend named like it (``backends/{reference,torch,triton,
  flash_attn,cudnn,cutlass}``), shared helpers in ``backends/shared``; a record names its kernel
  and its adapter check as ``"module:function"`` strings resolved on first use, so nothing
  registers by import side effect;
* foundations every layer may use, importing nothing of the package: ``backend_names`` (the
  one table of backend spellings, upstream aliases and per-family ``backend=`` spellings),
  ``optional_packages``, ``shape_buckets``, ``reasons``, ``fp4_format``.

Where this differs from ``DESIGN.md``: tests share helpers through ``tests/conftest.py`` and,
within a family, ``tests/<family>/<family>_helpers.py`` (one conftest per directory would be
ambiguous to import from); the benchmark runners stay in the checkout's ``benchmarks/`` (each
also runs upstream, which is also named ``flashinfer``, in a process of its own) and
``flashinfer bench`` finds them there.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from . import envs, overrides
from .backend_names import BACKEND_NAMES
from .backends import resolve
from .capability_db import database
from .device import DeviceFacts, facts_of, sm_family
from .dispatch_rules import ordering
from .op_catalog import op_spec
from .reasons import Reason
from .shape_buckets import length_bucket

__all__ = [
    "Problem", "Reason", "Candidate", "Decision", "BackendUnavailableError", "NoBackendError",
    "StrictModeError", "select", "decide", "decide_keyed", "KeyedDecision", "decide_each", "record_decisions", "record", "dtype_name", "length_bucket",
    "kernel_for", "adapter_reasons",
]


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the spelling the capability DB uses)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


@dataclass(frozen=True)
class Problem:
    """A hashable description of one call: everything the dispatcher may decide on."""

    op: str
    device: str  # "cpu" | "cuda"
    sm: tuple[int, int] | None
    dtypes: tuple[tuple[str, str], ...] = ()
    shape: tuple[tuple[str, int], ...] = ()
    features: frozenset[str] = frozenset()
    layout: str | None = None

    @staticmethod
    def make(op: str, device: DeviceFacts | torch.device, *, dtypes: Mapping[str, Any] = (),
             shape: Mapping[str, int] = (), features: Iterable[str] = (), layout: str | None = None
             ) -> "Problem":
        # Hot path (every call): no validation here; select() checks a Problem when it is new.
        facts = device if isinstance(device, DeviceFacts) else facts_of(device)
        return Problem(
            op=op,
            device=facts.kind,
            sm=facts.sm,
            dtypes=tuple((k, v if isinstance(v, str) else dtype_name(v)) for k, v in dict(dtypes).items()),
            shape=tuple((k, int(v)) for k, v in dict(shape).items()),
            features=frozenset(features),
            layout=layout,
        )

    @property
    def family(self) -> str:
        return op_spec(self.op).family

    def describe(self) -> str:
        where = "cpu" if self.sm is None else f"cuda SM {self.sm[0]}.{self.sm[1]} (family {sm_family(self.sm)})"
        dtypes = ", ".join(f"{k}={v}" for k, v in self.dtypes)
        shape = ", ".join(f"{k}={v}" for k, v in self.shape)
        feats = ",".join(sorted(self.features)) or "none"
        layout = f" layout={self.layout}" if self.layout else ""
        return f"{self.op} on {where}: dtypes[{dtypes}] shape[{shape}] features[{feats}]{layout}"

    def as_dict(self) -> dict:
        return {"op": self.op, "device": self.device,
                "sm": None if self.sm is None else f"{self.sm[0]}.{self.sm[1]}",
                "dtypes": dict(self.dtypes), "shape": dict(self.shape),
                "features": sorted(self.features), "layout": self.layout}


@dataclass(frozen=True)
class Candidate:
    """One kernel the dispatcher considered, and every reason it cannot run (empty = usable)."""

    backend: str
    variant: str
    reasons: tuple[Reason, ...]
    verified: bool = False
    note: str = ""
    emulation: bool = False  # a slow stand-in for a missing native kernel (record key)
    kernel: str | None = None  # the record's "module:function"; None for a planned record

    @property
    def name(self) -> str:
        return self.backend if self.variant == "default" else f"{self.backend}:{self.variant}"

    @property
    def usable(self) -> bool:
        return not self.reasons

    @property
    def planned(self) -> bool:
        return self.kernel is None


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`select`: the kernel to run and how it was chosen."""

    problem: Problem
    backend: str
    variant: str
    source: str  # "argument" | "context" | "environment" | "tuned" | "default"
    rule: str  # the override's origin, or the rule that ordered the candidates
    basis: str  # the measurement behind the rule (empty for overrides)
    order: tuple[str, ...]  # usable kernels, best first, as the chosen source ordered them
    candidates: tuple[Candidate, ...]
    notes: tuple[str, ...] = ()
    _kernel: list = field(default_factory=list, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.backend if self.variant == "default" else f"{self.backend}:{self.variant}"

    @property
    def kernel(self) -> Callable:
        """The function the chosen record names (imported on first use)."""
        if not self._kernel:
            ref = next(c.kernel for c in self.candidates
                       if c.backend == self.backend and c.variant == self.variant)
            self._kernel.append(resolve(ref))
        return self._kernel[0]

    def rejected(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if not c.usable)

    def explain(self) -> str:
        lines = [f"problem: {self.problem.describe()}",
                 f"chosen:  {self.name} (source: {self.source}; {self.rule})"]
        if self.basis:
            lines.append(f"basis:   {self.basis}")
        lines.append(f"order:   {' > '.join(self.order)}")
        lines.extend(f"note:    {n}" for n in self.notes)
        for cand in self.candidates:
            status = "usable" if cand.usable else "planned" if cand.planned else "rejected"
            flag = "" if cand.verified else " [not verified on hardware]"
            flag += " [emulation: refused by FLASHINFER_STRICT=1]" if cand.emulation else ""
            lines.append(f"  {cand.name:<24} {status}{flag}")
            lines.extend(f"      - {r.message}" for r in cand.reasons)
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "problem": self.problem.as_dict(), "backend": self.backend, "variant": self.variant,
            "source": self.source, "rule": self.rule, "basis": self.basis, "order": list(self.order),
            "notes": list(self.notes),
            "candidates": [
                {"backend": c.backend, "variant": c.variant, "usable": c.usable,
                 "verified": c.verified, "emulation": c.emulation,
                 "reasons": [{"field": r.field, "actual": str(r.actual), "allowed": str(r.allowed),
                              "message": r.message} for r in c.reasons]}
                for c in self.candidates
            ],
        }


class NoBackendError(RuntimeError):
    """No backend can run the problem. The message lists every backend with its reasons."""

    def __init__(self, problem: Problem, candidates: Iterable[Candidate], headline: str,
                 remedy: str = ""):
        self.problem = problem
        self.candidates = tuple(candidates)
        lines = [headline, f"  problem: {problem.describe()}"]
        for cand in self.candidates:
            lines.append(f"  {cand.name}:")
            lines.extend(f"    - {r.message}" for r in cand.reasons or
                         (Reason("", "", "", "usable, but not allowed by the override"),))
        if remedy:
            lines.append(f"  remedy: {remedy}")
        super().__init__("\n".join(lines))


class BackendUnavailableError(NoBackendError, ValueError):
    """The backend named by an argument, context or environment override cannot run the problem."""


class StrictModeError(NoBackendError):
    """``FLASHINFER_STRICT=1`` and only the reference backend could run a CUDA problem."""


def evaluate_candidates(problem: Problem, *, assume_installed: bool = False,
                        triton_interpret: bool = False) -> tuple[Candidate, ...]:
    """Every kernel declared for the op, each with all its reasons (empty = usable)."""
    out = []
    for record in database().for_op(problem.op):
        reasons = record.check(problem, assume_installed=assume_installed,
                               triton_interpret=triton_interpret)
        if not reasons and record.check_ref is not None:
            reasons = list(resolve(record.check_ref)(problem))
        out.append(Candidate(record.backend, record.variant, tuple(reasons),
                             record.verified_for(problem.sm), record.note, record.emulation,
                             record.kernel))
    return tuple(out)


def _record(backend: str, op: str, variant: str):
    for record in database().for_backend_op(backend, op):
        if record.variant == variant:
            return record
    raise LookupError(f"no capability record for {backend}:{variant} serving {op}")


def kernel_for(backend: str, op: str, variant: str = "default") -> Callable:
    """The function the record (backend, op, variant) names, without choosing: for calling one
    kernel directly (tests, benchmarks). ``LookupError`` when no such record or it is planned."""
    record = _record(backend, op, variant)
    if record.kernel is None:
        raise LookupError(f"{backend}:{variant} for {op} is planned: no kernel is wired")
    return resolve(record.kernel)


def adapter_reasons(backend: str, op: str, variant: str, problem: Problem) -> list[Reason]:
    """The record's adapter check (``check = "module:function"``) on ``problem``; [] without one."""
    record = _record(backend, op, variant)
    return list(resolve(record.check_ref)(problem)) if record.check_ref else []


def _ordered(usable: list[Candidate], order: tuple[str, ...]) -> list[Candidate]:
    """Listed kernels in list order (``backend:variant`` is that variant's place, a bare backend
    the place of its variants the list does not name); unlisted ones just before the reference
    (so a rule that forgets a new backend never ranks it below the slow path); the reference
    last unless the list puts something after it (e.g. ``cpu = ["reference", "triton"]``)."""
    ref_pos = order.index("reference") if "reference" in order else len(order)

    def rank(cand: Candidate) -> tuple[float, int]:
        named = f"{cand.backend}:{cand.variant}"  # a variant the list names takes that place
        if named in order:
            return (order.index(named), 0)
        for i, spec in enumerate(order):
            if spec == cand.backend:
                return (i, 0)
        if cand.backend == "reference":
            return (len(order) + 1, 0)
        return (ref_pos - 0.5, BACKEND_NAMES.index(cand.backend))
    return sorted(usable, key=rank)  # stable: variants keep their declaration order


@functools.lru_cache(maxsize=4096)
def select(problem: Problem, levels: tuple[overrides.Override, ...] = (), *, strict: bool = False,
           tuned_path: str | None = None, assume_installed: bool = False,
           triton_interpret: bool = False) -> Decision:
    """Choose the kernel for ``problem``. Pure and cached; see the design note above.

    ``assume_installed=True`` pretends every vendor package imports (for ``explain --sm`` and
    tests of the dispatch rules on machines without those packages).
    """
    unknown = problem.features - set(op_spec(problem.op).features)
    if unknown:  # a programming error in an op module, not a user error
        raise AssertionError(f"op {problem.op} has no feature(s) {sorted(unknown)}")
    candidates = evaluate_candidates(problem, assume_installed=assume_installed,
                                 triton_interpret=triton_interpret)
    usable = [c for c in candidates if c.usable]
    notes: list[str] = []

    for level in levels:
        declared = {c.backend for c in candidates}
        if level.scope == "global" and not (level.backends() & declared):
            notes.append(f"{level.origin}={level.spelling} ignored: no "
                         f"{'/'.join(sorted(level.backends()))} kernel for {problem.op}")
            continue
        chosen = [c for c in usable if level.allows(c.backend, c.variant)]
        if not chosen and level.preference and not strict:
            named = [c for c in candidates if level.allows(c.backend, c.variant)]
            why = "; ".join(f"{c.name}: {c.reasons[0].message}" for c in named if c.reasons)
            notes.append(f"{level.origin}={level.spelling!r} (upstream's kernel name) asks for "
                         f"{', '.join(level.allowed)}, which cannot run this problem here "
                         f"({why or 'no such kernel for ' + problem.op}); the next level or the "
                         f"rules choose instead (FLASHINFER_STRICT=1 makes this an error)")
            continue
        if not chosen:
            named = [c for c in candidates if level.allows(c.backend, c.variant)]
            raise BackendUnavailableError(
                problem, named or candidates,
                f"{level.origin}={level.spelling!r} cannot run this problem "
                f"(allowed kernels: {', '.join(level.allowed)})",
                remedy=("use backend='auto' or another backend; `flashinfer explain` shows all"
                        if named else f"{level.spelling} has no kernel for {problem.op}"))
        rule = ordering(problem, tuned_path)
        chosen = _ordered(chosen, rule.order)
        return _finish(problem, chosen, candidates, level.source, f"{level.origin}={level.spelling}",
                       "", notes, strict)

    if not usable:
        raise NoBackendError(problem, candidates, f"no backend can run {problem.op}",
                             remedy="see each backend's reasons above")
    rule = ordering(problem, tuned_path)
    return _finish(problem, _ordered(usable, rule.order), candidates, rule.source, rule.rule,
                   rule.basis, notes, strict)


def _finish(problem: Problem, ordered: list[Candidate], candidates: tuple[Candidate, ...],
            source: str, rule: str, basis: str, notes: list[str], strict: bool) -> Decision:
    best = ordered[0]
    if strict and problem.device == "cuda" and (best.backend == "reference" or best.emulation):
        what = "the slow reference backend" if best.backend == "reference" else (
            f"{best.name}, an emulation (no native kernel for this problem here)")
        raise StrictModeError(problem, candidates,
                              f"FLASHINFER_STRICT=1: only {what} can run this CUDA problem",
                              remedy="unset FLASHINFER_STRICT to allow the fallback")
    decision = Decision(problem, best.backend, best.variant, source, rule, basis,
                        tuple(c.name for c in ordered), candidates, tuple(notes))
    from . import api_logging

    api_logging.log_decision(decision)
    return decision


class _Log(list):
    """A :func:`record_decisions` block's list; ``see`` is what the dispatcher calls with every
    Decision it hands out (an observer may return another one: :mod:`flashinfer.autotuner`)."""

    def see(self, decision: "Decision") -> "Decision":
        self.append(decision)
        return decision


#: the open record_decisions block or autotune() context (an object with ``see``), or None
_RECORDER: contextvars.ContextVar = contextvars.ContextVar("flashinfer_recorder", default=None)


@contextlib.contextmanager
def record_decisions() -> Iterator[list[Decision]]:
    """Collect the Decision of every dispatched call inside the block (cached ones included)::

        with flashinfer.record_decisions() as log:
            flashinfer.rmsnorm(x, w)
        print(log[-1].explain())
    """
    log = _Log()
    token = _RECORDER.set(_Chained(log, _RECORDER.get()))
    try:
        yield log
    finally:
        _RECORDER.reset(token)


class _Chained:
    """An observer inside another one (a record_decisions block inside autotune(), or the
    reverse): both see every Decision, the inner one first."""

    __slots__ = ("inner", "outer")

    def __init__(self, inner, outer):
        self.inner, self.outer = inner, outer

    def see(self, decision: "Decision") -> "Decision":
        decision = self.inner.see(decision)
        return decision if self.outer is None else self.outer.see(decision)


def observe(observer) -> contextlib.AbstractContextManager:
    """A context in which ``observer.see(decision)`` gets (and may replace) every Decision the
    dispatcher hands out, after any observer already open."""
    @contextlib.contextmanager
    def block():
        token = _RECORDER.set(_Chained(observer, _RECORDER.get()))
        try:
            yield observer
        finally:
            _RECORDER.reset(token)
    return block()


def record(decision: Decision) -> None:
    """Show ``decision`` to the open :func:`record_decisions` block, if any: for a family that
    consulted several Decisions for one call (:mod:`flashinfer.attention.positions`), so the
    block's last entry is the kernel that ran."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.see(decision)


#: decide()'s memo: (problem, backend, context, raw env values) -> Decision, or the
#: NoBackendError / BackendUnavailableError / StrictModeError it raised. Keyed on the raw
#: strings, so the hot path never parses an env var or walks the override levels.
_MEMO: dict[tuple, Decision] = {}
_KEYED: dict[tuple, Decision] = {}  # decide_keyed()'s memo: (raw key, backend, state) -> Decision
_GENERATION = [0]  # bumped by clear_cache(): callers' memos (decide_each) are then stale
_MEMO_LIMIT = 8192
_FAMILY_OF: dict[str, tuple[str, tuple]] = {}
# os.environ.get costs ~1 us (it encodes the key); CPython's underlying dict of bytes is read
# directly when it exists (POSIX), else os.environ with str keys.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_BYTES = isinstance(_ENV_DATA, dict) and os.name == "posix"
_COMMON_ENV = ("FLASHINFER_BACKEND", "FLASHINFER_STRICT", "FLASHINFER_TUNED_RULES", "TRITON_INTERPRET")


def _env_keys(family: str) -> tuple:
    names = (envs.family_backend(family).name,) + _COMMON_ENV
    return tuple(n.encode() for n in names) if _ENV_BYTES else names


def _override_state(op: str) -> tuple[str, tuple]:
    """``op``'s family and the raw state of everything that can override its choice."""
    entry = _FAMILY_OF.get(op)
    if entry is None:
        family = op_spec(op).family
        entry = _FAMILY_OF[op] = (family, _env_keys(family))
    family, env_keys = entry
    env = _ENV_DATA if _ENV_BYTES else os.environ
    return family, (overrides.context_key(), *map(env.get, env_keys))


def decide(problem: Problem, backend: str | None = "auto") -> Decision:
    """Resolve the overrides that apply to ``problem`` and select (the op modules call this)."""
    family, state = _override_state(problem.op)
    return _seen(_decide(problem, backend, family, state))


def _seen(decision: Decision) -> Decision:
    """``decision`` as the open observer (if any) hands it on."""
    recorder = _RECORDER.get()
    return decision if recorder is None else recorder.see(decision)


def decide_keyed(key: tuple, make_problem: Callable[[], Problem],
                 backend: str | None = "auto") -> Decision:
    """:func:`decide` for a steady-state call: ``key`` is the op's name followed by the raw facts
    its Problem is made from (devices, dtypes, ints, bools: cheap to hash, nothing rebuilt), and
    ``make_problem()`` builds that Problem on a miss only. The hot path of every op is then one
    dict lookup; the Problem, the overrides and the rules are consulted once per new key."""
    return _seen(_keyed(key, make_problem, backend, _override_state(key[0])))


def _keyed(key: tuple, make_problem: Callable[[], Problem], backend: str | None,
           family_state: tuple[str, tuple]) -> Decision:
    family, state = family_state
    full = (key, backend, state)
    decision = _KEYED.get(full)
    if decision is None:
        decision = _decide(make_problem(), backend, family, state)  # raises what decide() raises
        if len(_KEYED) >= _MEMO_LIMIT:
            _KEYED.clear()
        _KEYED[full] = decision
    return decision


class KeyedDecision:
    """:func:`decide_keyed` for one key that a caller's memo keeps (the steady-state memos of
    :mod:`flashinfer.checked_calls`): the slot remembers the Decision it last handed out with the
    override state it was made under — the ``use_backend`` context (by identity:
    :data:`overrides.current_context`), the family's environment variables, the ``backend``
    argument and the cache generation — so a call under the same state compares that state
    instead of hashing the key again."""

    __slots__ = ("key", "make_problem", "_last", "_env_keys")

    def __init__(self, key: tuple, make_problem: Callable[[], Problem]):
        self.key, self.make_problem = key, make_problem
        self._last: tuple | None = None  # (context, env values, backend, generation, decision)
        self._env_keys: tuple = ()

    def get(self, backend: str | None = "auto") -> Decision:
        context = overrides.current_context()
        env = tuple(map((_ENV_DATA if _ENV_BYTES else os.environ).get, self._env_keys))
        last = self._last
        if (last is not None and last[0] is context and last[1] == env and last[2] == backend
                and last[3] == _GENERATION[0]):
            decision = last[4]
        else:
            family_state = _override_state(self.key[0])
            decision = _keyed(self.key, self.make_problem, backend, family_state)
            self._env_keys = _FAMILY_OF[self.key[0]][1]
            env = tuple(map((_ENV_DATA if _ENV_BYTES else os.environ).get, self._env_keys))
            self._last = (context, env, backend, _GENERATION[0], decision)
        recorder = _RECORDER.get()
        return decision if recorder is None else recorder.see(decision)


def decide_each(problems: list[Problem], backend: str | None = "auto",
                memo: dict | None = None) -> list:
    """:func:`decide` for several Problems of one op (a batch plan()'s run-time feature
    combinations), the override state read once: a Decision, or the exception decide() raises,
    per Problem. ``memo``: a dict the caller keeps with these Problems; the answer is reused
    from it while the overrides, the backend and the caches are unchanged and no
    :func:`record_decisions` block is open (the hot path of a plan() per serving step)."""
    family, state = _override_state(problems[0].op)
    key = (backend, state, _GENERATION[0])
    if memo is not None and memo.get("key") == key and _RECORDER.get() is None:
        return memo["answer"]
    out = []
    for problem in problems:
        try:
            out.append(_seen(_decide(problem, backend, family, state)))
        except (NoBackendError, BackendUnavailableError) as err:
            out.append(err)
    if memo is not None:
        memo["key"], memo["answer"] = key, out
    return out


def _decide(problem: Problem, backend: str | None, family: str, state: tuple) -> Decision:
    key = (problem, backend, state)
    decision = _MEMO.get(key)
    if decision is None:
        try:
            decision = select(
                problem,
                overrides.collect(family, backend),
                strict=envs.STRICT.get(),
                tuned_path=envs.TUNED_RULES.get(),
                triton_interpret=envs.TRITON_INTERPRET.get(),
            )
        except (NoBackendError, BackendUnavailableError, StrictModeError) as err:
            decision = err  # remembered too: a batch plan() asks for unservable combinations
        if len(_MEMO) >= _MEMO_LIMIT:
            _MEMO.clear()
        _MEMO[key] = decision
    if isinstance(decision, Exception):
        raise decision.with_traceback(None)
    return decision


def clear_cache() -> None:
    """Forget every cached Decision (e.g. after installing a vendor package)."""
    from .optional_packages import import_error

    select.cache_clear()
    _MEMO.clear()
    _KEYED.clear()
    _GENERATION[0] += 1
    import_error.cache_clear()
