"""GPU-time measurement shared by the benchmark runners (imported by script name: the runners
are run as ``python benchmarks/<name>.py``, which puts this folder on ``sys.path``)."""

from __future__ import annotations

import statistics
from typing import Callable

import torch


def cuda_events():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def graph_ms(sets: list, call: Callable, backend: str, iters: int,
             passthrough: tuple[type[BaseException], ...] = ()) -> float | None:
    """Per-call GPU time in ms: ``call(args, backend)`` for every ``args`` in ``sets`` captured
    once in a CUDA graph, then replayed (no host cost). ``None`` when the path cannot be
    captured (it synchronises with the host, reads host-side RNG state, ...); exceptions of the
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
    times = []
    for _ in range(iters):
        start, end = cuda_events()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(sets))
    del graph
    return statistics.median(times)
