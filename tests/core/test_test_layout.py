"""The layout of tests/ (tests/conftest.py's docstring states it): every test file lies in a
family folder, none at the top level but conftest.py; no ``__init__.py`` and unique base names
(pytest's default import mode imports each file by its base name); no test module imports
another (shared helpers live in conftest.py or the family's helper modules)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FAMILIES = {"activation", "attention", "comm", "core", "gemm", "moe", "norm", "quantization", "rope",
            "sampling"}
FILES = sorted(TESTS.rglob("*.py"))
TEST_MODULES = {p.stem for p in FILES if p.name.startswith("test_")}


def imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports, at module level or in a function
    (a relative import counts as its dots)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or "").split(".")[0])
    return found


def test_every_file_is_in_a_family_folder():
    misplaced = [str(p.relative_to(TESTS)) for p in FILES
                 if p.relative_to(TESTS).parts[:-1] not in [(), *((f,) for f in FAMILIES)]
                 or (p.parent == TESTS and p.name != "conftest.py")]
    assert not misplaced, f"not in a family folder ({sorted(FAMILIES)}): {misplaced}"


def test_no_init_files_and_unique_base_names():
    assert not [p for p in FILES if p.name == "__init__.py"]
    names = [p.name for p in FILES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_no_test_module_imports_another():
    found = {str(p.relative_to(TESTS)): sorted(m for m in imported_modules(p)
                                               if m in TEST_MODULES or m.startswith("."))
             for p in FILES}
    offenders = {path: modules for path, modules in found.items() if modules}
    assert not offenders, f"test modules imported (move the helper to a helper module): {offenders}"


def test_the_import_check_sees_imports():
    here = imported_modules(Path(__file__))
    assert {"ast", "pathlib"} <= here and not here & TEST_MODULES
    assert "conftest" in imported_modules(TESTS / "sampling" / "test_triton_sampling.py")
