"""Host cost of the ways plan() can bounds-check page ids that live on the device.

    python benchmarks/probe_page_check.py [--reps 2000] [--work-us 150]

For each way: ``start`` (queued early in plan()) and ``resolve`` (at its end, after
``--work-us`` of host work that stands for the rest of plan()), host times in microseconds,
median over ``--reps``, with the GPU idle before each start (plan() in a serving loop that
synchronised). Ways:

- ``pinned copy``: the ids copied into pinned memory, one event, a numpy uint32 max on the host;
- ``aminmax out``: ``torch.aminmax`` into a two-int device buffer, its 8 bytes copied to pinned
  memory, one event;
- ``amax uint32``: ``torch.amax`` of the ids seen as uint32 (a negative id is above every valid
  one) into one int, 4 bytes copied (skipped where torch lacks the uint32 reduction);
- ``aminmax stack``: ``aminmax``, ``torch.stack`` of its two results, 8 bytes copied.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


class PinnedCopy:
    def __init__(self, n):
        self.host = torch.empty(n, dtype=torch.int32, pin_memory=True)
        self.host_np = self.host.numpy()
        self.event = torch.cuda.Event()

    def start(self, ids, stream):
        self.host.copy_(ids, non_blocking=True)
        self.event.record(stream)

    def resolve(self):
        self.event.synchronize()
        return int(self.host_np.view(np.uint32).max())


class AminmaxOut:
    def __init__(self, n):
        self.dev = torch.empty(2, dtype=torch.int32, device="cuda")
        self.lo, self.hi = self.dev[0], self.dev[1]
        self.host = torch.empty(2, dtype=torch.int32, pin_memory=True)
        self.event = torch.cuda.Event()

    def start(self, ids, stream):
        torch.aminmax(ids, out=(self.lo, self.hi))
        self.host.copy_(self.dev, non_blocking=True)
        self.event.record(stream)

    def resolve(self):
        self.event.synchronize()
        lo, hi = self.host.tolist()
        return hi if lo >= 0 else -1


class AmaxUint32:
    def __init__(self, n):
        self.dev = torch.empty((), dtype=torch.uint32, device="cuda")
        self.host = torch.empty((), dtype=torch.uint32, pin_memory=True)
        self.event = torch.cuda.Event()

    def start(self, ids, stream):
        torch.amax(ids.view(torch.uint32), dim=0, out=self.dev)
        self.host.copy_(self.dev, non_blocking=True)
        self.event.record(stream)

    def resolve(self):
        self.event.synchronize()
        return int(self.host.view(torch.int32).item())


class AminmaxStack:
    def __init__(self, n):
        self.host = torch.empty(2, dtype=torch.int32, pin_memory=True)
        self.event = torch.cuda.Event()

    def start(self, ids, stream):
        lo, hi = torch.aminmax(ids)
        self.host.copy_(torch.stack((lo, hi)), non_blocking=True)
        self.event.record(stream)

    def resolve(self):
        self.event.synchronize()
        lo, hi = self.host.tolist()
        return hi if lo >= 0 else -1


WAYS = {"pinned copy": PinnedCopy, "aminmax out": AminmaxOut, "amax uint32": AmaxUint32,
        "aminmax stack": AminmaxStack}


def spin(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--work-us", type=float, default=150.0)
    args = ap.parse_args()
    stream = torch.cuda.current_stream()
    print(f"{'ids':>6s} {'way':14s} {'start us':>9s} {'resolve us':>11s} {'sum us':>7s}")
    for n in (16384, 65536):
        ids = torch.randperm(n, device="cuda", dtype=torch.int64).to(torch.int32)
        for name, make in WAYS.items():
            try:
                way = make(n)
                way.start(ids, stream)
                assert way.resolve() == n - 1, name
            except (RuntimeError, NotImplementedError, TypeError) as err:
                print(f"{n:6d} {name:14s} not available: {str(err).splitlines()[0][:80]}")
                continue
            starts, resolves = [], []
            for _ in range(args.reps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                way.start(ids, stream)
                t1 = time.perf_counter()
                spin(args.work_us)
                t2 = time.perf_counter()
                way.resolve()
                t3 = time.perf_counter()
                starts.append(t1 - t0)
                resolves.append(t3 - t2)
            s, r = statistics.median(starts) * 1e6, statistics.median(resolves) * 1e6
            print(f"{n:6d} {name:14s} {s:9.1f} {r:11.1f} {s + r:7.1f}")


if __name__ == "__main__":
    main()
