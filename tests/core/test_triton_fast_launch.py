"""The Triton fast launch path (backends/triton/launch.py: FastKernel), against a stand-in kernel.

The stand-in has what the fast path reads of a Triton ``JITFunction`` (``device_caches`` with
its binder, ``kernel[grid](...)`` returning the compiled kernel) and of the compiled kernel
(``run``, ``function``, ``packed_metadata``), so every branch runs on CPU. The real kernels run
through it on the GPU in their own tests.
"""

from __future__ import annotations

import types

import pytest
import torch

from flashinfer.backends.triton import launch


class Compiled:
    def __init__(self, log):
        self.function, self.packed_metadata, self.log = "fn-handle", ("meta",), log

    def run(self, *args):
        self.log.append(("fast", args))


class StandIn:
    """A JITFunction-like kernel ``k(x_ptr, n, BLOCK: constexpr)``."""

    def __init__(self, binder=None):
        self.log: list = []
        self.compiles = 0
        self.device_caches = {0: (None, None, None, None, binder or self.binder)}

    @staticmethod
    def binder(x, n, BLOCK, **options):
        if not isinstance(x, torch.Tensor):
            raise TypeError("x must be a tensor")
        spec = [("*fp32", "D" if x.data_ptr() % 16 == 0 else None),
                ("i32", "1" if n == 1 else "D" if n % 16 == 0 else None), ("constexpr", BLOCK)]
        return {"x": x, "n": n, "BLOCK": BLOCK}, spec, options

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.binder(*args, **kwargs)  # what Triton checks first
            self.compiles += 1
            self.log.append(("jit", grid, args, kwargs))
            return Compiled(self.log)
        return run


@pytest.fixture
def fast_path(monkeypatch):
    """The fast path on, on a pretend GPU 0 with stream 77 and no launch hooks."""
    runtime = types.SimpleNamespace(launch_enter_hook=types.SimpleNamespace(calls=[]),
                                    launch_exit_hook=types.SimpleNamespace(calls=[]))
    monkeypatch.setattr(launch, "_FAST", [True])
    monkeypatch.setattr(launch, "_TRITON_KNOBS", types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 77, raising=False)
    return runtime


def test_first_launch_compiles_then_the_compiled_kernel_is_called_directly(fast_path):
    kernel, x = StandIn(), torch.randn(64)
    fk = launch.FastKernel(kernel)
    fk[(4,)](x, 32, BLOCK=16, num_warps=4)
    fk[(5, 2)](x, 48, BLOCK=16, num_warps=4)  # same specialization: n % 16 == 0 both times
    assert kernel.compiles == 1
    assert kernel.log[0][0] == "jit"
    assert kernel.log[1] == ("fast", (5, 2, 1, 77, "fn-handle", ("meta",), None, None, None,
                                      x, 48, 16))


def test_other_argument_properties_or_options_compile_their_own_kernel(fast_path):
    kernel, x = StandIn(), torch.randn(64)
    fk = launch.FastKernel(kernel)
    fk[(1,)](x, 32, BLOCK=16, num_warps=4)
    fk[(1,)](x, 1, BLOCK=16, num_warps=4)  # n == 1 is its own specialization
    fk[(1,)](x, 32, BLOCK=32, num_warps=4)  # another constexpr
    fk[(1,)](x, 32, BLOCK=16, num_warps=8)  # another launch option
    fk[(1,)](x[1:], 32, BLOCK=16, num_warps=4)  # a pointer no longer 16-byte aligned
    assert kernel.compiles == 5 and [e[0] for e in kernel.log] == ["jit"] * 5


def test_an_installed_launch_hook_takes_tritons_own_path(fast_path):
    kernel, x = StandIn(), torch.randn(64)
    fk = launch.FastKernel(kernel)
    fk[(1,)](x, 32, BLOCK=16)
    fast_path.launch_enter_hook.calls.append(print)
    fk[(1,)](x, 32, BLOCK=16)
    assert [e[0] for e in kernel.log] == ["jit", "jit"]


def test_a_triton_whose_internals_differ_falls_back_for_good(fast_path):
    def other_binder(*args, **kwargs):
        raise TypeError("another Triton's binder")

    kernel, x = StandIn(binder=other_binder), torch.randn(64)
    fk = launch.FastKernel(kernel)
    assert fk[(1,)](x, 32, BLOCK=16) is not None  # launched through Triton's path
    assert launch._FAST == [False]
    assert fk[(1,)] is not None and kernel.compiles == 1


def test_bad_arguments_raise_as_triton_raises_and_keep_the_fast_path(fast_path):
    fk = launch.FastKernel(StandIn())
    with pytest.raises(TypeError, match="x must be a tensor"):
        fk[(1,)]("not a tensor", 32, BLOCK=16)
    assert launch._FAST == [True]


def test_interpreter_and_the_switch_take_tritons_path(monkeypatch):
    monkeypatch.setattr(launch, "_FAST", [None])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = StandIn()
    launch.FastKernel(kernel)[(1,)](torch.randn(8), 1, BLOCK=8)
    assert launch._FAST == [False] and kernel.compiles == 1
    monkeypatch.setattr(launch, "_FAST", [None])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("FLASHINFER_TRITON_FAST_LAUNCH", "0")
    launch.FastKernel(kernel)[(1,)](torch.randn(8), 1, BLOCK=8)
    assert launch._FAST == [False] and kernel.compiles == 2


def test_one_fast_kernel_per_triton_kernel():
    kernel = StandIn()
    assert launch.fast(kernel) is launch.fast(kernel)
