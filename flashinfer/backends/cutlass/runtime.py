"""CUTLASS's Python interface (nvidia-cutlass, module ``cutlass_cppgen``) made fit for serving:
importable on cuda-bindings 13, compiled kernels on disk, launches without per-call code
generation.

* **cuda-bindings 13.** cutlass_cppgen 4.2 imports ``cuda.cuda``, ``cuda.cudart`` and
  ``cuda.nvrtc`` (and reads ``cuda.__version__``), the layout of cuda-python before 13;
  cuda-bindings 13 ships the same APIs as ``cuda.bindings.driver`` / ``.runtime`` / ``.nvrtc``.
  :func:`alias_legacy_cuda_modules` registers the old names for the new modules, only where the
  old ones do not import.
* **nvcc.** cutlass_cppgen finds nvcc through ``PATH`` only; :func:`cutlass` also looks in
  ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin`` and ``/usr/local/cuda/bin``. Without any nvcc, kernels
  already in the disk cache still load; a missing one raises :class:`KernelNotCompiled`.
* **Disk cache.** A kernel compiles in about a minute. cutlass_cppgen keeps compiled kernels in
  an sqlite file keyed by the emitted C++ source, which :func:`cutlass` points at
  :func:`cache_file` (``$FLASHINFER_CACHE_DIR/cutlass/``). A :class:`KernelSpec` fixes the
  whole kernel (dtypes, layouts, alignments, tile), never the shape of a call, so the kernel a
  warm-up compiled is the one every later call and process looks up.
* **Launch cost.** ``Gemm.run()`` emits the kernel's C++ source again on every call to look it
  up (about 1 ms of host time). :func:`operation` builds and loads each kernel once per process;
  :func:`launch` then only packs the arguments (cutlass_cppgen's ``GemmArguments``: the
  compiled host function builds the kernel's parameters) and launches on torch's current
  stream, without synchronising.
* **``-m`` in ``sys.argv``.** ``cutlass_library`` skips importing its ``generator`` submodule
  when ``sys.argv`` holds ``-m`` (meant for ``python -m cutlass_library.generator``), and
  cutlass_cppgen then fails listing kernels; ``pytest -m gpu`` has that argument, so
  :func:`cutlass` imports the submodule itself.
* **Files.** cutlass_cppgen creates ``compiled_cache.db`` in the working directory on import and
  writes its nvcc sources and host libraries there; the empty file is removed and the compiler
  writes into the cache directory instead.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import types

import torch

from ... import envs

_LOG = logging.getLogger("flashinfer.cutlass")
_LOCK = threading.Lock()
_OPERATIONS: dict[tuple, object] = {}
_BYTES = {"bf16": 2, "f16": 2, "e4m3": 1, "e5m2": 1}
_NVCC_DIRS = ("CUDA_HOME", "CUDA_PATH")


class KernelNotCompiled(RuntimeError):
    """A kernel is not in the disk cache and this machine has no nvcc to compile it."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One CUTLASS GEMM kernel: ``D = A @ B`` with ``A`` row-major, fp32 accumulation.

    ``a``, ``b``, ``out``: cutlass DataType names (``"bf16"``, ``"f16"``, ``"e4m3"``,
    ``"e5m2"``); ``b_layout``: ``"row"`` (``B [k, n]`` row-major) or ``"column"`` (``B.T``
    row-major, the ``[n, k]`` weight); ``scaled``: the epilogue multiplies by two fp32 scalars
    read from device memory (``D = A @ B * scale_a * scale_b``), else it is plain ``D = A @ B``.
    Every operand is 16-byte aligned (the alignments below), so one kernel serves every shape
    whose rows are whole 16-byte units."""

    a: str
    b: str
    out: str
    b_layout: str
    scaled: bool = False

    def alignment(self, operand: str) -> int:
        """Elements per 16 bytes of ``operand`` (``"a"``, ``"b"``, ``"out"``)."""
        return 16 // _BYTES[getattr(self, operand)]

    @property
    def label(self) -> str:
        scaled = ", scaled" if self.scaled else ""
        return f"{self.a} x {self.b} -> {self.out}, b {self.b_layout}-major{scaled}"


# ------------------------------------------------------------------------------------------
# the package


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


def find_nvcc() -> str | None:
    """nvcc on ``PATH``, else under ``$CUDA_HOME``, ``$CUDA_PATH`` or ``/usr/local/cuda``."""
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get(name) for name in _NVCC_DIRS] + ["/usr/local/cuda"]
    for root in filter(None, roots):
        path = os.path.join(root, "bin", "nvcc")
        if os.access(path, os.X_OK):
            return path
    return None


def _point_at_nvcc(package: types.ModuleType) -> None:
    """Tell cutlass_cppgen where nvcc is (it runs ``which nvcc`` and ``nvcc --version``): the
    install path and version of :func:`find_nvcc`'s nvcc, or, with none, the version of the
    cuda bindings and a nominal install path, so that cached kernels load (compiling then
    raises KernelNotCompiled)."""
    if getattr(package, "_NVCC_VERSION", None) is not None:
        return
    nvcc = find_nvcc()
    if nvcc is None:
        # it builds include paths from the install path before every cache lookup
        package._NVCC_VERSION = importlib.import_module("cuda").__version__
        package._CUDA_INSTALL_PATH = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        return
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    package._NVCC_VERSION = text.split(" release ")[-1].split(",")[0]
    package._CUDA_INSTALL_PATH = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def cutlass() -> types.ModuleType:
    """cutlass_cppgen, importable on cuda-bindings 13, pointed at nvcc, caching compiled
    kernels in :func:`cache_file` and keeping its files out of the working directory.

    The empty ``compiled_cache.db`` its import leaves in the working directory is removed
    (:func:`remove_if_empty_cache`: the import may come from the capability check before this
    function runs); the compiler module gets a ``tempfile`` of its own whose temporary files go
    to the cache directory (the process-wide ``tempfile`` is left alone)."""
    aliases = alias_legacy_cuda_modules()
    if aliases:
        _LOG.debug("cuda-python legacy names: %s", ", ".join(aliases))
    importlib.import_module("cutlass_library.generator")  # skipped by its package under -m
    package = importlib.import_module("cutlass_cppgen")
    _point_at_nvcc(package)
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
    return package


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
# kernels


# The ``scaled`` epilogue, traced by cutlass_cppgen's EVT frontend, which parses the source of
# the function (so it has no docstring: every constant must be a number). Both scales are
# scalars broadcast from device pointers.
def scaled_epilogue(accum, scale_a, scale_b):
    D = accum * scale_a * scale_b
    return D


def _construct(spec: KernelSpec):
    """The (not yet compiled) GemmOperationUniversal of ``spec`` for the current device: the
    first tile CUTLASS lists for the dtypes and alignments, without fp8 fast accumulation."""
    package = cutlass()
    dtype, layout = package.DataType, package.LayoutType
    out = getattr(dtype, spec.out)
    plan = package.op.Gemm(
        element_A=getattr(dtype, spec.a), element_B=getattr(dtype, spec.b), element_C=out,
        element_D=out, element_accumulator=dtype.f32, layout_A=layout.RowMajor,
        layout_B=layout.RowMajor if spec.b_layout == "row" else layout.ColumnMajor,
        layout_C=layout.RowMajor)
    if spec.scaled:
        torch_out = {"bf16": torch.bfloat16, "f16": torch.float16}[spec.out]
        # rank 3 (batched) and no stride of 0 or 1 but the unit one: cutlass_cppgen types the
        # output's runtime strides after these tensors (:class:`_ScaledArguments` sets them)
        examples = {"accum": torch.empty(2, 16, 16, dtype=torch.float32), "scale_a": 1.0,
                    "scale_b": 1.0, "D": torch.empty(2, 16, 16, dtype=torch_out)}
        plan.epilogue_visitor = package.epilogue.trace(scaled_epilogue, examples)
    aligned = [spec.alignment("a"), spec.alignment("b"), spec.alignment("out")]
    datatypes = importlib.import_module("cutlass_cppgen.utils.datatypes")
    tiles = [datatypes.td_from_profiler_op(op) for op in plan.possible_operations.operations(
        *aligned, package.MathOperation.multiply_add)]
    tiles = [t for t in tiles if "FastAccum" not in str(t.kernel_schedule)] or tiles
    if not tiles:
        raise RuntimeError(f"CUTLASS lists no kernel for {spec.label} on this device")
    return plan.construct(tiles[0], *aligned)


def _load_or_compile(spec: KernelSpec, op, on_request: bool = True) -> float:
    """Load ``op``'s kernel from the disk cache or compile it (seconds taken); a compile for a
    request (``on_request``, not the warm-up) is logged as a warning."""
    compiler = importlib.import_module("cutlass_cppgen.backend").compiler
    started = time.perf_counter()
    try:
        compiler.add_module([op])
    except Exception as exc:  # noqa: BLE001 - cutlass raises bare Exceptions for a missing nvcc
        if find_nvcc() is None:
            raise KernelNotCompiled(
                f"the CUTLASS kernel {spec.label} is not in {cache_file()} and no nvcc was "
                f"found to compile it: run `flashinfer warmup --cutlass` where nvcc is, with "
                f"the same FLASHINFER_CACHE_DIR") from exc
        raise
    seconds = time.perf_counter() - started
    if seconds > 1.0 and on_request:
        _LOG.warning("cutlass: compiled %s in %.0f s (kept in %s); run `flashinfer warmup "
                     "--cutlass` ahead of serving", spec.label, seconds, cache_file())
    return seconds


def operation(spec: KernelSpec, device: torch.device):
    """The loaded kernel of ``spec`` on ``device``, built once per process."""
    key = (spec, device)
    op = _OPERATIONS.get(key)
    if op is None:
        with _LOCK:
            op = _OPERATIONS.get(key)
            if op is None:
                with torch.cuda.device(device):
                    op = _construct(spec)
                    _load_or_compile(spec, op)
                _OPERATIONS[key] = op
    return op


def compile_many(specs, device: torch.device, workers: int | None = None) -> dict:
    """Load or compile every kernel of ``specs`` on ``device``, nvcc runs in parallel (one
    thread each, up to ``workers``); ``{spec: seconds}``."""
    cutlass()  # the cuda.cuda alias below, on cuda-bindings 13
    driver = importlib.import_module("cuda.cuda")
    with torch.cuda.device(device):
        torch.zeros(1, device=device)  # torch's (primary) context, current in this thread
        _, context = driver.cuCtxGetCurrent()
        built = {spec: _construct(spec) for spec in specs if (spec, device) not in _OPERATIONS}

    def one(item):
        spec, op = item
        driver.cuCtxSetCurrent(context)  # modules load into torch's context
        return spec, _load_or_compile(spec, op, on_request=False)

    seconds = {spec: 0.0 for spec in specs}
    with concurrent.futures.ThreadPoolExecutor(workers or max(1, len(built))) as pool:
        for spec, took in pool.map(one, built.items()):
            seconds[spec] = took
    with _LOCK:
        for spec, op in built.items():
            _OPERATIONS.setdefault((spec, device), op)
    return seconds


@functools.cache
def _scaled_arguments():
    """cutlass_cppgen's GemmArguments for a kernel with an EVT epilogue, except that the output
    strides are the call's: cutlass_cppgen fills them from the tensors the epilogue was traced
    with (``(16, 1, 256)``, see :func:`_construct`), and passes the ones it computes for the call
    only to kernels with the default epilogue."""
    gemm = importlib.import_module("cutlass_cppgen.backend.gemm_operation")

    class _ScaledArguments(gemm.GemmArguments3x):
        def __init__(self, d_stride: tuple[int, int, int], *args, **kwargs):
            self.d_stride = d_stride  # (n, 1, m * n): row, column, batch
            super().__init__(*args, **kwargs)

        def get_arguments(self):
            arguments = super().get_arguments()
            arg_d = arguments.epilogue.arg_D  # a view into ``arguments``
            arg_d.stride_D = type(arg_d.stride_D)(self.d_stride)
            return arguments

    return _ScaledArguments


def launch(spec: KernelSpec, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
           scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """``out[i] = a[i] @ b[i]`` (times both ``scales`` for a scaled spec) on torch's current
    stream. ``a [batch, m, k]`` row-major, ``b [batch, k, n]`` in ``spec.b_layout``, ``out
    [batch, m, n]`` row-major, each packed (batch stride = one matrix) and 16-byte aligned;
    the scales fp32 one-element device tensors. The caller checks all of that."""
    op = operation(spec, a.device)
    gemm = importlib.import_module("cutlass_cppgen.backend.gemm_operation")
    library = importlib.import_module("cutlass_library")
    shape = importlib.import_module("cutlass_cppgen.shape")
    driver = importlib.import_module("cuda.cuda")
    batch, m, k = a.shape
    n = b.shape[-1]
    kwargs = {"stream": driver.CUstream(torch.cuda.current_stream(a.device).cuda_stream)}
    if batch == 1:
        mode = library.GemmUniversalMode.Gemm
        kwargs["split_k_slices"] = 1
    else:
        mode = library.GemmUniversalMode.Batched
        kwargs["batch"] = batch
        kwargs["batch_strides"] = {"A": m * k, "B": k * n, "C": m * n, "D": m * n}
    if spec.scaled:
        output_op = op.epilogue_type({"scale_a": scales[0], "scale_b": scales[1], "D": out})
    else:
        output_op = op.epilogue_type(1.0, 0.0)
    make = (functools.partial(_scaled_arguments(), (n, 1, m * n)) if spec.scaled
            else gemm.GemmArguments)
    with torch.cuda.device(a.device):
        arguments = make(operation=op, problem_size=shape.GemmCoord(m, n, k), A=a, B=b, C=out,
                         D=out, output_op=output_op, gemm_mode=mode, **kwargs)
        if getattr(arguments, "workspace_buffer", None) is not None:
            raise RuntimeError(f"the CUTLASS kernel {spec.label} asked for a device workspace "
                               "(cutlass_cppgen allocates it per call); not supported here")
        op.run(arguments)
