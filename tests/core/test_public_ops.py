"""The public-function table (``op_catalog.PUBLIC_FUNCTIONS``) stays true to the code.

Three ways it could drift, one test each: a name in it that is not importable or names an op,
feature, dtype role or layout the catalog lacks; a public function added to a module's
``__all__`` without a row (or a place in ``NOT_DISPATCHED``); an op the source dispatches that no
public function reaches. A fourth test runs a sample of public functions on small CPU inputs
and checks that the Problems they build are the ops and features their row states.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

import flashinfer
from flashinfer.op_catalog import NOT_DISPATCHED, OPS, PUBLIC_FUNCTIONS

PACKAGE = Path(flashinfer.__file__).resolve().parent

#: upstream's public modules (api-spec.md) that this package has
PUBLIC_MODULES = ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flashinfer.page",
                  "flashinfer.gemm", "flashinfer.grouped_mm", "flashinfer.sampling",
                  "flashinfer.quantization", "flashinfer.fp4_quantization", "flashinfer.fused_moe",
                  "flashinfer.norm", "flashinfer.rope", "flashinfer.activation")

#: modules whose names the top-level package re-exports as this library's own API (the
#: dispatcher, overrides, error checks): not upstream functions, so not in the table
FACADE_MODULES = ("flashinfer.dispatch", "flashinfer.overrides", "flashinfer.index_checks")


def _public_callables() -> dict[str, str]:
    """Every public function and wrapper class of the public modules: name -> a module."""
    found = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if getattr(obj, "__module__", "").startswith(FACADE_MODULES):
                continue
            if inspect.isfunction(obj) or (inspect.isclass(obj) and name.endswith("Wrapper")):
                found.setdefault(name, module_name)
    return found


@pytest.mark.parametrize("name", sorted(PUBLIC_FUNCTIONS))
def test_each_row_is_importable_and_names_catalog_entries(name):
    row = PUBLIC_FUNCTIONS[name]
    assert row.name == name
    assert callable(getattr(importlib.import_module(row.module), name))
    if hasattr(flashinfer, name):  # the top-level re-export is the same object
        assert getattr(flashinfer, name) is getattr(importlib.import_module(row.module), name)
    assert row.ops and all(op in OPS for op in row.ops), row.ops
    specs = [OPS[op] for op in row.ops]
    for feature in row.features:
        assert any(feature in spec.features for spec in specs), feature
    for role, dtype in row.dtypes:
        assert any(role in spec.dtype_roles for spec in specs), role
        assert isinstance(getattr(torch, dtype), torch.dtype)
    assert row.layout is None or all(row.layout in spec.layouts for spec in specs)


@pytest.mark.parametrize("name", sorted(NOT_DISPATCHED))
def test_each_undispatched_name_is_importable_and_not_in_the_table(name):
    assert callable(getattr(importlib.import_module(NOT_DISPATCHED[name]), name))
    assert name not in PUBLIC_FUNCTIONS


def test_every_public_function_is_in_the_table_or_declared_undispatched():
    missing = {name: module for name, module in _public_callables().items()
               if name not in PUBLIC_FUNCTIONS and name not in NOT_DISPATCHED}
    assert not missing, (f"public functions with no row in op_catalog.PUBLIC_FUNCTIONS (or "
                         f"NOT_DISPATCHED if they dispatch nothing): {missing}")


def test_every_op_the_source_dispatches_is_reached_by_a_public_function():
    """The op names the package passes to ``Problem.make`` (a literal first argument), sets as
    a wrapper's ``_op`` or passes to the single-request attention body (``run_single``)."""
    pattern = re.compile(r'(?:Problem\.make\(\s*|_op = |run_single\()"(\w+)"')
    dispatched = {op for path in PACKAGE.rglob("*.py") if path.name != "problems.py"
                  for op in pattern.findall(path.read_text())}
    assert dispatched <= set(OPS), dispatched - set(OPS)
    assert {"single_decode", "batch_decode", "rmsnorm", "bmm_fp8"} <= dispatched  # the grep works
    reached = {op for row in PUBLIC_FUNCTIONS.values() for op in row.ops}
    assert dispatched <= reached, f"ops no public function names: {dispatched - reached}"


# --------------------------------------------------------------------------------------------
# the rows against what the calls do (CPU, tiny inputs)


def _x(*shape, dtype=torch.float16):
    return torch.randn(*shape, generator=_GEN).to(dtype)


_GEN = torch.Generator().manual_seed(0)
_PROBS = torch.softmax(torch.randn(2, 64, generator=_GEN), -1)
_LOGITS = torch.randn(2, 64, generator=_GEN)
_POS = torch.arange(4, dtype=torch.int32)
S = flashinfer.sampling

CALLS = {
    "rmsnorm": lambda: flashinfer.rmsnorm(_x(4, 64), _x(64)),
    "fused_add_rmsnorm": lambda: flashinfer.fused_add_rmsnorm(_x(4, 64), _x(4, 64), _x(64)),
    "gemma_rmsnorm": lambda: flashinfer.gemma_rmsnorm(_x(4, 64), _x(64)),
    "gemma_fused_add_rmsnorm":
        lambda: flashinfer.gemma_fused_add_rmsnorm(_x(4, 64), _x(4, 64), _x(64)),
    "silu_and_mul": lambda: flashinfer.silu_and_mul(_x(4, 64)),
    "gelu_tanh_and_mul": lambda: flashinfer.gelu_tanh_and_mul(_x(4, 64)),
    "apply_rope_pos_ids": lambda: flashinfer.apply_rope_pos_ids(_x(4, 2, 64), _x(4, 1, 64), _POS),
    "apply_llama31_rope_pos_ids_inplace":
        lambda: flashinfer.apply_llama31_rope_pos_ids_inplace(_x(4, 2, 64), _x(4, 1, 64), _POS),
    "single_decode_with_kv_cache":
        lambda: flashinfer.single_decode_with_kv_cache(_x(4, 64), _x(8, 2, 64), _x(8, 2, 64)),
    "single_prefill_with_kv_cache_return_lse":
        lambda: flashinfer.single_prefill_with_kv_cache_return_lse(_x(3, 4, 64), _x(8, 2, 64),
                                                                   _x(8, 2, 64)),
    "sampling_from_probs": lambda: S.sampling_from_probs(_PROBS),
    "top_p_sampling_from_probs": lambda: S.top_p_sampling_from_probs(_PROBS, 0.9),
    "top_k_sampling_from_probs": lambda: S.top_k_sampling_from_probs(_PROBS, 5),
    "min_p_sampling_from_probs": lambda: S.min_p_sampling_from_probs(_PROBS, 0.1),
    "top_k_top_p_sampling_from_probs": lambda: S.top_k_top_p_sampling_from_probs(_PROBS, 5, 0.9),
    "top_k_top_p_sampling_from_logits":
        lambda: S.top_k_top_p_sampling_from_logits(_LOGITS, 5, 0.9),
    "top_p_renorm_probs": lambda: S.top_p_renorm_probs(_PROBS, 0.9),
    "top_k_renorm_probs": lambda: S.top_k_renorm_probs(_PROBS, 5),
    "top_k_mask_logits": lambda: S.top_k_mask_logits(_LOGITS, 5),
    "softmax": lambda: S.softmax(_LOGITS),
    "mm_bf16": lambda: flashinfer.mm_bf16(_x(4, 32, dtype=torch.bfloat16),
                                          _x(32, 16, dtype=torch.bfloat16)),
    "mm_fp8": lambda: flashinfer.mm_fp8(_x(4, 32, dtype=torch.float8_e4m3fn),
                                        _x(16, 32, dtype=torch.float8_e4m3fn)),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_builds_the_problems_its_row_states(name):
    row = PUBLIC_FUNCTIONS[name]
    with flashinfer.record_decisions() as log:
        CALLS[name]()
    assert [d.problem.op for d in log] == list(row.ops)
    for decision in log:
        assert set(row.features) & set(OPS[decision.problem.op].features) <= decision.problem.features
