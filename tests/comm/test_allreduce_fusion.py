"""flashinfer.comm's fused all-reduce on CPU: gloo process groups of 2 and 4 spawned ranks
against float64 math (every pattern served, dtypes, 1-1024 tokens x 256-7168), and in this
process (world size 1) the argument checks and the refused MNNVL / NVSHMEM names."""

import pytest
import torch
import torch.distributed as dist

import flashinfer.comm as comm
from comm_helpers import one_rank_group, run_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_agree_with_float64_math(world, tmp_path):
    """Every entry point in one spawned gloo group per size (process start-up is the cost):
    patterns 0 / 1 at sizes 1-1,024 tokens, the fp8 patterns, the legacy TRT-LLM names and the
    vLLM port (comm_helpers.CHECKS)."""
    run_ranks(world, tmp_path, ("fusion", "quant", "legacy", "vllm"))


@pytest.fixture
def world_of_one(tmp_path):
    with one_rank_group(tmp_path):
        yield


def test_world_of_one_is_the_input(world_of_one):
    x = torch.randn(5, 64).to(torch.bfloat16)
    ws = comm.create_allreduce_fusion_workspace(world_size=1, rank=0, max_token_num=8,
                                                hidden_dim=64, dtype=torch.bfloat16)
    assert ws.backend == "trtllm" and ws.is_buffer_size_sufficient(1, 8, 64, torch.bfloat16)
    assert not ws.is_buffer_size_sufficient(1, 9, 64, torch.bfloat16)
    assert torch.equal(comm.allreduce_fusion(x, ws, 0), x)


def test_bad_arguments_are_refused(world_of_one):
    ws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)
    x = torch.randn(4, 64).to(torch.bfloat16)
    with pytest.raises(ValueError, match="do not match the process group"):
        comm.create_allreduce_fusion_workspace("auto", 2, 0, 8, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="backend must be 'auto' or 'trtllm'"):
        comm.create_allreduce_fusion_workspace("nccl", 1, 0, 8, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="pattern must be an AllReduceFusionPattern"):
        comm.allreduce_fusion(x, ws, 12)
    with pytest.raises(NotImplementedError, match="kARResidualRMSNormFP4Quant .3. has no kernel"):
        comm.allreduce_fusion(x, ws, comm.AllReduceFusionPattern.kARResidualRMSNormFP4Quant)
    with pytest.raises(ValueError, match="input must be torch.bfloat16"):
        comm.allreduce_fusion(x.half(), ws, 0)
    with pytest.raises(ValueError, match="input has 9 tokens, the workspace holds 8"):
        comm.allreduce_fusion(torch.randn(9, 64).to(torch.bfloat16), ws, 0)
    with pytest.raises(ValueError, match="needs residual_in and rms_gamma"):
        comm.allreduce_fusion(x, ws, 1)
    with pytest.raises(ValueError, match="residual_in must be"):
        comm.allreduce_fusion(x, ws, 1, residual_in=x[:2], rms_gamma=torch.ones(64))
    with pytest.raises(ValueError, match="rms_eps must be a finite number"):
        comm.allreduce_fusion(x, ws, 1, residual_in=x, rms_gamma=torch.ones(64),
                              rms_eps=float("nan"))
    ws.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        comm.allreduce_fusion(x, ws, 0)


def test_multicast_and_nvshmem_names_say_what_to_use():
    with pytest.raises(NotImplementedError, match="MNNVL .NVLink multicast. is not supported"):
        comm.create_allreduce_fusion_workspace("mnnvl", 1, 0, 8, 64, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="use flashinfer.comm.create_allreduce"):
        comm.MNNVLAllReduceFusionWorkspace()
    import flashinfer.comm.mnnvl as mnnvl
    import flashinfer.comm.nvshmem as nvshmem

    with pytest.raises(NotImplementedError, match="flashinfer.comm.mnnvl.McastGPUBuffer"):
        mnnvl.McastGPUBuffer
    with pytest.raises(NotImplementedError, match="NVSHMEM is not supported here"):
        nvshmem.init


def test_without_a_process_group_the_error_says_so():
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="needs an initialised torch.distributed"):
        comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)


def test_comm_family_override_reaches_the_decision(world_of_one):
    """use_backend(comm=...) picks the kernel of allreduce_fusion; one that has no record for
    the op is refused with the reason."""
    import flashinfer

    ws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)
    x = torch.randn(4, 64).to(torch.bfloat16)
    for backend, name in (("reference", "reference"), ("torch", "torch:all_reduce")):
        with flashinfer.use_backend(comm=backend), flashinfer.record_decisions() as log:
            assert torch.equal(comm.allreduce_fusion(x, ws, 0), x)
        assert log[-1].name == name
    with flashinfer.use_backend(comm="triton"), pytest.raises(Exception, match="triton"):
        comm.allreduce_fusion(torch.randn(3, 64).to(torch.bfloat16), ws, 0)


@pytest.mark.parametrize("how", ["stops", "dies"])
def test_a_rank_that_stops_or_dies_does_not_hang_the_others(how, tmp_path):
    import torch.multiprocessing as mp

    from comm_helpers import stalled_peer_worker

    result = str(tmp_path / "rank0")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=stalled_peer_worker,
                         args=(r, 2, f"file://{tmp_path}/store", result, how)) for r in range(2)]
    for p in procs:
        p.start()
    procs[0].join(timeout=60)
    for p in procs[1:]:  # (the stopped rank sleeps on: not waited for)
        p.join(timeout=1)
        if p.is_alive():
            p.kill()
    assert open(result).read() == "ok"


@pytest.mark.parametrize("sm, features, want", [
    ("7.5", (), "torch:all_reduce"), ("9.0", ("residual_rmsnorm",), "torch:all_reduce"),
    ("12.0", ("residual_rmsnorm", "gemma_weight"), "torch:all_reduce"),
    ("9.0", ("residual_rmsnorm", "fp8_quant"), "reference"),  # (the reference quantises)
    ("9.0", ("residual_rmsnorm", "fp8_group_quant"), "reference"),
    (None, ("residual_rmsnorm",), "reference"),  # the CPU: the oracle first
])
def test_decision_on_simulated_sms(sm, features, want):
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem, select

    problem = Problem.make("allreduce_fusion", simulated(sm), dtypes={"input": "bfloat16"},
                           shape={"world_size": 8, "hidden_dim": 7168, "num_tokens": 128},
                           features=set(features))
    assert select(problem).name == want


def test_the_benchmark_runs_under_torchrun_on_cpu(tmp_path):
    """benchmarks/comm.py with 2 gloo ranks at one tiny size: a header, a row per backend and
    op, an end line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "comm.py"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script), "--device", "cpu", "--tokens", "2", "--hidden", "64",
                    "--groups", "2", "--out", str(tmp_path)], check=True, timeout=120,
                   capture_output=True)
    (out,) = tmp_path.glob("comm_cpu_w2_*.jsonl")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert "header" in lines[0] and "end" in lines[-1]
    rows = {(r["op"], r["backend"]): r for r in lines[1:-1]}
    assert len(rows) == 7 and all("ms" in r for r in rows.values()), rows
