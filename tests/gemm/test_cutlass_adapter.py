"""The CUTLASS adapter (backends/cutlass/): the cuda-python legacy-name aliases on fake
cuda-bindings 13 packages, nvcc lookup, the layout and shape checks, the decisions on simulated
SMs, the disk-cache location; ``gpu`` (with nvidia-cutlass installed): mm_bf16 and bmm_fp8 /
mm_fp8 against float64 matmuls (layouts, misaligned pointers, batches), CUDA-graph replay, and
the kernels loaded from the disk cache by a fresh process."""

import os
import subprocess
import sys
import time
import types

import pytest
import torch

from flashinfer.backends import cutlass
from flashinfer.backends.cutlass import runtime
from flashinfer.optional_packages import import_error
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
    made = runtime.alias_legacy_cuda_modules()
    assert sys.modules["cuda.cuda"].which == "driver"
    assert sys.modules["cuda.cudart"].which == "runtime"
    assert sys.modules["cuda.nvrtc"].which == "nvrtc"
    assert cuda.cudart is sys.modules["cuda.cudart"] and cuda.__version__ == "13.0.3"
    assert len(made) == 4
    assert runtime.alias_legacy_cuda_modules() == []  # idempotent


def test_aliases_leave_a_legacy_cuda_python_alone(monkeypatch):
    cuda = _fake_cuda_bindings(monkeypatch, with_legacy=True)
    cuda.__version__ = "12.8.0"
    legacy = sys.modules["cuda.cudart"]
    assert runtime.alias_legacy_cuda_modules() == []
    assert sys.modules["cuda.cudart"] is legacy and cuda.__version__ == "12.8.0"


def test_aliases_without_cuda_python_do_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)  # "import cuda" raises ImportError
    assert runtime.alias_legacy_cuda_modules() == []


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
    assert runtime.cache_file() == os.path.join(str(tmp_path), "cutlass", "compiled_cache.db")


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


def _bmm_fp8(sm, a="float8_e4m3fn", b="float8_e4m3fn", out="bfloat16", **shape):
    facts = {"batch": 16, "m": 64, "n": 512, "k": 128, **shape}
    return Problem.make("bmm_fp8", simulated(sm), dtypes={"a": a, "b": b, "out": out},
                        shape=facts)


@pytest.mark.parametrize("sm", SMS)
def test_bmm_fp8_decisions(sm):
    decision = select(_bmm_fp8(sm), assume_installed=True)
    if sm == "9.0":
        assert "cutlass" in decision.order and not _cutlass_reasons(decision)
        assert decision.order.index("cutlass") > decision.order.index("cudnn")
    else:
        assert "cutlass" not in decision.order and "sm" in _cutlass_reasons(decision)


@pytest.mark.parametrize("facts, field", [
    ({"a": "float8_e5m2"}, "dtype.a"), ({"b": "float8_e5m2"}, "dtype.b"), ({"k": 136}, "k"),
    ({"n": 516}, "n")])
def test_bmm_fp8_record_names_what_it_refuses(facts, field):
    decision = select(_bmm_fp8("9.0", **facts), assume_installed=True)
    assert "cutlass" not in decision.order and field in _cutlass_reasons(decision)


def test_kernel_specs_cover_16_byte_rows():
    assert cutlass.MM_BF16["row"].alignment("a") == 8
    fp8 = cutlass.BMM_FP8[torch.float16]
    assert (fp8.alignment("a"), fp8.alignment("b"), fp8.alignment("out")) == (16, 16, 8)
    assert fp8.scaled and fp8.b_layout == "column" and "f16" in fp8.label
    assert len(set(cutlass.ALL_SPECS)) == len(cutlass.ALL_SPECS) == 4


@pytest.mark.parametrize("sm, names", [((7, 5), set()), ((8, 0), {"bf16"}), ((8, 9), {"bf16"}),
                                       ((9, 0), {"bf16", "e4m3"}), ((10, 0), set())])
def test_the_warm_up_compiles_what_the_records_admit(sm, names):
    """An SM 8.x warm-up does not try the fp8 kernels (their record: SM 9.0 only)."""
    from flashinfer.warmup import cutlass_specs

    assert {spec.a for spec in cutlass_specs(sm)} == names


def test_nvcc_is_found_outside_path(monkeypatch, tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert runtime.find_nvcc() == str(nvcc)
    package = types.SimpleNamespace(_NVCC_VERSION=None)
    runtime._point_at_nvcc(package)
    assert package._NVCC_VERSION == "13.0"
    assert package._CUDA_INSTALL_PATH == str(tmp_path / "cuda")


def test_without_nvcc_cached_kernels_still_load(monkeypatch, tmp_path):
    """No nvcc anywhere: cutlass_cppgen is told the cuda bindings' version (it would run
    ``nvcc --version`` and fail), so kernels in the disk cache load."""
    cuda = _fake_cuda_bindings(monkeypatch, with_legacy=False)
    cuda.__version__ = "13.0.2"
    monkeypatch.setenv("PATH", str(tmp_path))
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime.os, "access", lambda path, mode: False)
    assert runtime.find_nvcc() is None
    package = types.SimpleNamespace(_NVCC_VERSION=None)
    runtime._point_at_nvcc(package)
    assert package._NVCC_VERSION == "13.0.2" and package._CUDA_INSTALL_PATH


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


def _fp8(shape, gen, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(torch.float8_e4m3fn).cuda()


def _bmm_fp8_want(A, B, sa, sb):
    return (A.double() @ B.double()) * (sa.double() * sb.double())


@pytest.mark.gpu
@needs_cutlass
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("m", [1, 7, 128])
def test_gpu_bmm_fp8_matches_float64(m, batch, out_dtype):
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(100 + m + batch)
    k, n = 272, 200  # multiples of 16 / 8, not of the tiles
    A = _fp8((batch, m, k), g)
    B = _fp8((batch, n, k), g).transpose(1, 2)  # column-major, upstream's layout
    sa, sb = torch.tensor([0.75], device="cuda"), torch.tensor([1.5], device="cuda")
    out = torch.full((batch, m, n), float("nan"), dtype=out_dtype, device="cuda")
    flashinfer.bmm_fp8(A, B, sa, sb, out_dtype, out=out, backend="cutlass")
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), _bmm_fp8_want(A, B, sa, sb), rtol=2e-2, atol=1e-1)


@pytest.mark.gpu
@needs_cutlass
def test_gpu_bmm_fp8_copies_row_major_b_and_misaligned_operands():
    """A row-major B (fp8 tensor cores read K-major operands), an A and an out that start 1
    element past a 16-byte boundary: copied in, written back."""
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(11)
    batch, m, k, n = 2, 33, 64, 48
    A = _fp8((batch * m * k + 1,), g)[1:].view(batch, m, k)
    B = _fp8((batch, k, n), g)  # row-major
    sa, sb = torch.tensor([2.0], device="cuda"), torch.tensor([0.5], device="cuda")
    flat = torch.full((batch * m * n + 1,), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = flat[1:].view(batch, m, n)
    assert A.data_ptr() % 16 and out.data_ptr() % 16
    flashinfer.bmm_fp8(A, B, sa, sb, torch.bfloat16, out=out, backend="cutlass")
    assert not out.isnan().any() and flat[:1].isnan().all()
    torch.testing.assert_close(out.double(), _bmm_fp8_want(A, B, sa, sb), rtol=2e-2, atol=1e-1)


@pytest.mark.gpu
@needs_cutlass
def test_gpu_mm_fp8_with_alpha_goes_through_the_batched_kernel():
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(12)
    a, b = _fp8((24, 128), g), _fp8((96, 128), g)
    alpha = torch.tensor([0.3], device="cuda")
    out = flashinfer.mm_fp8(a, b, alpha, torch.bfloat16, backend="cutlass")
    want = (a.double() @ b.double().t()) * 0.3
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=1e-1)


@pytest.mark.gpu
@needs_cutlass
def test_gpu_bmm_fp8_replays_in_a_cuda_graph_with_new_contents():
    """Captured once; new operands and new scale values written into the captured tensors
    reach the replay (the scales are read on the device, never baked in)."""
    import flashinfer

    g = torch.Generator(device="cpu").manual_seed(13)
    batch, m, k, n = 4, 16, 128, 64
    A, Bt = _fp8((batch, m, k), g), _fp8((batch, n, k), g)
    sa, sb = torch.tensor([1.0], device="cuda"), torch.tensor([1.0], device="cuda")
    out = torch.empty(batch, m, n, dtype=torch.bfloat16, device="cuda")
    run = lambda: flashinfer.bmm_fp8(A, Bt.transpose(1, 2), sa, sb, torch.bfloat16, out=out,
                                     backend="cutlass")
    run()  # loads the kernel outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    A.copy_(_fp8((batch, m, k), g))
    Bt.copy_(_fp8((batch, n, k), g))
    sa.fill_(0.5)
    sb.fill_(3.0)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    want = _bmm_fp8_want(A, Bt.transpose(1, 2), sa, sb)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=1e-1)


_FRESH_CALLS = """
import time, torch, flashinfer
started = time.perf_counter()
a = torch.randn(5, 72, device="cuda").bfloat16()
b = torch.randn(56, 72, device="cuda").bfloat16()
flashinfer.mm_bf16(a, b.t(), backend="cutlass")
flashinfer.mm_bf16(a, b.t().contiguous(), backend="cutlass")
A = torch.randn(2, 9, 48, device="cuda").to(torch.float8_e4m3fn)
B = torch.randn(2, 40, 48, device="cuda").to(torch.float8_e4m3fn).transpose(1, 2)
one = torch.ones(1, device="cuda")
for dtype in (torch.bfloat16, torch.float16):
    flashinfer.bmm_fp8(A, B, one, one, dtype, backend="cutlass")
torch.cuda.synchronize()
print(f"seconds {time.perf_counter() - started:.1f}")
"""


@pytest.mark.gpu
@needs_cutlass
def test_gpu_a_fresh_process_loads_the_kernels_from_disk(tmp_path):
    """``flashinfer warmup --cutlass`` in one process (compiles, or loads), then calls of other
    shapes in another: every kernel is found on disk (a kernel spec never depends on a call's
    shape; nvcc takes about a minute a kernel), and neither process leaves a file in its
    working directory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    warm = [sys.executable, "-m", "flashinfer", "warmup", "--cutlass", "--json"]
    first = subprocess.run(warm, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    started = time.perf_counter()
    second = subprocess.run([sys.executable, "-c", _FRESH_CALLS], capture_output=True,
                            text=True, timeout=400, cwd=tmp_path, env=env)
    took = time.perf_counter() - started
    assert second.returncode == 0, second.stderr[-2000:]
    assert "compiled" not in second.stderr, second.stderr[-2000:]
    # one nvcc compile takes 40-65 s on the H200; loading four kernels a few seconds
    assert took < 40, f"the fresh process took {took:.0f} s: {second.stderr[-2000:]}"
    assert list(tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())


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
    assert runtime.remove_if_empty_cache(empty) and not os.path.exists(empty)
    assert not runtime.remove_if_empty_cache(filled) and os.path.exists(filled)
    assert not runtime.remove_if_empty_cache(str(other)) and other.exists()
    assert not runtime.remove_if_empty_cache(str(tmp_path / "absent.db"))


def test_show_config_names_the_compiled_kernels(tmp_path, monkeypatch):
    from flashinfer import cli

    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path))
    assert "none yet" in runtime.describe_cache()
    os.makedirs(tmp_path / "cutlass")
    _fake_cache(runtime.cache_file(), 2)
    assert runtime.describe_cache().endswith(": 2 kernel(s): gemm, gemm")
    assert cli.config_data()["cutlass_kernels"] == runtime.describe_cache()
