"""The layering contract: imports only run downward, and no module imports itself back.

Every import of every module of the package counts, at module level or inside a function, and
importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so it counts as importing
them too. A module may import modules of its own layer or of a lower one; within a layer the
imports must not form a cycle.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "flashinfer"

#: top to bottom; the first pattern a module matches gives its layer
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", ("flashinfer.cli", "flashinfer.__main__", "flashinfer.warmup",
                      "flashinfer.problems", "flashinfer.bench_command",
                      "flashinfer.cli_upstream")),
    ("public API", ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flashinfer.page",
                    "flashinfer.grouped_mm", "flashinfer.fp4_quantization", "flashinfer.gemm",
                    "flashinfer.sampling", "flashinfer.quantization", "flashinfer.fused_moe",
                    "flashinfer.norm", "flashinfer.rope", "flashinfer.activation",
                    "flashinfer.utils", "flashinfer.cudnn", "flashinfer.topk",
                    "flashinfer.logits_processor", "flashinfer.autotuner", "flashinfer.mla",
                    "flashinfer.cascade", "flashinfer.sparse", "flashinfer.pod",
                    "flashinfer.comm", "flashinfer.comm.*",
                    "flashinfer.triton", "flashinfer.triton.*",
                    "flashinfer.jit", "flashinfer.jit.*", "flashinfer.compilation_context")),
    ("family machinery", ("flashinfer.attention", "flashinfer.attention.*", "flashinfer.gemm.*",
                          "flashinfer.sampling.*", "flashinfer.quantization.*",
                          "flashinfer.fused_moe.*")),
    ("dispatcher", ("flashinfer.dispatch", "flashinfer.overrides", "flashinfer.api_logging",
                    "flashinfer.custom_op")),
    ("data", ("flashinfer.capability_db", "flashinfer.dispatch_rules")),
    ("backends", ("flashinfer.backends", "flashinfer.backends.*")),
    # what every backend's kernels receive; they live in family packages but sit below backends
    # (the attention package's own __init__ imports nothing, so the contracts can live in it)
    ("kernel contracts", ("flashinfer.attention", "flashinfer.attention.params",
                          "flashinfer.attention.batch_params", "flashinfer.attention.mla_params",
                          "flashinfer.attention.block_sparse_params",
                          "flashinfer.attention.page_rules", "flashinfer.fp4_format",
                          "flashinfer.rope_params",
                          "flashinfer.kernel_pack")),
    ("foundation", ("flashinfer.reasons", "flashinfer.device", "flashinfer.envs",
                    "flashinfer.index_checks", "flashinfer.aliasing", "flashinfer.backend_names",
                    "flashinfer.optional_packages", "flashinfer.shape_buckets",
                    "flashinfer.checked_calls",
                    "flashinfer.op_catalog")),
]
CONTRACTS = dict(LAYERS)["kernel contracts"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    if module in CONTRACTS:  # before the family patterns that would also match it
        return [name for name, _ in LAYERS].index("kernel contracts")
    for i, (_, patterns) in enumerate(LAYERS):
        if any(module == p or fnmatch(module, p) for p in patterns):
            return i
    raise AssertionError(f"module {module} is in no layer of tests/core/test_layering.py")


def _imports(module: str, path: Path) -> set[str]:
    """Every package module ``module`` imports, with the packages whose ``__init__`` runs."""
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - node.level + 1]
                root = ".".join(prefix + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            targets = [root] + [f"{root}.{a.name}" for a in node.names]
        for name in targets:
            if not name.startswith("flashinfer"):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                candidate = ".".join(parts[:i])
                if candidate in MODULES and candidate != module:
                    found.add(candidate)
    # importing a package's submodule from inside the package does not re-run its own __init__
    return {m for m in found if not module.startswith(m + ".")}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downward(module):
    mine = layer_of(module)
    upward = sorted(f"{t} ({LAYERS[layer_of(t)][0]})" for t in GRAPH[module]
                    if layer_of(t) < mine)
    assert not upward, (f"{module} ({LAYERS[mine][0]}) imports upward: "
                        + ", ".join(upward))


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles[:5])
