"""Static check of the @triton.jit modules (``backends/triton/_*_kernels.py``): a module
level number a kernel reads must be a ``tl.constexpr``. Triton 3.6 (the H200's) refuses any
other global at compile time, while the interpreter the CPU suite runs accepts it, so only this
check catches it without a GPU."""

import ast
from pathlib import Path

import pytest

import flashinfer.backends.triton as triton_kernels

MODULES = sorted(Path(triton_kernels.__file__).parent.glob("_*_kernels.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_module_level_numbers_are_constexpr(path):
    tree = ast.parse(path.read_text())
    plain = [node.targets[0].id for node in tree.body
             if isinstance(node, ast.Assign) and len(node.targets) == 1
             and isinstance(node.targets[0], ast.Name)
             and isinstance(node.value, (ast.Constant, ast.UnaryOp, ast.BinOp))]
    assert not plain, f"{path.name}: wrap {plain} in tl.constexpr(...) for @triton.jit code"
