"""Launch arithmetic, the device context and the fast launch path every Triton kernel function
here shares."""

from __future__ import annotations

import contextlib
import functools

import torch

from ... import envs
from ...kernel_pack import seed_for_device


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``): block sizes."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``: grid sizes."""
    return -(-a // b)


#: SM count assumed when the tensors are not on a GPU (an H200).
DEFAULT_SM_COUNT = 132


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (:data:`DEFAULT_SM_COUNT` off the GPU)."""
    if device.type == "cuda":
        return _cuda_sm_count(torch.cuda.current_device() if device.index is None else device.index)
    return DEFAULT_SM_COUNT


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_of(t: torch.Tensor):
    """A context that makes ``t``'s GPU current for a launch (Triton launches on the current
    device); a no-op on the CPU (the interpreter) and when it is current already."""
    if not t.is_cuda or t.get_device() == torch.cuda.current_device():
        return _NO_CONTEXT
    return torch.cuda.device(t.device)


_NO_CONTEXT = contextlib.nullcontext()


class FastKernel:
    """``fast(kernel)[grid](*args, **kwargs)``: a launch of the Triton ``kernel`` (a
    ``JITFunction``) with the same arguments and result as ``kernel[grid](...)``, at a fraction
    of its host cost in steady state.

    Triton's ``JITFunction.run`` does per-call bookkeeping beyond finding the compiled kernel:
    it reads its knobs, turns the options into a string for its cache key, checks the kernel's
    global values, builds a launch-metadata dict and calls its (empty) launch hook chains. Here
    the first launch of each specialization goes through ``kernel[grid]`` (which compiles or
    loads the kernel, from the kernel pack too) and the compiled kernel it returns is
    remembered under ``(device, Triton's own specialization of the arguments, the launch
    options)``; later launches with that key call the compiled kernel's launcher directly, on
    torch's current stream, as Triton does. The specialization comes from Triton's own binder
    (alignment and value classes of every argument), so a launch never reuses a kernel compiled
    for other argument properties.

    Before a launch goes through ``kernel[grid]`` (where Triton compiles or loads), Triton's
    cache is seeded from the shipped kernel pack once per device (:mod:`flashinfer.kernel_pack`),
    so every kernel launched here finds its packed build on the first call in a process.

    Triton's path is taken instead, every call: under the interpreter (``TRITON_INTERPRET=1``),
    with ``FLASHINFER_TRITON_FAST_LAUNCH=0``, while a launch hook is installed (profilers such as
    proton), and for good once this Triton lacks what the fast path reads (another version's
    internals: the first failing launch falls back and stays there). Our kernels read no mutable
    globals, the check Triton repeats per call.
    """

    __slots__ = ("kernel", "compiled")

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}

    def __getitem__(self, grid):
        if _FAST[0] is None:
            _FAST[0] = _fast_launch_available()
        if not _FAST[0]:
            if torch.cuda.is_initialized():
                seed_for_device(torch.device("cuda", torch.cuda.current_device()))
            return self.kernel[grid]
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        try:
            device = torch.cuda.current_device()
            binder = self.kernel.device_caches[device][4]
            bound, specialization, options = binder(*args, **kwargs)
            key = (device, tuple(specialization), tuple(options.items()))
            compiled = self.compiled.get(key)
            runtime = _TRITON_KNOBS.runtime
            if compiled is None or _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
                compiled = None
            else:
                launcher, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            result = self.kernel[grid](*args, **kwargs)  # raises if the arguments are what failed
            _FAST[0] = False  # else this Triton is not the one the fast path reads: its own path
            return result
        if compiled is None:
            seed_for_device(torch.device("cuda", device))
            compiled = self.kernel[grid](*args, **kwargs)
            if getattr(compiled, "function", None) is not None:
                self.compiled[key] = compiled
            return compiled
        if callable(grid):
            grid = grid(bound)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        launcher(grid[0], g1, g2, torch._C._cuda_getCurrentRawStream(device), function, metadata,
                 None, None, None, *bound.values())
        return compiled


def _hooked(hook) -> bool:
    """A launch hook is installed: a callable (older Triton), or a non-empty HookChain."""
    return hook is not None and getattr(hook, "calls", True) != []


_FAST: list = [None]  # None: not decided yet; then whether launches take the fast path
_TRITON_KNOBS = None


def _fast_launch_available() -> bool:
    global _TRITON_KNOBS
    if envs.TRITON_INTERPRET.get() or not envs.TRITON_FAST_LAUNCH.get():
        return False
    try:
        from triton import knobs
    except ImportError:  # a Triton before knobs (< 3.4): its own path
        return False
    _TRITON_KNOBS = knobs
    return hasattr(knobs, "runtime")


def fast(kernel) -> FastKernel:
    """The :class:`FastKernel` of a Triton ``kernel`` (one per kernel, made on first use; keyed
    by identity: a ``JITFunction`` hashes its source digest, and ours live as long as their
    modules)."""
    launcher = _FAST_KERNELS.get(id(kernel))
    if launcher is None:
        launcher = _FAST_KERNELS[id(kernel)] = FastKernel(kernel)
    return launcher


_FAST_KERNELS: dict[int, FastKernel] = {}
