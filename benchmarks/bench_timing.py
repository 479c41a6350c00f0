"""GPU-time measurement shared by the benchmark runners (imported by script name: the runners
are run as ``python benchmarks/<name>.py``, which puts this folder on ``sys.path``)."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def cuda_events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


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
    torch, ``..._short_...2111utc.json``). Such an untimed replay is not used: it doubles the
    back-to-back GPU time of a large point (two 0.75 ms fp8 8192^3 GEMMs), and the H200 read
    1,245-1,367 TFLOP/s there with it (``gemm_fp8_h200_2026-11-30_2115utc.json``, ``_2126utc``)
    against 1,480-1,492 without (``_2128utc``), for the direct cuBLASLt call as much as for ours."""
    first = {name: _replay_ms(graph, calls) for name, graph in graphs.items()}
    fastest = min(first.values(), default=0.0)
    long = {name for name, ms in first.items() if ms > LONG_GRAPH_RATIO * fastest}
    return {**_rounds_ms({n: g for n, g in graphs.items() if n not in long}, calls, iters),
            **_rounds_ms({n: g for n, g in graphs.items() if n in long}, calls, iters)}
