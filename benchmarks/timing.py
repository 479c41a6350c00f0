"""How the benchmark runners time a call (imported by script name: a runner run as
``python benchmarks/<family>.py`` has this folder on ``sys.path``).

On the GPU: CUDA events after warm-up, the median of ``iters`` repetitions, the inputs of a
call rotated across enough copies that one pass reads past the H200's 60 MB L2 (``copies``),
never zeros. Two figures per kernel where the call can be captured: ``gpu_ms`` replays the
rotated calls captured in a CUDA graph (the kernels alone, as an engine running under CUDA
graphs sees them) and ``eager_ms`` times back-to-back eager calls (host cost included where it
exceeds the GPU time); ``ms`` is ``gpu_ms`` where there is one, else ``eager_ms``. On the CPU:
``time.perf_counter`` around the same back-to-back calls.

Nothing here imports ``flashinfer``: the same helpers time upstream FlashInfer in its own
process.
"""

from __future__ import annotations

import collections
import contextlib
import math
import signal
import statistics
import threading
import time
from typing import Callable

import torch

#: the method in one line, for a run's header
METHOD = ("CUDA events after warm-up, median of the iterations; inputs rotated past the 60 MB L2; "
          "gpu_ms = CUDA-graph replay of the rotated calls, eager_ms = back-to-back eager calls, "
          "ms = gpu_ms where the call can be captured, else eager_ms; perf_counter on the CPU")
#: the H200's L2 is 60 MB; a pass over the rotated copies reads at least three times that
L2_BYTES = 60 * 2**20


def copies(nbytes: int, device: str, most: int = 64) -> int:
    """How many copies of a call's inputs to rotate through: enough that one pass over them
    reads 3x the L2 (at least 2, at most ``most``); 2 on the CPU."""
    if device != "cuda":
        return 2
    return max(2, min(most, math.ceil(3 * L2_BYTES / max(nbytes, 1))))


def cuda_events():
    """A (start, end) pair of timing CUDA events."""
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def eager_ms(step: Callable[[], object], iters: int, calls: int = 1, warmup: int = 0) -> float:
    """Per-call time in ms of ``step()``, which makes ``calls`` calls back to back: the median of
    ``iters`` timed steps after ``warmup`` untimed ones (CUDA events on a GPU machine,
    ``perf_counter`` on the CPU)."""
    for _ in range(warmup):
        step()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        if cuda:
            start, end = cuda_events()
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / calls)
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3 / calls)
    return statistics.median(times)


def kernel_ms(fn: Callable[[], object], reps: int = 5) -> dict[str, float]:
    """GPU time per call of each kernel ``fn()`` launches, in ms, by name (its first 40
    characters), from the torch profiler over ``reps`` calls after a warm one."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = collections.defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            times[evt.name[:40]] += evt.device_time / reps / 1e3
    return dict(times)


def host_ms(fn: Callable[[], object], n: int = 30, warmup: int = 3) -> float:
    """Host wall time in ms of ``fn()`` (e.g. a ``plan()``), the GPU idle before each call:
    median of ``n`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def capture(sets: list, call: Callable, backend: str,
            passthrough: tuple[type[BaseException], ...] = ()) -> "torch.cuda.CUDAGraph | None":
    """``call(args, backend)`` for every ``args`` in ``sets`` captured once in a CUDA graph
    (after one warm call on the capture stream); ``None`` when the path cannot be captured (it
    synchronises with the host, reads host-side RNG state, ...); exceptions of the
    ``passthrough`` types (a runner's deadline) propagate."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream):
            call(sets[0], backend)  # warm on the capture stream (workspaces, plans)
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for args in sets:
                    call(args, backend)
    except passthrough:
        raise
    except Exception:  # noqa: BLE001 - not capturable: the caller reports eager time only
        torch.cuda.synchronize()
        return None
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    return graph


def _replay_ms(graph, calls: int) -> float:
    start, end = cuda_events()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def graph_ms(sets: list, call: Callable, backend: str, iters: int,
             passthrough: tuple[type[BaseException], ...] = ()) -> float | None:
    """Per-call GPU time in ms of ``capture(...)``'s graph, median of ``iters`` replays (no host
    cost); ``None`` when the path cannot be captured."""
    graph = capture(sets, call, backend, passthrough)
    if graph is None:
        return None
    return statistics.median(_replay_ms(graph, len(sets)) for _ in range(iters))


#: graphs this many times slower than a point's fastest graph are timed in rounds of their own
LONG_GRAPH_RATIO = 4


def _rounds_ms(graphs: dict, calls: int, iters: int) -> dict:
    times: dict = {name: [] for name in graphs}
    for _ in range(iters):
        for name, graph in graphs.items():
            times[name].append(_replay_ms(graph, calls))
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_graph_ms(graphs: dict, calls: int, iters: int) -> dict:
    """Per-call GPU time in ms of each captured graph in ``graphs`` (name: graph of ``calls``
    calls), replayed in turn for ``iters`` rounds: clock ramp-up and power throttling within a
    point hit every backend alike instead of whichever is timed first or last.

    Graphs ``LONG_GRAPH_RATIO`` times slower than the fastest (torch's per-batch loop of
    bmm_fp8: 8,192 small launches, 24 ms) get rounds of their own: a graph replayed after that
    loop read up to 13 % slower on the H200, even when an untimed replay of its own came in
    between (cuDNN's W_UV graph at M = 1,024 37.0 against 33.0 us when it followed the loop as
    ``auto``; ``gemm_bmm_fp8_h200_2026-11-30_2109utc.json`` against the same grid without
    torch, ``gemm_bmm_fp8_short_h200_2026-11-30_2111utc.json``). Such an untimed replay is not
    used: it doubles the back-to-back GPU time of a large point (two 0.75 ms fp8 8192^3 GEMMs),
    and the H200 read 1,245-1,367 TFLOP/s there with it (``gemm_fp8_h200_2026-11-30_2115utc.json``,
    ``gemm_fp8_h200_2026-11-30_2126utc.json``) against 1,480-1,492 without
    (``gemm_fp8_h200_2026-11-30_2128utc.json``), for the direct cuBLASLt call as much as for ours."""
    first = {name: _replay_ms(graph, calls) for name, graph in graphs.items()}
    fastest = min(first.values(), default=0.0)
    long = {name for name, ms in first.items() if ms > LONG_GRAPH_RATIO * fastest}
    return {**_rounds_ms({n: g for n, g in graphs.items() if n not in long}, calls, iters),
            **_rounds_ms({n: g for n, g in graphs.items() if n in long}, calls, iters)}


def graph_and_eager_ms(sets: list, call: Callable, backend: str, iters: int,
                       passthrough: tuple[type[BaseException], ...] = ()) -> dict:
    """``{"ms", "gpu_ms", "eager_ms"}`` of ``call(args, backend)`` over the rotated ``sets``
    after two warm calls: ``gpu_ms`` from a CUDA graph (``None`` on the CPU or when the path
    cannot be captured), ``eager_ms`` back to back; ``ms`` the first of them that exists."""
    for i in range(2):
        call(sets[i % len(sets)], backend)
    gpu = graph_ms(sets, call, backend, iters, passthrough) if torch.cuda.is_available() else None

    def one_pass():
        for args in sets:
            call(args, backend)
    eager = eager_ms(one_pass, iters, calls=len(sets))
    return {"ms": gpu if gpu is not None else eager, "gpu_ms": gpu, "eager_ms": eager}


class CaseTimeout(Exception):
    """A (case, backend) ran past its deadline."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise ``CaseTimeout`` in the main thread after ``seconds`` (0: no deadline). Python-level:
    a hung kernel is not interrupted until it returns to the interpreter."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"exceeded {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(max(1, int(math.ceil(seconds))))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
