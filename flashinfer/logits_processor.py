"""Declarative logits-processing pipelines (upstream module ``flashinfer.logits_processor``).

``LogitsPipe([Temperature(), Softmax(), TopK(), Sample()])(logits, temperature=0.7, top_k=40)``
returns sampled token ids. A pipeline is built in three steps, as upstream:

1. **Legalization**: each processor becomes the low-level operator(s) for the tensor type it
   receives (:class:`TensorType`: LOGITS, PROBS or the terminal INDICES): ``TopK`` on logits
   masks them (``top_k_mask_logits``), on probabilities it renormalises
   (``top_k_renorm_probs``); ``Sample`` draws from logits or probabilities. The input type is
   ``input_type``, else inferred from the first processor (``Temperature`` / ``Softmax``:
   logits; ``TopP`` / ``MinP``: probabilities; ``TopK`` / ``Sample`` accept both, so the
   pipeline needs ``input_type``).
2. **Checks**: each operator's input type is the previous one's output type; at most one
   ``Softmax``; nothing after an operator that outputs indices (plus ``custom_validity_checks``:
   callables on the operator list that raise :class:`CompileError`).
3. **Fusion** (``compile=True``): windows of operators matching a :class:`FusionRule` pattern
   (exact operator classes, highest ``prio`` first, scanning left to right) become one fused
   operator: temperature + softmax -> ``softmax(logits, temperature)``; top-k / top-p / min-p +
   sample -> the matching ``*_sampling_from_probs``; top-k + top-p + sample ->
   ``top_k_top_p_sampling_from_probs(filter_apply_order="joint")`` when the ``TopK`` was built
   with ``joint_topk_topp=True``.

Parameters: a processor's constructor keywords are its operators' defaults; keywords of the
call (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``indices``, ``generator``) override
them, each operator reading the ones it knows. Every operator runs this package's dispatched
sampling functions (:mod:`flashinfer.sampling`), so the kernels are the sampling family's
Decisions; ``MinP`` on probabilities is a torch mask and renormalisation (no sampling function
renormalises by min-p). The result is a plain tensor: token ids, or the last tensor.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import sampling

__all__ = [
    "CompileError", "Compiler", "FusionRule", "LegalizationError", "LogitsPipe", "LogitsProcessor",
    "MinP", "Op", "ParameterizedOp", "Sample", "Softmax", "TaggedTensor", "Temperature",
    "TensorType", "TopK", "TopP", "compile_pipeline", "legalize_processors",
]


class TensorType(enum.Enum):
    """What a tensor in a pipeline holds."""

    LOGITS = enum.auto()   #: real-valued scores (possibly masked with -inf)
    PROBS = enum.auto()    #: non-negative probabilities (possibly unnormalised)
    INDICES = enum.auto()  #: sampled token ids: nothing may follow

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class TaggedTensor:
    """A tensor and its :class:`TensorType`, as operators pass them along."""

    data: torch.Tensor
    type: TensorType

    @staticmethod
    def logits(t: torch.Tensor) -> "TaggedTensor":
        return TaggedTensor(t, TensorType.LOGITS)

    @staticmethod
    def probs(t: torch.Tensor) -> "TaggedTensor":
        return TaggedTensor(t, TensorType.PROBS)

    @staticmethod
    def indices(t: torch.Tensor) -> "TaggedTensor":
        return TaggedTensor(t, TensorType.INDICES)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype


class CompileError(Exception):
    """An operator list that fails a type or validity check."""


class LegalizationError(Exception):
    """A processor that cannot take the tensor type it would receive."""


# --------------------------------------------------------------------------------------------
# operators


class Op:
    """A low-level step: ``IN`` -> ``OUT`` tensor types; ``op(tagged, **call_params)``."""

    IN: Optional[TensorType] = None
    OUT: Optional[TensorType] = None

    def __init__(self):
        if self.IN is None or self.OUT is None:
            raise ValueError(f"operator {type(self).__name__} must define its IN and OUT types")

    def __call__(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        raise NotImplementedError

    def _validate_input_type(self, tensor: TaggedTensor) -> TensorType:
        if tensor.type != self.IN:
            raise ValueError(f"operator {type(self).__name__} takes {self.IN}, got {tensor.type}")
        return self.OUT

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.IN} -> {self.OUT})"


class ParameterizedOp(Op):
    """An operator with default parameters (its processor's constructor keywords), which the
    call's keywords override."""

    def __init__(self, **default_params: Any):
        super().__init__()
        self.default_params = default_params

    def _get_param(self, name: str, kwargs: dict, required: bool = True) -> Any:
        if name in kwargs:
            return kwargs.pop(name)
        if name in self.default_params:
            return self.default_params[name]
        if required:
            raise ValueError(f"required parameter {name!r} not given to {type(self).__name__} "
                             f"(pass it to the pipeline call or the processor)")
        return None

    def _draw_args(self, kwargs: dict) -> dict:
        return dict(indices=self._get_param("indices", kwargs, False),
                    deterministic=self.default_params.get("deterministic", True),
                    generator=self._get_param("generator", kwargs, False))


def _op(name: str, into: TensorType, out: TensorType, run: Callable, doc: str) -> type:
    """An operator class whose call is ``run(op, data, kwargs) -> tensor``."""
    def call(self, tensor: TaggedTensor, **kwargs: Any) -> TaggedTensor:
        return TaggedTensor(run(self, tensor.data, kwargs), self._validate_input_type(tensor))
    return type(name, (ParameterizedOp,), {"IN": into, "OUT": out, "__call__": call,
                                           "__doc__": doc})


_L, _P, _I = TensorType.LOGITS, TensorType.PROBS, TensorType.INDICES


def _temperature(op, logits, kw):
    t = op._get_param("temperature", kw)
    if isinstance(t, torch.Tensor):
        return logits / t.to(logits.dtype).reshape(-1, 1)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 < t < float("inf"):
        raise ValueError(f"temperature must be a finite number > 0 or a [batch] tensor, got {t!r}")
    return logits / float(t)


def _min_p_renorm(op, probs, kw):
    min_p = op._get_param("min_p", kw)
    if isinstance(min_p, torch.Tensor):
        bound = min_p.to(probs.dtype).reshape(-1, 1)
    elif isinstance(min_p, (int, float)) and not isinstance(min_p, bool) and 0 < min_p <= 1:
        bound = float(min_p)
    else:
        raise ValueError(f"min_p must be a float in (0, 1] or a [batch] tensor, got {min_p!r}")
    kept = torch.where(probs >= bound * probs.amax(-1, keepdim=True), probs, 0)
    return kept / kept.sum(-1, keepdim=True)


TemperatureOp = _op("TemperatureOp", _L, _L, _temperature, "logits / temperature")
SoftmaxOp = _op("SoftmaxOp", _L, _P, lambda op, x, kw: sampling.softmax(x), "softmax")
LogitsTopKOp = _op("LogitsTopKOp", _L, _L, lambda op, x, kw: sampling.top_k_mask_logits(
    x, op._get_param("top_k", kw)), "top_k_mask_logits")
ProbsTopKOp = _op("ProbsTopKOp", _P, _P, lambda op, x, kw: sampling.top_k_renorm_probs(
    x, op._get_param("top_k", kw)), "top_k_renorm_probs")
TopPOp = _op("TopPOp", _P, _P, lambda op, x, kw: sampling.top_p_renorm_probs(
    x, op._get_param("top_p", kw)), "top_p_renorm_probs")
MinPOp = _op("MinPOp", _P, _P, _min_p_renorm, "min-p mask and renormalisation")
ProbsSampleOp = _op("ProbsSampleOp", _P, _I, lambda op, x, kw: sampling.sampling_from_probs(
    x, **op._draw_args(kw)), "sampling_from_probs")
LogitsSampleOp = _op("LogitsSampleOp", _L, _I, lambda op, x, kw: sampling.sampling_from_logits(
    x, **op._draw_args(kw)), "sampling_from_logits")
FusedTemperatureSoftmaxOp = _op(
    "FusedTemperatureSoftmaxOp", _L, _P,
    lambda op, x, kw: sampling.softmax(x, op._get_param("temperature", kw)),
    "softmax(logits, temperature)")
FusedProbsTopKSampleOp = _op(
    "FusedProbsTopKSampleOp", _P, _I, lambda op, x, kw: sampling.top_k_sampling_from_probs(
        x, op._get_param("top_k", kw), **op._draw_args(kw)), "top_k_sampling_from_probs")
FusedProbsTopPSampleOp = _op(
    "FusedProbsTopPSampleOp", _P, _I, lambda op, x, kw: sampling.top_p_sampling_from_probs(
        x, op._get_param("top_p", kw), **op._draw_args(kw)), "top_p_sampling_from_probs")
FusedProbsMinPSampleOp = _op(
    "FusedProbsMinPSampleOp", _P, _I, lambda op, x, kw: sampling.min_p_sampling_from_probs(
        x, op._get_param("min_p", kw), **op._draw_args(kw)), "min_p_sampling_from_probs")
FusedProbsTopKTopPSampleOp = _op(
    "FusedProbsTopKTopPSampleOp", _P, _I,
    lambda op, x, kw: sampling.top_k_top_p_sampling_from_probs(
        x, op._get_param("top_k", kw), op._get_param("top_p", kw),
        filter_apply_order="joint", **op._draw_args(kw)),
    "top_k_top_p_sampling_from_probs, joint")


# --------------------------------------------------------------------------------------------
# processors


class LogitsProcessor:
    """A pipeline step as users write it; :meth:`legalize` turns it into operators for the
    tensor type it receives. Subclass it (and :class:`Op`) for custom steps."""

    def __init__(self, **params: Any):
        self.params = params

    def legalize(self, input_type: TensorType) -> List[Op]:
        raise NotImplementedError

    def _one(self, input_type: TensorType, by_type: dict) -> List[Op]:
        op = by_type.get(input_type)
        if op is None:
            takes = " or ".join(str(t) for t in by_type)
            raise LegalizationError(f"{type(self).__name__} takes {takes}, got {input_type}")
        return [op(**self.params)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.params.items())})"


class Temperature(LogitsProcessor):
    """LOGITS -> LOGITS: ``logits / temperature`` (call or constructor keyword ``temperature``:
    a float > 0 or a ``[batch]`` tensor)."""

    def legalize(self, input_type):
        return self._one(input_type, {_L: TemperatureOp})


class Softmax(LogitsProcessor):
    """LOGITS -> PROBS (``enable_pdl`` accepted and ignored)."""

    def __init__(self, enable_pdl: Optional[bool] = None, **params: Any):
        super().__init__(enable_pdl=enable_pdl, **params)

    def legalize(self, input_type):
        return self._one(input_type, {_L: SoftmaxOp})


class TopK(LogitsProcessor):
    """LOGITS -> LOGITS (the others become -inf) or PROBS -> PROBS (the others become 0,
    renormalised); keyword ``top_k``. ``joint_topk_topp=True``: a following TopP + Sample fuse
    into joint top-k / top-p sampling."""

    def __init__(self, joint_topk_topp: bool = False, **params: Any):
        super().__init__(joint_topk_topp=joint_topk_topp, **params)

    def legalize(self, input_type):
        return self._one(input_type, {_L: LogitsTopKOp, _P: ProbsTopKOp})


class TopP(LogitsProcessor):
    """PROBS -> PROBS: nucleus filtering and renormalisation; keyword ``top_p``."""

    def legalize(self, input_type):
        return self._one(input_type, {_P: TopPOp})


class MinP(LogitsProcessor):
    """PROBS -> PROBS: keep ``p >= min_p * max(p)``, renormalised; keyword ``min_p``."""

    def legalize(self, input_type):
        return self._one(input_type, {_P: MinPOp})


class Sample(LogitsProcessor):
    """LOGITS or PROBS -> INDICES: one token per row (``deterministic``, constructor; ``indices``,
    ``generator``, call keywords)."""

    def __init__(self, deterministic: bool = True, **params: Any):
        super().__init__(deterministic=deterministic, **params)

    def legalize(self, input_type):
        return self._one(input_type, {_L: LogitsSampleOp, _P: ProbsSampleOp})


def legalize_processors(processors: Sequence[LogitsProcessor],
                        initial_type: TensorType = TensorType.LOGITS) -> List[Op]:
    """The operators of ``processors`` fed a tensor of ``initial_type``."""
    if not processors:
        raise LegalizationError("cannot legalize an empty processor list")
    ops, current = [], initial_type
    for proc in processors:
        try:
            step = proc.legalize(current)
        except ValueError as err:
            raise LegalizationError(str(err)) from err
        if not step:
            raise LegalizationError(f"{type(proc).__name__} legalized to no operator")
        ops.extend(step)
        current = step[-1].OUT
    return ops


def _infer_initial_type(processors: Sequence[LogitsProcessor]) -> TensorType:
    accepted = []
    for t in (_L, _P):
        try:
            processors[0].legalize(t)
            accepted.append(t)
        except (LegalizationError, ValueError):
            pass
    if len(accepted) == 1:
        return accepted[0]
    name = type(processors[0]).__name__
    if accepted:
        raise LegalizationError(f"cannot infer the input type: {name} takes LOGITS and PROBS; "
                                f"pass input_type=TensorType.LOGITS or TensorType.PROBS")
    raise LegalizationError(f"{name} takes neither LOGITS nor PROBS as the first step")


# --------------------------------------------------------------------------------------------
# compilation: checks and fusion


class FusionRule(NamedTuple):
    """Operators of exactly the classes in ``pattern``, consecutive, for which ``guard(window)``
    holds, become ``build(window)``; higher ``prio`` rules are tried first."""

    pattern: Tuple[type, ...]
    guard: Callable[[List[Op]], bool]
    build: Callable[[List[Op]], Op]
    prio: int = 0


def _keeps_determinism(fused: type) -> Callable[[List[Op]], Op]:
    return lambda window: fused(deterministic=window[-1].default_params.get("deterministic", True))


def _joint(window: List[Op]) -> bool:
    return bool(window[0].default_params.get("joint_topk_topp", False))


DEFAULT_FUSION_RULES = (
    FusionRule((TemperatureOp, SoftmaxOp), lambda w: True,
               lambda w: FusedTemperatureSoftmaxOp(), 100),
    FusionRule((ProbsTopKOp, TopPOp, ProbsSampleOp), _joint,
               _keeps_determinism(FusedProbsTopKTopPSampleOp), 100),
    FusionRule((ProbsTopKOp, ProbsSampleOp), lambda w: True,
               _keeps_determinism(FusedProbsTopKSampleOp), 10),
    FusionRule((TopPOp, ProbsSampleOp), lambda w: True,
               _keeps_determinism(FusedProbsTopPSampleOp), 10),
    FusionRule((MinPOp, ProbsSampleOp), lambda w: True,
               _keeps_determinism(FusedProbsMinPSampleOp), 10),
)


def _one_softmax(ops: List[Op]) -> None:
    if sum(isinstance(op, SoftmaxOp) for op in ops) > 1:
        raise CompileError("a pipeline may hold one Softmax only")


def _indices_last(ops: List[Op]) -> None:
    for op, nxt in zip(ops, ops[1:]):
        if op.OUT == _I:
            raise CompileError(f"nothing may follow {type(op).__name__}, which outputs indices "
                               f"(found {type(nxt).__name__})")


class Compiler:
    """Type checks, validity checks and fusion of an operator list."""

    def __init__(self) -> None:
        self.fusion_rules: List[FusionRule] = []
        self.validity_checks: List[Callable[[List[Op]], None]] = [_one_softmax, _indices_last]
        for rule in DEFAULT_FUSION_RULES:
            self.register_fusion_rule(rule)

    def register_fusion_rule(self, rule: FusionRule) -> None:
        self.fusion_rules.append(rule)
        self.fusion_rules.sort(key=lambda r: -r.prio)

    def register_validity_check(self, check: Callable[[List[Op]], None]) -> None:
        self.validity_checks.append(check)

    def compile(self, ops: List[Op]) -> List[Op]:
        if not ops:
            raise CompileError("cannot compile an empty operator list")
        for prev, op in zip(ops, ops[1:]):
            if prev.OUT != op.IN:
                raise CompileError(f"{type(op).__name__} takes {op.IN}, but "
                                   f"{type(prev).__name__} outputs {prev.OUT}")
        for check in self.validity_checks:
            check(ops)
        return self._fuse(list(ops))

    def _fuse(self, ops: List[Op]) -> List[Op]:
        changed = True
        while changed:
            changed = False
            for rule in self.fusion_rules:
                n = len(rule.pattern)
                for i in range(len(ops) - n + 1):
                    window = ops[i:i + n]
                    if all(type(op) is cls for op, cls in zip(window, rule.pattern)) \
                            and rule.guard(window):
                        ops[i:i + n] = [rule.build(window)]
                        changed = True
                        break
                if changed:
                    break
        return ops


def compile_pipeline(ops: List[Op], custom_fusion_rules: Optional[List[FusionRule]] = None,
                     custom_validity_checks: Optional[List[Callable]] = None) -> List[Op]:
    """``ops`` checked and fused (the default rules and checks plus the custom ones)."""
    compiler = Compiler()
    for rule in custom_fusion_rules or ():
        compiler.register_fusion_rule(rule)
    for check in custom_validity_checks or ():
        compiler.register_validity_check(check)
    return compiler.compile(ops)


# --------------------------------------------------------------------------------------------
# the pipeline


class LogitsPipe:
    """A processing pipeline: ``LogitsPipe(processors, compile=True, input_type=None,
    custom_fusion_rules=None, custom_validity_checks=None)``, then ``pipe(x, **params)`` (x a
    tensor of the pipeline's input type, or a :class:`TaggedTensor`). A pipeline that cannot
    be built raises ``ValueError`` (with the legalization or compile error as its cause)."""

    def __init__(self, processors: List[LogitsProcessor], compile: bool = True,
                 input_type: Optional[TensorType] = None,
                 custom_fusion_rules: Optional[List[FusionRule]] = None,
                 custom_validity_checks: Optional[List[Callable]] = None):
        if not processors:
            raise ValueError("a pipeline needs at least one processor")
        self.processors = list(processors)
        try:
            self._initial_type = input_type or _infer_initial_type(self.processors)
            self.ops = legalize_processors(self.processors, self._initial_type)
            self.compiled_ops: Optional[List[Op]] = None
            if compile:
                self.compile(custom_fusion_rules, custom_validity_checks)
        except (LegalizationError, CompileError) as err:
            raise ValueError(f"pipeline creation failed: {err}") from err

    @property
    def initial_type(self) -> TensorType:
        return self._initial_type

    def compile(self, custom_fusion_rules: Optional[List[FusionRule]] = None,
                custom_validity_checks: Optional[List[Callable]] = None) -> None:
        self.compiled_ops = compile_pipeline(self.ops, custom_fusion_rules, custom_validity_checks)

    def __call__(self, x, **kwargs: Any) -> torch.Tensor:
        tagged = x if isinstance(x, TaggedTensor) else TaggedTensor(x, self._initial_type)
        for i, op in enumerate(self.compiled_ops if self.compiled_ops is not None else self.ops):
            try:
                tagged = op(tagged, **kwargs)
            except Exception as err:
                raise ValueError(f"operator {i} ({type(op).__name__}) failed: {err}") from err
        return tagged.data

    def __repr__(self) -> str:
        names = lambda items: " -> ".join(type(i).__name__ for i in items or ())  # noqa: E731
        return (f"LogitsPipe([{names(self.processors)}], ops=[{names(self.ops)}], "
                f"compiled_ops=[{names(self.compiled_ops)}])")
