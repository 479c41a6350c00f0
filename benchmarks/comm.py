"""Communication benchmark: ``flashinfer.comm.allreduce_fusion`` (all-reduce, and all-reduce +
residual add + RMSNorm) per backend and ``auto``, against NCCL's all-reduce followed by a
separate ``fused_add_rmsnorm``; launched with ``torchrun``, one process per GPU. On GPUs the
symmetric-memory kernels (torch's one-shot / two-shot, our Triton one-shot) get rows too.

    torchrun --nproc-per-node 8 benchmarks/comm.py --out results/     # ours
    PYTHONPATH=/tmp/anchor torchrun --nproc-per-node 8 benchmarks/comm.py --impl upstream --out results/
    python -m torch.distributed.run --nproc-per-node 2 benchmarks/comm.py --device cpu --tokens 1 16 --hidden 256

The upstream run uses only upstream's public API (``create_allreduce_fusion_workspace(backend=
"trtllm")``, never ``auto`` or ``mnnvl``), so the same file measures upstream FlashInfer when its
package is first on ``PYTHONPATH`` (a separate process). NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``, set
here before NCCL starts).

Timing: per row, 5 untimed calls, then 20 groups of 10 back-to-back calls, each group timed on
every rank (CUDA events; ``perf_counter`` on the CPU) after a barrier; a group's time is the
slowest rank's, the row's the median group, per call. Rank 0 writes the JSON lines
``comm[_upstream]_<device>_w<world>_<date>utc.jsonl`` (a header, one line per row, an end line).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ[_name] = "0" if _name == "NCCL_NVLS_ENABLE" else "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TOKENS = (1, 16, 128, 1024, 8192)
#: our backends of allreduce_fusion (auto, then each forced); upstream: its trtllm kernel. The
#: symmetric-memory kernels need an NCCL workspace (GPUs only)
OURS = ("auto", "torch", "reference")
SYMMETRIC = ("torch:symm_mem_one_shot", "torch:symm_mem_two_shot", "triton")


def _group_ms(step, device: torch.device, groups: int, calls: int) -> float:
    """The median over ``groups`` of the slowest rank's time per call of ``calls`` steps."""
    for _ in range(5):
        step()
    times = []
    for _ in range(groups):
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                step()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end) / calls
        else:
            t = time.perf_counter()
            for _ in range(calls):
                step()
            ms = (time.perf_counter() - t) * 1e3 / calls
        slowest = torch.tensor([ms], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(float(slowest))
    return statistics.median(times)


def _rows(args, world: int, rank: int, device: torch.device):
    """``(name, backend, tokens, step)`` of every row."""
    import flashinfer
    import flashinfer.comm as comm

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden = args.hidden
    kind = "trtllm" if args.impl == "upstream" else "auto"
    ws = comm.create_allreduce_fusion_workspace(kind, world, rank, max(args.tokens), hidden,
                                                dtype)
    gen = torch.Generator(device=device).manual_seed(rank)
    gamma = torch.randn(hidden, generator=gen, device=device).to(dtype)
    backends = ("trtllm",) if args.impl == "upstream" else OURS + (
        SYMMETRIC if device.type == "cuda" else ())
    if rank == 0 and args.impl == "ours":
        print(f"symmetric buffers: {ws.symmetric is not None} {ws.symmetric_note}", flush=True)
    for tokens in args.tokens:
        x = torch.randn(tokens, hidden, generator=gen, device=device).to(dtype)
        residual = torch.randn_like(x)
        out, res_out, norm_out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        for backend in backends:
            forced = {} if backend in ("auto", "trtllm") else {"comm": backend}

            def reduce(forced=forced):
                with flashinfer.use_backend(**forced) if forced else contextlib.nullcontext():
                    comm.allreduce_fusion(x, ws, comm.AllReduceFusionPattern.kAllReduce,
                                          output=out)

            def fused(forced=forced):
                with flashinfer.use_backend(**forced) if forced else contextlib.nullcontext():
                    comm.allreduce_fusion(x, ws, comm.AllReduceFusionPattern.kARResidualRMSNorm,
                                          residual_in=residual, residual_out=res_out,
                                          norm_out=norm_out, rms_gamma=gamma)

            yield "allreduce", backend, tokens, reduce
            yield "allreduce+rmsnorm", backend, tokens, fused
        summed, res = x.clone(), residual.clone()

        def nccl_then_norm():
            summed.copy_(x)
            dist.all_reduce(summed)
            flashinfer.norm.fused_add_rmsnorm(summed, res, gamma)

        yield "allreduce+rmsnorm", "nccl_then_fused_add_rmsnorm", tokens, nccl_then_norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=("ours", "upstream"), default="ours")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    sink = None
    if rank == 0:
        import flashinfer

        name = (torch.cuda.get_device_name().lower().split()[-1] if args.device == "cuda"
                else "cpu")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H%Mutc")
        side = "_upstream" if args.impl == "upstream" else ""
        os.makedirs(args.out, exist_ok=True)
        sink = open(os.path.join(args.out, f"comm{side}_{name}_w{world}_{stamp}.jsonl"), "w")
        sink.write(json.dumps({"header": {
            "family": "comm", "command": " ".join([sys.executable] + sys.argv),
            "date": stamp, "world_size": world, "hidden": args.hidden,
            "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "impl": args.impl, "flashinfer": getattr(flashinfer, "__version__", None),
            "torch": torch.__version__,
            "shows": "fused all-reduce per backend and NCCL + separate RMSNorm, ms per call "
                     "(slowest rank, median of groups)"}}) + "\n")
    start = time.time()
    rows = 0
    for op, backend, tokens, step in _rows(args, world, rank, device):
        row = {"op": op, "backend": backend, "tokens": tokens, "hidden": args.hidden}
        try:
            row["ms"] = _group_ms(step, device, args.groups, 10)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run a row is a finding
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows += 1
        if sink:
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            print(row, flush=True)
    if sink:
        sink.write(json.dumps({"end": {"rows": rows, "elapsed_s": round(time.time() - start, 1)}})
                   + "\n")
        sink.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
