"""The per-rank worker of the multi-process comm tests (spawned: it must live in a module the
children import) and the float64 math the fused all-reduce is checked against."""

from __future__ import annotations

import traceback

import torch

#: (tokens, hidden, dtype) every worker reduces, with and without the residual + RMSNorm
CASES = [(1, 7168, torch.bfloat16), (7, 4096, torch.float16), (128, 4096, torch.bfloat16),
         (33, 256, torch.float32), (1024, 4096, torch.bfloat16)]


def rank_input(rank: int, tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + 31 * rank + tokens)
    return torch.randn(tokens, hidden, generator=g).to(dtype)


def expected(world: int, tokens: int, hidden: int, dtype: torch.dtype, weight_bias: float):
    """``(sum, residual_out, norm_out)`` in float64 from every rank's input (the sum rounded to
    the dtype once, the norm of the rounded residual, as the kernels store them)."""
    total = sum(rank_input(r, tokens, hidden, dtype).double() for r in range(world))
    g = torch.Generator().manual_seed(7 + tokens)
    residual = torch.randn(tokens, hidden, generator=g).to(dtype)
    gamma = torch.randn(hidden, generator=g).to(dtype)
    res_out = (total + residual.double()).to(dtype).double()
    rstd = torch.rsqrt(res_out.square().mean(-1, keepdim=True) + 1e-6)
    return total, residual, gamma, res_out, res_out * rstd * (gamma.double() + weight_bias)


def worker(rank: int, world: int, init: str, result: str) -> None:
    """Every case on this rank; ``result`` gets "ok" or the first failure's traceback."""
    import torch.distributed as dist

    from conftest import rel_error  # (the spawned child has the tests on sys.path)
    import flashinfer.comm as comm

    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        for tokens, hidden, dtype in CASES:
            kind = "auto" if dtype == torch.bfloat16 else "trtllm"  # (the same workspace)
            ws = comm.create_allreduce_fusion_workspace(kind, world, rank, 1024, hidden, dtype)
            x = rank_input(rank, tokens, hidden, dtype)
            kept = x.clone()
            for wb in (0.0, 1.0):
                total, residual, gamma, res_want, norm_want = expected(world, tokens, hidden,
                                                                       dtype, wb)
                out = comm.allreduce_fusion(x, ws, comm.AllReduceFusionPattern.kAllReduce)
                assert torch.equal(x, kept), "input changed"
                assert rel_error(out, total) < tol(dtype), ("sum", tokens, hidden, dtype)
                res_out = torch.full_like(x, float("nan"))
                norm_out = torch.full_like(x, float("nan"))
                got = comm.allreduce_fusion(x, ws, 1, residual_out=res_out, norm_out=norm_out,
                                            residual_in=residual, rms_gamma=gamma,
                                            weight_bias=wb)
                assert got is norm_out
                assert rel_error(res_out, res_want) < tol(dtype), ("residual", tokens, dtype)
                assert rel_error(norm_out, norm_want) < tol(dtype), ("norm", tokens, dtype, wb)
        dist.barrier()
        open(result, "w").write("ok")
    except Exception:  # noqa: BLE001 - reported to the parent
        open(result, "w").write(traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def tol(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]
