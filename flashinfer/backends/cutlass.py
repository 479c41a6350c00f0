"""cutlass adapter: dense bf16 GEMM through CUTLASS's Python interface (nvidia-cutlass, module
``cutlass_cppgen``), compiled kernels kept on disk; CUTLASS FP4 declared only.

``mm_bf16``: ``out [m, n] = a [m, k] @ b [k, n]``, bf16 in, bf16 out, fp32 accumulation, ``b``
row-major or column-major (upstream passes the transposed ``[n, k]`` weight). One
``cutlass_cppgen.op.Gemm`` per (``b`` layout, device): CUTLASS emits the kernel for the device's
SM (TMA warp-specialised on SM 9.0) and compiles it with nvcc. Rules the check enforces: ``k`` and
``n`` multiples of 8 (16-byte rows, so every shape uses the same alignment-8 kernel: two kernels
in all), no bias.

Where it stands: on the H200 cuBLAS (torch) and cuDNN's matmul are faster (CUTLASS's default
tile reaches 0.2-0.85x cuBLAS's GPU time, and cutlass_cppgen's ``run()`` costs about 1 ms of host
time per call; ``dispatch_rules/mm_bf16.toml``), so ``auto`` only reaches CUTLASS where both
are missing; it is a second vendor kernel to cross-check against and to force
(``backend="cutlass"``). It is capturable in a CUDA graph, which removes the host time.

Three things this adapter handles for the user:

* **cuda-bindings 13.** cutlass_cppgen 4.2 imports ``cuda.cuda``, ``cuda.cudart`` and
  ``cuda.nvrtc`` (and reads ``cuda.__version__``), the layout of cuda-python before 13;
  cuda-bindings 13 ships the same APIs as ``cuda.bindings.driver`` / ``.runtime`` / ``.nvrtc``.
  :func:`alias_legacy_cuda_modules` registers the old names for the new modules, only where the
  old ones do not import.
* **No nvcc wait on a request.** A kernel compiles in about 60 s; cutlass_cppgen keeps compiled
  kernels in an sqlite file, which :func:`_cutlass` points at ``$FLASHINFER_CACHE_DIR/cutlass/``
  so every later process loads them in milliseconds. ``flashinfer warmup --cutlass`` compiles
  both kernels ahead of time (:func:`compile_all`); a call that finds none compiles it once and
  logs that it does. On the H200 the warm-up's kernels were found by every later process, but
  kernels a first call compiled on demand were not always found by a process whose first call
  had another shape (it compiled again): warm up before serving.
* **Streams.** Launches go on torch's current stream and never synchronise (cutlass_cppgen's
  ``run()`` defaults to stream 0 and a device synchronisation).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sqlite3
import sys
import tempfile
import threading
import time
import types

import torch

from .. import envs
from ..reasons import Reason
from . import KernelTable

KERNELS = KernelTable("cutlass")
_LOG = logging.getLogger("flashinfer.cutlass")
_LOCK = threading.Lock()
_PLANS: dict[tuple, object] = {}
#: the layouts of ``b`` one kernel each serves (``mm_bf16``)
B_LAYOUTS = ("row", "column")
_ALIGN = 8  # bf16 elements in 16 bytes


# ------------------------------------------------------------------------------------------
# cuda-python names and the package


def alias_legacy_cuda_modules() -> list[str]:
    """Make ``cuda.cuda`` / ``cuda.cudart`` / ``cuda.nvrtc`` importable on cuda-bindings >= 13
    (``cuda.bindings.driver`` / ``.runtime`` / ``.nvrtc``) and give the ``cuda`` package the
    ``__version__`` cutlass_cppgen checks against nvcc. Returns the aliases made (none where
    the legacy modules import, or where cuda-bindings is missing)."""
    made = []
    try:
        cuda = importlib.import_module("cuda")
        bindings = importlib.import_module("cuda.bindings")
    except ImportError:
        return made
    for legacy, current in (("cuda", "driver"), ("cudart", "runtime"), ("nvrtc", "nvrtc")):
        name = f"cuda.{legacy}"
        try:
            importlib.import_module(name)
            continue
        except ImportError:
            pass
        module = importlib.import_module(f"cuda.bindings.{current}")
        sys.modules[name] = module
        setattr(cuda, legacy, module)
        made.append(f"{name} -> cuda.bindings.{current}")
    if not isinstance(getattr(cuda, "__version__", None), str):
        cuda.__version__ = getattr(bindings, "__version__", "13.0.0")
        made.append(f"cuda.__version__ = {cuda.__version__}")
    return made


def cache_file() -> str:
    """Where compiled CUTLASS kernels live (cutlass_cppgen's sqlite cache)."""
    return os.path.join(envs.CACHE_DIR.get(), "cutlass", "compiled_cache.db")


def _cutlass() -> types.ModuleType:
    """cutlass_cppgen, importable on cuda-bindings 13, caching compiled kernels on disk and
    keeping its files out of the working directory.

    cutlass_cppgen creates ``compiled_cache.db`` in the working directory on import and writes
    its nvcc sources and host libraries there (it sets ``tempfile.tempdir = "./"``): the cache
    file moves to :func:`cache_file` (its table created there), the empty one the import made
    is removed (:func:`remove_if_empty_cache`: the import may come from the capability check
    before this function runs), and the compiler module gets a ``tempfile`` of its own whose
    temporary files go to the cache directory (the process-wide ``tempfile`` is left alone)."""
    aliases = alias_legacy_cuda_modules()
    if aliases:
        _LOG.debug("cuda-python legacy names: %s", ", ".join(aliases))
    cutlass = importlib.import_module("cutlass_cppgen")
    compiler = importlib.import_module("cutlass_cppgen.backend.compiler")
    path = cache_file()
    if compiler.CACHE_FILE != path:
        remove_if_empty_cache(os.path.abspath(compiler.CACHE_FILE))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.closing(sqlite3.connect(path)) as db:  # the table its import makes
            db.execute("CREATE TABLE IF NOT EXISTS compiled_operations(op_key TEXT NOT NULL "
                       "UNIQUE, cubin BLOB NOT NULL, hostbin BLOB NOT NULL, op_name TEXT NOT "
                       "NULL, op_attrs TEXT NOT NULL)")
            db.commit()
        compiler.CACHE_FILE = path  # the module reads its global at every lookup
        compiler.tempfile = types.SimpleNamespace(
            tempdir=None, NamedTemporaryFile=functools.partial(
                tempfile.NamedTemporaryFile, dir=os.path.dirname(path)))
    return cutlass


def describe_cache() -> str:
    """One line for ``flashinfer show-config``: the disk cache and how many kernels it holds
    (read with sqlite, without importing cutlass_cppgen)."""
    path = cache_file()
    if not os.path.isfile(path):
        return f"{path}: none yet (`flashinfer warmup --cutlass` compiles them)"
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT op_name FROM compiled_operations").fetchall()
    except sqlite3.Error as exc:
        return f"{path}: unreadable ({exc})"
    return f"{path}: {len(rows)} kernel(s)" + (f": {', '.join(sorted(r[0] for r in rows))}"
                                               if rows else "")


def remove_if_empty_cache(path: str) -> bool:
    """Delete ``path`` when it is a cutlass_cppgen cache holding no kernel (what its import
    leaves in the working directory); True when deleted. A cache with kernels stays."""
    if not os.path.isfile(path):
        return False
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT COUNT(*) FROM compiled_operations").fetchone()[0]
    except sqlite3.Error:
        return False  # not a cutlass cache: not ours to touch
    if rows:
        return False
    os.remove(path)
    return True


# ------------------------------------------------------------------------------------------
# mm_bf16


def b_layout(b: torch.Tensor) -> str | None:
    """``"row"`` (``b`` row-major), ``"column"`` (``b.t()`` row-major, upstream's weight) or None
    (other strides: copied to row-major first)."""
    if b.stride(1) == 1 and (b.stride(0) == b.shape[1] or b.shape[0] == 1):
        return "row"
    if b.stride(0) == 1 and (b.stride(1) == b.shape[0] or b.shape[1] == 1):
        return "column"
    return None


def _plan(layout: str, device: torch.device):
    """The Gemm object of one ``b`` layout on ``device`` (built once per process)."""
    key = (layout, device)
    plan = _PLANS.get(key)
    if plan is None:
        with _LOCK:
            plan = _PLANS.get(key)
            if plan is None:
                cutlass = _cutlass()
                b_major = (cutlass.LayoutType.RowMajor if layout == "row"
                           else cutlass.LayoutType.ColumnMajor)
                with torch.cuda.device(device):
                    plan = cutlass.op.Gemm(
                        element=cutlass.DataType.bf16, element_accumulator=cutlass.DataType.f32,
                        layout_A=cutlass.LayoutType.RowMajor, layout_B=b_major,
                        layout_C=cutlass.LayoutType.RowMajor)
                _PLANS[key] = plan
    return plan


def _launch(plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    driver = importlib.import_module("cuda.cuda")
    stream = driver.CUstream(torch.cuda.current_stream(a.device).cuda_stream)
    with torch.cuda.device(a.device):
        started = time.perf_counter()
        plan.run(a, b, out, out, alpha=1.0, beta=0.0, sync=False, stream=stream)
        seconds = time.perf_counter() - started
    if seconds > 1.0:  # it compiled (kept in cache_file() for later processes)
        _LOG.warning("cutlass mm_bf16: compiled a kernel in %.0f s (kept in %s); run "
                     "`flashinfer warmup --cutlass` ahead of serving", seconds, cache_file())


@KERNELS.kernel("mm_bf16")
def mm_bf16(a: torch.Tensor, b: torch.Tensor, bias, out: torch.Tensor) -> None:
    """``out = a @ b``: bf16, fp32 accumulation (the check keeps bias and misaligned shapes
    away)."""
    a = a if a.is_contiguous() else a.contiguous()
    layout = b_layout(b)
    if layout is None:
        b, layout = b.contiguous(), "row"
    # out: contiguous (gemm.py checks). The column-major kernel reads b's storage as [n, k]
    # row-major: CUTLASS takes the [k, n] shape with its column-major layout
    _launch(_plan(layout, a.device), a, b, out)


@KERNELS.check("mm_bf16")
def _mm_bf16_reasons(problem) -> list[Reason]:
    shape = dict(problem.shape)
    reasons = []
    for dim in ("k", "n"):
        value = shape.get(dim)
        if isinstance(value, int) and value % _ALIGN:
            reasons.append(Reason(f"shape.{dim}", value, f"a multiple of {_ALIGN}",
                                  "the CUTLASS kernels here are built for 16-byte rows"))
    return reasons


def compile_all(device: torch.device | str = "cuda") -> list[dict]:
    """Compile (or load from :func:`cache_file`) the kernel of every ``b`` layout on ``device``
    by one small GEMM each, checked against torch; ``[{"layout", "seconds", "ok"}]``."""
    device = torch.device(device)
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(64, 256, device=device, generator=gen).bfloat16()
    w = torch.randn(128, 256, device=device, generator=gen).bfloat16()
    for layout in B_LAYOUTS:
        b = w.t() if layout == "column" else w.t().contiguous()
        out = torch.full((64, 128), float("nan"), device=device, dtype=torch.bfloat16)
        started = time.perf_counter()
        mm_bf16(a, b, None, out)
        torch.cuda.synchronize(device)
        want = (a.float() @ b.float()).bfloat16()
        rows.append({"layout": layout, "seconds": time.perf_counter() - started,
                     "ok": bool(torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-1))})
    return rows


# ------------------------------------------------------------------------------------------
# FP4: declared only


@KERNELS.kernel("mm_fp4")
def mm_fp4(a, b, a_sf, b_sf, alpha, block_size, a_sf_8x4, out) -> None:
    """Declared (capability record, ``verified = false``), not wired: refused."""
    raise RuntimeError("the CUTLASS native FP4 GEMM is declared but not wired into this library "
                       "(no native FP4 adapter here); use backend='torch' or 'reference'")


@KERNELS.check("mm_fp4")
def _fp4_not_wired(problem) -> list[Reason]:
    """Never chosen: the record documents what upstream's CUTLASS FP4 GEMM serves (explain shows
    it), but no call into a native FP4 kernel exists yet."""
    return [Reason("adapter", "not wired", "a tested native FP4 GEMM call",
                   "no native FP4 adapter here: the CUTLASS block-scaled FP4 GEMM is declared "
                   "only, not written and tested against the reference")]
