"""Benchmark of the foundation ops: every backend that can run each case, `auto`, and the reference.

    python benchmarks/bench_foundation.py --out benchmarks/results/foundation_h200.json

For each case (shapes in CASES below) the runner calls the public API with ``backend="auto"``
and with every kernel the capability database declares for the op (``backend="<name>:<variant>"``);
a kernel that cannot run is recorded with its first reason. Timing: CUDA events after warm-up,
median of ``--iters`` runs, inputs rotated across enough copies to exceed the 60 MB L2, never on
zeros. Two times per kernel: ``gpu_ms`` replays the calls captured in a CUDA graph (the kernels
alone, as a serving engine running under CUDA graphs sees them) and ``eager_ms`` times
back-to-back eager calls (host overhead included where it exceeds the GPU time). ``ms`` is
``gpu_ms`` where the path can be captured, else ``eager_ms``. Each point reports time, achieved bandwidth (bytes that must move) or FLOP rate, the
ceiling used (measured on the H200: 4.1 TB/s copy, 774 TFLOP/s bf16 matmul), and auto's choice.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
from typing import Callable

import torch

from bench_timing import cuda_events, graph_ms

import flashinfer
from flashinfer.capability_db import database
from flashinfer.dispatch import NoBackendError

CEIL_BW = 4.1e12  # bytes/s, device copy (read + write) measured on the H200
CEIL_BF16 = 774e12  # FLOP/s, bf16 matmul measured on the H200
L2_BYTES = 60 * 2**20

# (op, case name, builder kwargs)
CASES = [
    ("single_decode", "decode kv4096 hq32 hkv8 d128 NHD", dict(kv=4096, hq=32, hkv=8, d=128, layout="NHD")),
    ("single_decode", "decode kv32768 hq32 hkv8 d128 NHD", dict(kv=32768, hq=32, hkv=8, d=128, layout="NHD")),
    ("single_decode", "decode kv32768 hq32 hkv8 d128 HND", dict(kv=32768, hq=32, hkv=8, d=128, layout="HND")),
    ("single_prefill", "prefill causal 1024 hq32 hkv8 d128", dict(qo=1024, kv=1024, hq=32, hkv=8, d=128, causal=True)),
    ("single_prefill", "prefill causal 4096 hq32 hkv8 d128", dict(qo=4096, kv=4096, hq=32, hkv=8, d=128, causal=True)),
    ("single_prefill", "prefill causal 8192 hq32 hkv32 d128", dict(qo=8192, kv=8192, hq=32, hkv=32, d=128, causal=True)),
    ("single_prefill", "append 256 on kv4096 causal hq32 hkv8 d128", dict(qo=256, kv=4096, hq=32, hkv=8, d=128, causal=True)),
    ("rmsnorm", "rmsnorm 1x4096", dict(rows=1, hidden=4096)),
    ("rmsnorm", "rmsnorm 4096x4096", dict(rows=4096, hidden=4096)),
    ("rmsnorm", "rmsnorm 16384x8192", dict(rows=16384, hidden=8192)),
    ("fused_add_rmsnorm", "fused_add_rmsnorm 4096x4096", dict(rows=4096, hidden=4096)),
    ("rope", "rope pos_ids nnz8192 hq32 hk8 d128", dict(nnz=8192, hq=32, hk=8, d=128)),
    ("silu_and_mul", "silu_and_mul 4096x14336", dict(rows=4096, d=14336)),
]

# public function -> capability-DB op name
DB_OP = {"single_decode": "single_decode", "single_prefill": "single_prefill", "rmsnorm": "rmsnorm",
         "fused_add_rmsnorm": "rmsnorm", "rope": "rope", "silu_and_mul": "act_and_mul"}


def _copies(bytes_per_copy: int) -> int:
    return max(2, min(64, math.ceil(3 * L2_BYTES / max(bytes_per_copy, 1))))


def build(op: str, p: dict, dtype=torch.bfloat16) -> tuple[list, Callable, float, float]:
    """→ (list of argument sets, call(args, backend), bytes moved, flops) for one case."""
    dev = "cuda"
    randn = lambda *s: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
    if op == "single_decode":
        kv_shape = (p["kv"], p["hkv"], p["d"]) if p["layout"] == "NHD" else (p["hkv"], p["kv"], p["d"])
        nbytes = 2 * math.prod(kv_shape) * 2 + 2 * p["hq"] * p["d"] * 2
        sets = [(randn(p["hq"], p["d"]), randn(*kv_shape), randn(*kv_shape)) for _ in range(_copies(nbytes))]
        call = lambda a, b: flashinfer.single_decode_with_kv_cache(*a, kv_layout=p["layout"], backend=b)  # noqa: E731
        return sets, call, nbytes, 4 * p["hq"] * p["kv"] * p["d"]
    if op == "single_prefill":
        q_bytes = p["qo"] * p["hq"] * p["d"] * 2
        nbytes = 2 * q_bytes + 2 * p["kv"] * p["hkv"] * p["d"] * 2
        sets = [(randn(p["qo"], p["hq"], p["d"]), randn(p["kv"], p["hkv"], p["d"]),
                 randn(p["kv"], p["hkv"], p["d"])) for _ in range(_copies(nbytes))]
        call = lambda a, b: flashinfer.single_prefill_with_kv_cache(*a, causal=p["causal"], backend=b)  # noqa: E731
        # visible (query, key) pairs, bottom-right causal
        pairs = p["qo"] * p["kv"] - (p["qo"] * (p["qo"] - 1) // 2 if p["causal"] else 0)
        return sets, call, nbytes, 4 * p["hq"] * p["d"] * pairs
    if op in ("rmsnorm", "fused_add_rmsnorm"):
        n = p["rows"] * p["hidden"] * 2
        if op == "rmsnorm":
            sets = [(randn(p["rows"], p["hidden"]), randn(p["hidden"])) for _ in range(_copies(2 * n))]
            call = lambda a, b: flashinfer.rmsnorm(*a, backend=b)  # noqa: E731
            return sets, call, 2 * n, 0
        sets = [(randn(p["rows"], p["hidden"]), randn(p["rows"], p["hidden"]), randn(p["hidden"]))
                for _ in range(_copies(4 * n))]
        call = lambda a, b: flashinfer.fused_add_rmsnorm(*a, backend=b)  # noqa: E731
        return sets, call, 4 * n, 0
    if op == "rope":
        nbytes = 2 * p["nnz"] * (p["hq"] + p["hk"]) * p["d"] * 2
        sets = [(randn(p["nnz"], p["hq"], p["d"]), randn(p["nnz"], p["hk"], p["d"]),
                 torch.randint(0, 8192, (p["nnz"],), device=dev, dtype=torch.int32))
                for _ in range(_copies(nbytes))]
        call = lambda a, b: flashinfer.apply_rope_pos_ids(*a, backend=b)  # noqa: E731
        return sets, call, nbytes, 0
    if op == "silu_and_mul":
        nbytes = p["rows"] * p["d"] * 2 * 3
        sets = [(randn(p["rows"], 2 * p["d"]),) for _ in range(_copies(nbytes))]
        call = lambda a, b: flashinfer.silu_and_mul(*a, backend=b)  # noqa: E731
        return sets, call, nbytes, 0
    raise ValueError(op)


def eager_ms(sets: list, call: Callable, backend: str, iters: int) -> float:
    """Per-call time of back-to-back eager calls (host overhead included when it dominates)."""
    times = []
    for _ in range(iters):
        start, end = cuda_events()
        start.record()
        for args in sets:
            call(args, backend)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(sets))
    return statistics.median(times)


def gpu_ms(sets: list, call: Callable, backend: str, iters: int) -> float | None:
    """Per-call GPU time (ms) of the calls captured once in a CUDA graph and replayed; ``None``
    when the path cannot be captured (see bench_timing.graph_ms)."""
    return graph_ms(sets, call, backend, iters)


def time_ms(sets: list, call: Callable, backend: str, iters: int) -> dict:
    for i in range(3):
        call(sets[i % len(sets)], backend)
    torch.cuda.synchronize()
    return {"gpu_ms": gpu_ms(sets, call, backend, iters), "eager_ms": eager_ms(sets, call, backend, iters)}


def first_reason(exc: Exception) -> str:
    text = str(exc).splitlines()
    reasons = [line.strip()[2:] for line in text if line.strip().startswith("- ")]
    return reasons[0] if reasons else text[0]


def run_case(op: str, name: str, params: dict, iters: int) -> dict:
    sets, call, nbytes, flops = build(op, params)
    specs = ["auto"] + sorted({f"{r.backend}:{r.variant}" for r in database().for_op(DB_OP[op])})
    point = {"op": op, "case": name, "params": params, "bytes": nbytes, "flops": flops, "backends": {}}
    with flashinfer.record_decisions() as log:
        call(sets[0], "auto")
    point["auto_choice"] = log[-1].name if log else None
    for spec in specs:
        try:
            timing = time_ms(sets, call, spec, iters)
        except NoBackendError as exc:
            point["backends"][spec] = {"rejected": first_reason(exc)}
            continue
        except Exception as exc:  # a kernel that fails here is a finding, not a crash of the run
            point["backends"][spec] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            continue
        ms = timing["gpu_ms"] if timing["gpu_ms"] is not None else timing["eager_ms"]
        entry = {"ms": ms, **timing}
        if flops and op == "single_prefill":
            entry["tflops"] = flops / ms / 1e9
            entry["fraction_of_ceiling"] = flops / ms * 1e3 / CEIL_BF16
        else:
            entry["tb_per_s"] = nbytes / ms / 1e9
            entry["fraction_of_ceiling"] = nbytes / ms * 1e3 / CEIL_BW
        point["backends"][spec] = entry
        gpu = timing["gpu_ms"]
        print(f"  {name:<44} {spec:<24} gpu {'   n/a' if gpu is None else f'{gpu:9.4f}'} ms  "
              f"eager {timing['eager_ms']:9.4f} ms", flush=True)
    del sets
    torch.cuda.empty_cache()
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default="", help="substring filter on case names")
    args = parser.parse_args()
    results = []
    for op, name, params in CASES:
        if args.only in name:
            results.append(run_case(op, name, params, args.iters))
    doc = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(), "sm": ".".join(map(str, torch.cuda.get_device_capability())),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                     "flashinfer": flashinfer.__version__},
        "ceilings": {"bytes_per_s": CEIL_BW, "bf16_flops": CEIL_BF16},
        "timing": (f"CUDA events, median of {args.iters}; gpu_ms = CUDA-graph replay of the rotated "
                   f"calls, eager_ms = back-to-back eager calls; inputs rotated past L2"),
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\n{'case':<44} {'auto ->':<22} " + "auto ms (gpu / eager) | best backend by gpu ms")
    for point in results:
        timed = {k: v["ms"] for k, v in point["backends"].items() if "ms" in v and k != "auto"}
        best = min(timed, key=timed.get) if timed else "-"
        auto = point["backends"].get("auto", {})
        print(f"{point['case']:<44} {str(point['auto_choice']):<22} {auto.get('ms', float('nan')):.4f} / "
              f"{auto.get('eager_ms', float('nan')):.4f} | {best} {timed.get(best, float('nan')):.4f}")


if __name__ == "__main__":
    main()
