"""The per-rank worker of the multi-process comm tests (spawned: it must live in a module the
children import) and the float64 math the fused all-reduce is checked against."""

from __future__ import annotations

import contextlib
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


def check_fusion_patterns(rank: int, world: int) -> None:
    """Patterns 0 and 1 (with and without Gemma's weight) at every CASES shape, on each
    backend that serves them; and vLLM's in-place call (residual_out = residual_in, norm_out =
    input)."""
    import flashinfer

    for backend in ("reference", "torch"):
        with flashinfer.use_backend(comm=backend):
            _check_patterns_0_1(rank, world)
            _check_in_place_call(rank, world)


def _check_in_place_call(rank: int, world: int) -> None:
    from conftest import rel_error
    import flashinfer.comm as comm

    tokens, hidden, dtype = 16, 512, torch.bfloat16
    ws = comm.create_allreduce_fusion_workspace("auto", world, rank, 64, hidden, dtype)
    total, residual, gamma, res_want, norm_want = expected(world, tokens, hidden, dtype, 0.0)
    x, res = rank_input(rank, tokens, hidden, dtype), residual.clone()
    comm.allreduce_fusion(x, ws, 1, residual_in=res, residual_out=res, norm_out=x,
                          rms_gamma=gamma)
    assert rel_error(res, res_want) < tol(dtype) and rel_error(x, norm_want) < tol(dtype)


def _check_patterns_0_1(rank: int, world: int, cases=CASES) -> None:
    from conftest import rel_error  # (the spawned child has the tests on sys.path)
    import flashinfer.comm as comm

    for tokens, hidden, dtype in cases:
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
                                        residual_in=residual, rms_gamma=gamma, weight_bias=wb)
            assert got is norm_out
            assert rel_error(res_out, res_want) < tol(dtype), ("residual", tokens, dtype)
            assert rel_error(norm_out, norm_want) < tol(dtype), ("norm", tokens, dtype, wb)


@contextlib.contextmanager
def one_rank_group(tmp_path):
    """This process as a gloo group of one (the in-process tests' fixtures)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def tol(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}[dtype]


# --------------------------------------------------------------------------------------------
# the fp8 patterns, the legacy TRT-LLM names and the vLLM port (tests/comm/test_allreduce_quant.py)

FP8_MAX = 448.0
#: (tokens, hidden, dtype, block_quant_group_size): 1 / 3 / 33 tokens pad the scale rows to a
#: multiple of 4, 5 / 10 groups leave bytes of the last packed int32, 48 is no power of two
QUANT_CASES = [(1, 256, torch.bfloat16, 128), (3, 640, torch.float16, 128),
               (8, 768, torch.bfloat16, 64), (33, 768, torch.float32, 48),
               (64, 1280, torch.bfloat16, 128)]


def fp8_rounding_ok(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether every fp8 code ``q`` is ``v`` (float64) clamped to +-448 and rounded to a nearest
    e4m3 value: within half a spacing (2**-4 of |v| for normals, 2**-10 below 2**-6)."""
    v = v.clamp(-FP8_MAX, FP8_MAX)
    return bool(((q.double() - v).abs() <= v.abs() * 2.0 ** -4 * (1 + 1e-5) + 2.0 ** -10).all())


def group_scale_span(scale_out: torch.Tensor) -> torch.Tensor:
    """Every int32 of a packed group-scale tensor's storage span (the padding included), flat."""
    tokens, packs = scale_out.shape
    span = (packs - 1) * scale_out.stride(1) + tokens if packs > 1 else tokens
    return torch.as_strided(scale_out, (span,), (1,))


def nan_outputs(x: torch.Tensor) -> tuple:
    """``(residual_out, norm_out, quant_out)`` poisoned with NaN (fp8 NaN codes)."""
    q = torch.full(x.shape, float("nan")).to(torch.float8_e4m3fn)
    return torch.full_like(x, float("nan")), torch.full_like(x, float("nan")), q


def expected_group_storage(y: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From the normed output ``y [T, H]`` (as stored), in float64: the fp8 codes and the packed
    storage bytes of the power-of-two scales (exponent byte of group g at int32 (g // 4) * M + t,
    byte g % 4; zero elsewhere)."""
    tokens, hidden = y.shape
    groups = hidden // group_size
    packs, rows = (groups + 3) // 4, (tokens + 3) // 4 * 4
    g = y.double().reshape(tokens, groups, group_size)
    s = (g.abs().amax(-1) / FP8_MAX).clamp_min(1e-10)
    mantissa, exponent = torch.frexp(s)  # s = mantissa * 2**exponent, mantissa in [0.5, 1)
    k = exponent - (mantissa == 0.5).to(exponent.dtype)  # 2**k: s rounded up to a power of two
    q = (g / torch.exp2(k.double()).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX)
    span = (packs - 1) * rows + tokens if packs > 1 else tokens
    storage = torch.zeros(span * 4, dtype=torch.uint8)
    t, gi = torch.meshgrid(torch.arange(tokens), torch.arange(groups), indexing="ij")
    storage[((gi // 4) * rows + t) * 4 + gi % 4] = (k + 127).to(torch.uint8)
    return q.reshape(tokens, hidden).to(torch.float8_e4m3fn), storage


def check_quant_patterns(rank: int, world: int, group_scales: bool = True,
                         cases=QUANT_CASES) -> None:
    """Patterns 2 / 4 / 10 / 11 (and with ``group_scales`` 8 / 9) against float64 math on every
    one of ``cases``."""
    from conftest import rel_error
    import flashinfer.comm as comm

    P = comm.AllReduceFusionPattern
    for tokens, hidden, dtype, gs in cases:
        ws = comm.create_allreduce_fusion_workspace("auto", world, rank, 64, hidden, dtype)
        x = rank_input(rank, tokens, hidden, dtype)
        for wb in (0.0, 1.0):
            _, residual, gamma, res_want, norm_want = expected(world, tokens, hidden, dtype, wb)
            args = dict(residual_in=residual, rms_gamma=gamma, weight_bias=wb)
            where = (tokens, hidden, dtype, wb)

            # per-tensor scale: ~1 % of |y / scale| beyond 448 (saturated)
            scale = float(norm_want.abs().flatten().quantile(0.99)) / FP8_MAX
            res, norm, q4 = nan_outputs(x)
            got = comm.allreduce_fusion(x, ws, P.kARResidualRMSNormOutFP8Quant, residual_out=res,
                                        norm_out=norm, quant_out=q4,
                                        scale_factor=torch.tensor([scale]), **args)
            assert got is norm, where
            assert rel_error(res, res_want) < tol(dtype) and rel_error(norm, norm_want) < tol(dtype)
            assert fp8_rounding_ok(q4, norm.double() / scale), ("fp8 rounding", where)
            assert rel_error(q4.double() * scale, norm_want.clamp(-FP8_MAX * scale,
                                                                  FP8_MAX * scale)) < 5e-2
            assert (q4.double().abs() == FP8_MAX).any(), "no saturated code"
            _, untouched, q2 = nan_outputs(x)
            got = comm.allreduce_fusion(x, ws, P.kARResidualRMSNormFP8Quant, quant_out=q2,
                                        norm_out=untouched, scale_factor=scale, **args)
            assert got is untouched and untouched.isnan().all(), "norm_out written by pattern 2"
            assert torch.equal(q2.view(torch.uint8), q4.view(torch.uint8)), where
            got = comm.allreduce_fusion(x, ws, P.kARResidualRMSNormFP8Quant, quant_out=q2,
                                        scale_factor=scale, **args)
            assert got is q2, where

            # per-token dynamic scales
            res, norm, q11 = nan_outputs(x)
            s11 = torch.full((tokens, 1), float("nan"))
            comm.allreduce_fusion(x, ws, P.kARResidualRMSNormOutDynamicFP8Quant, residual_out=res,
                                  norm_out=norm, quant_out=q11, scale_out=s11, **args)
            assert rel_error(norm, norm_want) < tol(dtype), where
            s_want = (norm.double().abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(
                2.0 ** -9 / FP8_MAX)
            assert rel_error(s11, s_want) < 1e-6, ("dynamic scale", where)
            assert fp8_rounding_ok(q11, norm.double() / s11.double()), ("dynamic fp8", where)
            assert rel_error(q11.double() * s11.double(), norm_want) < 5e-2, where
            q10, s10 = torch.empty_like(q11), torch.empty_like(s11)
            got = comm.allreduce_fusion(x, ws, P.kARResidualRMSNormDynamicFP8Quant,
                                        quant_out=q10, scale_out=s10, **args)
            assert got is q10 and torch.equal(s10, s11), where
            assert torch.equal(q10.view(torch.uint8), q11.view(torch.uint8)), where
            if not group_scales:
                continue

            # per-token-group power-of-two scales, packed (storage poisoned: padding must be 0)
            shape = (tokens, (hidden // gs + 3) // 4)
            strides = (1, (tokens + 3) // 4 * 4)
            res, norm, q9 = nan_outputs(x)
            s9 = torch.empty_strided(shape, strides, dtype=torch.int32)
            group_scale_span(s9).fill_(0x7F7F7F7F)
            comm.allreduce_fusion(x, ws, P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant,
                                  residual_out=res, norm_out=norm, quant_out=q9, scale_out=s9,
                                  block_quant_group_size=gs, **args)
            assert rel_error(norm, norm_want) < tol(dtype), where
            q_want, storage_want = expected_group_storage(norm, gs)
            assert torch.equal(group_scale_span(s9).view(torch.uint8), storage_want), where
            assert torch.equal(q9.view(torch.uint8), q_want.view(torch.uint8)), ("group fp8", where)
            q8, s8 = torch.empty_like(q9), torch.empty_strided(shape, strides, dtype=torch.int32)
            got = comm.allreduce_fusion(x, ws, P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                                        quant_out=q8, scale_out=s8, block_quant_group_size=gs,
                                        **args)
            assert got is q8 and torch.equal(q8.view(torch.uint8), q9.view(torch.uint8)), where
            assert torch.equal(group_scale_span(s8).view(torch.uint8), storage_want), where
        ws.destroy()


def check_legacy_names(rank: int, world: int) -> None:
    """trtllm_allreduce_fusion (flat tensors) equals allreduce_fusion bit for bit and float64
    math; trtllm_custom_all_reduce (NONE, RESIDUAL_RMS_NORM with a bias) against float64 math,
    on the world and (4 ranks) on a recorded sub-group."""
    import warnings

    from conftest import rel_error
    import torch.distributed as dist
    import flashinfer.comm as comm

    warnings.simplefilter("ignore", DeprecationWarning)
    P = comm.AllReduceFusionPattern
    tokens, hidden, dtype = 7, 512, torch.bfloat16
    handles, ws, meta = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        rank, world, 16, hidden, create_metadata=True)
    assert meta["tp_size"] == world and len(handles) == 3 and handles[0] == [0] * world
    x = rank_input(rank, tokens, hidden, dtype)
    total, residual, gamma, res_want, norm_want = expected(world, tokens, hidden, dtype, 1.0)
    flat = {n: torch.full((tokens * hidden,), float("nan")).to(dtype)
            for n in ("allreduce_out", "residual_out", "norm_out")}
    flat["quant_out"] = torch.empty(tokens * hidden, dtype=torch.float8_e4m3fn)
    scale_out = torch.empty(tokens, 1)
    common = dict(allreduce_in=x.flatten(), world_size=world, world_rank=rank, token_num=tokens,
                  hidden_dim=hidden, workspace_ptrs=ws, launch_with_pdl=True,
                  trigger_completion_at_end=False, fp32_acc=True, use_oneshot=None,
                  rms_gamma=gamma, rms_eps=1e-6, layout_code=comm.QuantizationSFLayout.LINEAR,
                  metadata=meta, weight_bias=1.0)
    comm.trtllm_allreduce_fusion(pattern_code=P.kAllReduce, residual_in=None, residual_out=None,
                                 norm_out=None, quant_out=None, scale_out=None, scale_factor=None,
                                 allreduce_out=flat["allreduce_out"], **common)
    assert rel_error(flat["allreduce_out"].view(tokens, hidden), total) < tol(dtype)
    comm.trtllm_allreduce_fusion(pattern_code=P.kARResidualRMSNormOutDynamicFP8Quant,
                                 allreduce_out=None, residual_in=residual.flatten(),
                                 residual_out=flat["residual_out"], norm_out=flat["norm_out"],
                                 quant_out=flat["quant_out"], scale_out=scale_out,
                                 scale_factor=None, **common)
    assert rel_error(flat["residual_out"].view(tokens, hidden), res_want) < tol(dtype)
    assert rel_error(flat["norm_out"].view(tokens, hidden), norm_want) < tol(dtype)
    ws2 = comm.create_allreduce_fusion_workspace("trtllm", world, rank, 16, hidden, dtype)
    q, s = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn), torch.empty(tokens, 1)
    norm = comm.allreduce_fusion(x, ws2, P.kARResidualRMSNormOutDynamicFP8Quant, quant_out=q,
                                 scale_out=s, residual_in=residual, rms_gamma=gamma,
                                 weight_bias=1.0)
    assert torch.equal(norm, flat["norm_out"].view(tokens, hidden)) and torch.equal(s, scale_out)
    assert torch.equal(q.view(torch.uint8).flatten(), flat["quant_out"].view(torch.uint8))
    comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)

    # the custom all-reduce: on the world, then (4 ranks) over a recorded pair of ranks
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else [None]
    for group, size, me in [(None, world, rank)] + (
            [(pairs[rank // 2], 2, rank % 2)] if world == 4 else []):
        members = range(world) if group is None else range(rank // 2 * 2, rank // 2 * 2 + 2)
        peers = comm.trtllm_create_ipc_workspace_for_all_reduce(me, size, 16, hidden, group)
        assert len(peers) == 7
        ptr = torch.tensor(peers[0], dtype=torch.int64)
        inp = rank_input(rank, tokens, hidden, dtype).flatten()
        g = torch.Generator().manual_seed(99)
        bias, weight = (torch.randn(hidden, generator=g).to(dtype) for _ in range(2))
        sum64 = sum(rank_input(r, tokens, hidden, dtype).double() for r in members)
        out, inter = torch.full_like(inp, float("nan")), torch.full_like(inp, float("nan"))
        run = dict(inp=inp, out=out, tp_size=size, tp_rank=me, token_num=tokens,
                   strategy_code=comm.AllReduceStrategyType.ONESHOT, config_code=0,
                   launch_with_pdl=False, flag_value=1, peer_comm_buffer_ptrs=ptr,
                   peer_barrier_ptrs_in=ptr, peer_barrier_ptrs_out=ptr, bias=bias,
                   residual=residual.flatten(), weight=weight, weight_pre_residual_norm=None,
                   eps=1e-6, intermediate_buffer=inter, lamport_peer_comm_buffer_ptrs_0=ptr,
                   lamport_peer_comm_buffer_ptrs_1=ptr, lamport_peer_comm_buffer_ptrs_2=ptr)
        comm.trtllm_custom_all_reduce(fusion_op_code=comm.AllReduceFusionOp.NONE, **run)
        assert rel_error(out.view(tokens, hidden), sum64) < tol(dtype), ("custom NONE", size)
        comm.trtllm_custom_all_reduce(fusion_op_code=comm.AllReduceFusionOp.RESIDUAL_RMS_NORM,
                                      **run)
        inter_want = sum64 + residual.double() + bias.double()
        rstd = torch.rsqrt(inter_want.square().mean(-1, keepdim=True) + 1e-6)
        assert rel_error(inter.view(tokens, hidden), inter_want) < tol(dtype)
        assert rel_error(out.view(tokens, hidden), inter_want * rstd * weight.double()) < tol(dtype)
        comm.trtllm_destroy_ipc_workspace_for_all_reduce(peers)


def check_vllm_port(rank: int, world: int) -> None:
    """vllm_all_reduce of several shapes and dtypes against float64 sums, on the world and (4
    ranks) on a recorded pair of ranks."""
    from conftest import rel_error
    import torch.distributed as dist
    import flashinfer.comm as comm

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else []
    setups = [(None, world, rank, range(world))] + (
        [(pairs[rank // 2], 2, rank % 2, range(rank // 2 * 2, rank // 2 * 2 + 2))] if pairs else [])
    for group, size, me, members in setups:
        fa = comm.vllm_init_custom_ar([0] * size, torch.empty(64, dtype=torch.uint8), me, True,
                                      group=group)
        comm.vllm_register_buffer(fa, [0] * size)
        handle_bytes, offsets = comm.vllm_get_graph_buffer_ipc_meta(fa)
        comm.vllm_register_graph_buffers(fa, [handle_bytes] * size, [offsets] * size)
        for shape, dtype in (((4096,), torch.bfloat16), ((3, 5, 64), torch.float32),
                             ((2, 1024), torch.float16)):
            def local(r):
                g = torch.Generator().manual_seed(500 + r)
                return torch.randn(shape, generator=g).to(dtype)

            inp, out = local(rank), torch.full(shape, float("nan")).to(dtype)
            nbytes = inp.numel() * inp.element_size()
            comm.vllm_all_reduce(fa, inp, out, 1, nbytes, 16)
            want = sum(local(r).double() for r in members)
            assert rel_error(out, want) < tol(dtype), (shape, dtype, size)
        comm.vllm_dispose(fa)


class SharedFileBuffers:
    """The symmetric buffers' interface (backends/shared/symmetric_memory.py) for gloo ranks on
    one host: each rank's buffer a shared file in ``directory`` that every rank maps, so the
    Triton one-shot kernel (under TRITON_INTERPRET=1) reads the other ranks' rows as on GPUs."""

    made = 0

    def __init__(self, directory: str, group, numel: int, dtype: torch.dtype) -> None:
        import torch.distributed as dist

        SharedFileBuffers.made += 1  # (every rank makes its workspaces in the same order)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        path = [f"{directory}/symm{SharedFileBuffers.made}_{r}" for r in range(world)]
        self.buffer = torch.from_file(path[rank], shared=True, size=numel, dtype=dtype)
        self.buffer.fill_(float("nan"))  # (a row never copied in would show)
        self.group = group
        dist.barrier(group)
        self._peers = [self.buffer if r == rank else
                       torch.from_file(path[r], shared=True, size=numel, dtype=dtype)
                       for r in range(world)]
        self.peer_table = torch.tensor([t.data_ptr() for t in self._peers], dtype=torch.int64)
        self.group_name = "shared-files"

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(self.group)


def check_symmetric_kernels(rank: int, world: int) -> None:
    """The Triton one-shot kernel through allreduce_fusion, its workspaces holding shared-file
    buffers: patterns 0 / 1 at the CASES up to 128 tokens, vLLM's in-place call, the per-tensor
    and per-token fp8 patterns; each call decided for triton:one_shot(_fp8)."""
    import os

    import flashinfer
    import flashinfer.comm.fusion as fusion

    directory = os.environ["SYMM_TEST_DIR"]
    fusion.make_symmetric_buffers = lambda group, numel, dtype: (
        SharedFileBuffers(directory, group, numel, dtype), "")
    with flashinfer.use_backend(comm="triton"), flashinfer.record_decisions() as log:
        _check_patterns_0_1(rank, world, CASES[:4])  # (the interpreter: 1-128 tokens)
        _check_in_place_call(rank, world)
        check_quant_patterns(rank, world, False, QUANT_CASES[1:4])
    names = {d.name for d in log if d.problem.op == "allreduce_fusion"}
    assert names == {"triton:one_shot", "triton:one_shot_fp8"}, names


def symmetric_worker(rank: int, world: int, init: str, result: str, directory: str) -> None:
    """check_symmetric_kernels on this rank of a gloo group, under the Triton interpreter."""
    import os

    os.environ.update(TRITON_INTERPRET="1", SYMM_TEST_DIR=directory)
    _in_group("gloo", rank, world, init, result, lambda: check_symmetric_kernels(rank, world))


CHECKS = {"fusion": check_fusion_patterns, "quant": check_quant_patterns,
          "legacy": check_legacy_names, "vllm": check_vllm_port}


def _in_group(backend: str, rank: int, world: int, init: str, result: str, body) -> None:
    """``body()`` in a ``backend`` process group; ``result`` gets "ok" or the traceback."""
    import torch.distributed as dist

    try:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
        body()
        dist.barrier()
        open(result, "w").write("ok")
    except Exception:  # noqa: BLE001 - reported to the parent
        open(result, "w").write(traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def checks_worker(rank: int, world: int, init: str, result: str, names: tuple) -> None:
    """The CHECKS named, on this rank of one gloo group."""
    def body():
        for name in names:
            CHECKS[name](rank, world)

    _in_group("gloo", rank, world, init, result, body)


def spawn_ranks(target, world: int, tmp_path, *args, timeout: float = 240) -> None:
    """Spawn ``target(rank, world, init, result, *args)`` on ``world`` ranks; assert each
    reported "ok"."""
    import os

    import torch.multiprocessing as mp

    results = [str(tmp_path / f"rank{r}") for r in range(world)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target,
                         args=(r, world, f"file://{tmp_path}/store", results[r], *args))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for r, path in enumerate(results):
        assert os.path.exists(path), f"rank {r} left no result (exit code {procs[r].exitcode})"
        assert open(path).read() == "ok", open(path).read()


def run_ranks(world: int, tmp_path, names: tuple) -> None:
    """Spawn ``world`` gloo ranks running the CHECKS ``names``."""
    spawn_ranks(checks_worker, world, tmp_path, names)


def stalled_peer_worker(rank: int, world: int, init: str, result: str, how: str) -> None:
    """Rank 0 all-reduces with FLASHINFER_COMM_TIMEOUT_S=2 while rank 1 ``stops`` (sleeps past
    it) or ``dies`` (exits) without joining: rank 0 must raise the clear timeout error, soon."""
    import os
    import time

    import torch.distributed as dist

    os.environ["FLASHINFER_COMM_TIMEOUT_S"] = "2"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    if rank != 0:
        if how == "stops":
            time.sleep(12)
        os._exit(0)
    import flashinfer.comm as comm

    ws = comm.create_allreduce_fusion_workspace("auto", world, rank, 4, 64, torch.float32)
    start = time.monotonic()
    try:
        comm.allreduce_fusion(torch.randn(4, 64), ws, comm.AllReduceFusionPattern.kAllReduce)
        outcome = "no error"
    except RuntimeError as exc:
        outcome = "ok" if "did not complete within 2 s (FLASHINFER_COMM_TIMEOUT_S)" in str(exc) \
            else f"unclear error: {exc}"
    elapsed = time.monotonic() - start
    with open(result, "w") as f:
        f.write(outcome if elapsed < 10 else f"{outcome}, but after {elapsed:.1f} s")
    os._exit(0)


#: never NVLink multicast on the lent machines (their GPUs are shared): set for every child
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


#: the comm backends the GPU test runs (torch's symmetric-memory kernels: bf16 / fp32 only)
GPU_BACKENDS = ("reference", "torch", "torch:symm_mem_one_shot", "torch:symm_mem_two_shot",
                "triton")


def gpu_worker(rank: int, world: int, init: str, result: str) -> None:
    """One GPU per rank over NCCL: patterns 0 / 1 on every backend that serves them, eager and
    replayed from a CUDA graph, and the Triton kernel's fp8 patterns, against float64 math."""
    import os

    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    _in_group("nccl", rank, world, init, result, lambda: _check_on_gpu(rank, world))


def _check_on_gpu(rank: int, world: int) -> None:
    from conftest import rel_error
    import flashinfer
    import flashinfer.comm as comm

    dev = torch.device("cuda", rank)
    for backend in GPU_BACKENDS:
        with flashinfer.use_backend(comm=backend):
            for tokens, hidden, dtype in CASES:
                if backend.startswith("torch:symm") and dtype == torch.float16:
                    continue
                ws = comm.create_allreduce_fusion_workspace("auto", world, rank, 1024, hidden,
                                                            dtype)
                if backend not in ("reference", "torch"):
                    assert ws.symmetric is not None, ws.symmetric_note
                total, residual, gamma, res_want, norm_want = expected(world, tokens, hidden,
                                                                       dtype, 1.0)
                x = rank_input(rank, tokens, hidden, dtype).to(dev)
                residual, gamma = residual.to(dev), gamma.to(dev)
                out = comm.allreduce_fusion(x, ws, 0)
                assert rel_error(out.cpu(), total) < tol(dtype), (backend, "sum", tokens)
                res_out, norm_out = torch.empty_like(x), torch.empty_like(x)
                call = lambda: comm.allreduce_fusion(  # noqa: E731
                    x, ws, 1, residual_in=residual, residual_out=res_out, norm_out=norm_out,
                    rms_gamma=gamma, weight_bias=1.0)
                call()
                assert rel_error(res_out.cpu(), res_want) < tol(dtype), (backend, tokens)
                assert rel_error(norm_out.cpu(), norm_want) < tol(dtype), (backend, tokens)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    call()
                res_out.fill_(float("nan")), norm_out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                assert rel_error(norm_out.cpu(), norm_want) < tol(dtype), (backend, "graph")
                ws.destroy()
    _check_fp8_on_gpu(rank, world, dev)


def _check_fp8_on_gpu(rank: int, world: int, dev: torch.device) -> None:
    """triton:one_shot_fp8's per-token dynamic pattern (11) and per-tensor pattern (4): the
    codes are the stored normed output over its scale, rounded to fp8 (the GPU's conversion)."""
    from conftest import rel_error
    import flashinfer
    import flashinfer.comm as comm

    P = comm.AllReduceFusionPattern
    for tokens, hidden, dtype, _ in QUANT_CASES:
        ws = comm.create_allreduce_fusion_workspace("auto", world, rank, 64, hidden, dtype)
        _, residual, gamma, res_want, norm_want = expected(world, tokens, hidden, dtype, 0.0)
        x = rank_input(rank, tokens, hidden, dtype).to(dev)
        args = dict(residual_in=residual.to(dev), rms_gamma=gamma.to(dev))
        res, norm, q = (t.to(dev) for t in nan_outputs(x))
        s = torch.full((tokens, 1), float("nan"), device=dev)
        with flashinfer.use_backend(comm="triton"), flashinfer.record_decisions() as log:
            comm.allreduce_fusion(x, ws, P.kARResidualRMSNormOutDynamicFP8Quant, residual_out=res,
                                  norm_out=norm, quant_out=q, scale_out=s, **args)
            assert log[-1].name == "triton:one_shot_fp8"
            norm64, s64 = norm.cpu().double(), s.cpu().double()
            assert rel_error(norm64, norm_want) < tol(dtype), (tokens, hidden, dtype)
            assert rel_error(s64, (norm64.abs().amax(-1, keepdim=True) / FP8_MAX).clamp_min(
                2.0 ** -9 / FP8_MAX)) < 1e-6
            assert fp8_rounding_ok(q.cpu(), norm64 / s64), ("dynamic fp8", tokens, dtype)
            scale = float(norm_want.abs().flatten().quantile(0.99)) / FP8_MAX
            comm.allreduce_fusion(x, ws, P.kARResidualRMSNormOutFP8Quant, residual_out=res,
                                  norm_out=norm, quant_out=q,
                                  scale_factor=torch.tensor([scale], device=dev), **args)
            assert fp8_rounding_ok(q.cpu(), norm.cpu().double() / scale), ("fp8", tokens, dtype)
        ws.destroy()
