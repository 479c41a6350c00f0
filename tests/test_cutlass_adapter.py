"""The CUTLASS adapter (backends/cutlass.py): the cuda-python legacy-name aliases on fake
cuda-bindings 13 packages, the layout and shape checks, the decisions on simulated SMs, the
disk-cache location; ``gpu`` (with nvidia-cutlass installed): mm_bf16 against a float64 matmul
for both layouts of ``b``, and the kernels loaded from the disk cache by a fresh process."""

import os
import subprocess
import sys
import time
import types

import pytest
import torch

from flashinfer.backends import cutlass
from flashinfer.capability_db import import_error
from flashinfer.device import simulated
from flashinfer.dispatch import Problem, select

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]


def _fake_cuda_bindings(monkeypatch, with_legacy: bool):
    """A ``cuda`` namespace with ``cuda.bindings`` 13-style submodules (and, optionally, the
    legacy ``cuda.cuda`` etc.), installed in ``sys.modules`` for one test."""
    cuda = types.ModuleType("cuda")
    cuda.__path__ = []
    bindings = types.ModuleType("cuda.bindings")
    bindings.__path__ = []
    bindings.__version__ = "13.0.3"
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    for sub in ("driver", "runtime", "nvrtc"):
        module = types.ModuleType(f"cuda.bindings.{sub}")
        module.which = sub
        monkeypatch.setitem(sys.modules, f"cuda.bindings.{sub}", module)
    for legacy in ("cuda", "cudart", "nvrtc"):
        name = f"cuda.{legacy}"
        # setitem first, so that the teardown restores the real entry (or its absence) and
        # drops the aliases the test makes
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        if not with_legacy:
            monkeypatch.delitem(sys.modules, name)
    return cuda


def test_aliases_map_the_legacy_names_onto_cuda_bindings_13(monkeypatch):
    cuda = _fake_cuda_bindings(monkeypatch, with_legacy=False)
    made = cutlass.alias_legacy_cuda_modules()
    assert sys.modules["cuda.cuda"].which == "driver"
    assert sys.modules["cuda.cudart"].which == "runtime"
    assert sys.modules["cuda.nvrtc"].which == "nvrtc"
    assert cuda.cudart is sys.modules["cuda.cudart"] and cuda.__version__ == "13.0.3"
    assert len(made) == 4
    assert cutlass.alias_legacy_cuda_modules() == []  # idempotent


def test_aliases_leave_a_legacy_cuda_python_alone(monkeypatch):
    cuda = _fake_cuda_bindings(monkeypatch, with_legacy=True)
    cuda.__version__ = "12.8.0"
    legacy = sys.modules["cuda.cudart"]
    assert cutlass.alias_legacy_cuda_modules() == []
    assert sys.modules["cuda.cudart"] is legacy and cuda.__version__ == "12.8.0"


def test_aliases_without_cuda_python_do_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)  # "import cuda" raises ImportError
    assert cutlass.alias_legacy_cuda_modules() == []


def test_the_fakes_leave_no_alias_behind():
    """The alias tests above ran in this process: the real modules (or none) are back."""
    for name in ("cuda.cuda", "cuda.cudart", "cuda.nvrtc"):
        module = sys.modules.get(name)
        assert module is None or not hasattr(module, "which"), name


def test_b_layout_reads_the_strides():
    w = torch.randn(48, 32)  # [n, k] weight
    assert cutlass.b_layout(w.t().contiguous()) == "row"
    assert cutlass.b_layout(w.t()) == "column"  # upstream's transposed weight
    assert cutlass.b_layout(torch.randn(32, 96)[:, ::2]) is None  # strided: copied first


def test_cache_file_follows_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path))
    assert cutlass.cache_file() == os.path.join(str(tmp_path), "cutlass", "compiled_cache.db")


def _mm_bf16(sm, features=(), **shape):
    facts = {"m": 16, "n": 8192, "k": 8192, **shape}
    return Problem.make("mm_bf16", simulated(sm),
                        dtypes={"a": "bfloat16", "b": "bfloat16", "out": "bfloat16"},
                        shape=facts, features=features)


def _cutlass_reasons(decision):
    return {r.field for c in decision.candidates if c.name == "cutlass" for r in c.reasons}


@pytest.mark.parametrize("sm", SMS)
def test_mm_bf16_decisions(sm):
    decision = select(_mm_bf16(sm), assume_installed=True)
    reasons = _cutlass_reasons(decision)
    if sm in ("8.0", "8.6", "8.9", "9.0"):
        assert decision.backend == "torch" and "cutlass" in decision.order
        assert decision.order.index("cutlass") > decision.order.index("cudnn")
        assert not reasons
    else:
        assert "cutlass" not in decision.order and "sm" in reasons


def test_mm_bf16_checks_alignment_and_bias():
    assert "shape.n" in _cutlass_reasons(select(_mm_bf16("9.0", n=8190), assume_installed=True))
    assert "shape.k" in _cutlass_reasons(select(_mm_bf16("9.0", k=100), assume_installed=True))
    with_bias = select(_mm_bf16("9.0", features=("bias",)), assume_installed=True)
    assert "cutlass" not in with_bias.order


# ------------------------------------------------------------------------------------------
# GPU

needs_cutlass = pytest.mark.skipif(import_error("cutlass_cppgen") is not None,
                                   reason="nvidia-cutlass (cutlass_cppgen) is not installed")


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("layout", cutlass.B_LAYOUTS)
@pytest.mark.parametrize("m", [1, 7, 128])
def test_gpu_mm_bf16_matches_float64(layout, m):
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(40 + m)
    k, n = 520, 264  # multiples of 8, not of the tiles
    a = torch.randn(m, k, generator=g).bfloat16().cuda()
    w = torch.randn(n, k, generator=g).bfloat16().cuda()
    b = w.t() if layout == "column" else w.t().contiguous()
    assert cutlass.b_layout(b) == layout
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    flashinfer.mm_bf16(a, b, out=out, backend="cutlass")
    want = a.double() @ b.double()
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=1e-1)


@pytest.mark.gpu
@needs_cutlass
def test_gpu_strided_b_is_copied_first():
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(7)
    a = torch.randn(16, 64, generator=g).bfloat16().cuda()
    b = torch.randn(64, 96, generator=g).bfloat16().cuda()[:, ::2]  # neither layout
    out = torch.full((16, 48), float("nan"), dtype=torch.bfloat16, device="cuda")
    flashinfer.mm_bf16(a, b, out=out, backend="cutlass")
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=2e-2, atol=1e-1)


@pytest.mark.gpu
@needs_cutlass
def test_gpu_a_fresh_process_loads_the_kernels_from_disk(tmp_path):
    """``flashinfer warmup --cutlass`` in one process (compiles, or loads), then in another:
    the second finds both kernels on disk (no nvcc), and neither leaves a file in its working
    directory. (Kernels a first call compiled on demand were not always found by a process
    whose first call had another shape: on the H200 a fresh process recompiled them, so the
    warm-up is the documented way.)"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    warm = [sys.executable, "-m", "flashinfer", "warmup", "--cutlass", "--json"]
    first = subprocess.run(warm, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    started = time.perf_counter()
    second = subprocess.run(warm, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert time.perf_counter() - started < 30  # nvcc takes about a minute per kernel
    assert list(tmp_path.iterdir()) == []


def _fake_cache(path, rows: int) -> str:
    """A cutlass_cppgen cache file with ``rows`` kernels named "gemm"."""
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE compiled_operations(op_key TEXT NOT NULL UNIQUE, cubin BLOB "
               "NOT NULL, hostbin BLOB NOT NULL, op_name TEXT NOT NULL, op_attrs TEXT NOT NULL)")
    for i in range(rows):
        db.execute("INSERT INTO compiled_operations VALUES (?, ?, ?, ?, ?)",
                   (f"k{i}", b"x", b"y", "gemm", "{}"))
    db.commit()
    db.close()
    return str(path)


def test_an_empty_cutlass_cache_is_removed_a_filled_one_kept(tmp_path):
    empty, filled = _fake_cache(tmp_path / "empty.db", 0), _fake_cache(tmp_path / "filled.db", 2)
    other = tmp_path / "notes.db"
    other.write_text("not sqlite")
    assert cutlass.remove_if_empty_cache(empty) and not os.path.exists(empty)
    assert not cutlass.remove_if_empty_cache(filled) and os.path.exists(filled)
    assert not cutlass.remove_if_empty_cache(str(other)) and other.exists()
    assert not cutlass.remove_if_empty_cache(str(tmp_path / "absent.db"))


def test_show_config_names_the_compiled_kernels(tmp_path, monkeypatch):
    from flashinfer import cli

    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path))
    assert "none yet" in cutlass.describe_cache()
    os.makedirs(tmp_path / "cutlass")
    _fake_cache(cutlass.cache_file(), 2)
    assert cutlass.describe_cache().endswith(": 2 kernel(s): gemm, gemm")
    assert cli.config_data()["cutlass_kernels"] == cutlass.describe_cache()
