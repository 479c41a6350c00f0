"""The symmetric-memory fused all-reduce kernels on CPU: the Triton one-shot kernel under the
interpreter in spawned gloo groups, its buffers shared files that every rank maps
(comm_helpers.SharedFileBuffers), against float64 math; in this process the workspace's
symmetric buffers on a gloo group (none, with the reason), the refusal of a named one-shot
kernel without them, and the Decisions on simulated SMs. The torch:symm_mem_* kernels and the
Triton kernel over NCCL run in tests/comm/test_allreduce_gpu.py."""

import pytest
import torch

import flashinfer
import flashinfer.comm as comm
from comm_helpers import one_rank_group, spawn_ranks, symmetric_worker

pytest.importorskip("triton")


@pytest.mark.parametrize("world", [2, 3])
def test_triton_one_shot_agrees_with_float64_math(world, tmp_path):
    """Patterns 0 / 1 / 2 / 4 / 10 / 11 and vLLM's in-place call on every rank; 3 ranks: a
    world size that is no power of two."""
    spawn_ranks(symmetric_worker, world, tmp_path, str(tmp_path), timeout=300)


@pytest.fixture
def world_of_one(tmp_path):
    with one_rank_group(tmp_path):
        yield


def test_a_gloo_workspace_has_no_symmetric_buffers_and_says_why(world_of_one, monkeypatch):
    ws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)
    assert ws.symmetric is None and "gloo, not NCCL on GPUs" in ws.symmetric_note
    monkeypatch.setenv("FLASHINFER_COMM_SYMM_MEM", "0")
    ws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)
    assert ws.symmetric is None and ws.symmetric_note == "FLASHINFER_COMM_SYMM_MEM=0"


@pytest.mark.parametrize("backend", ["triton", "torch:symm_mem_one_shot"])
def test_a_named_one_shot_kernel_without_symmetric_buffers_is_refused(world_of_one, backend):
    ws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, 64, torch.bfloat16)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with flashinfer.use_backend(comm=backend), pytest.raises(Exception,
                                                             match="symmetric_workspace=0"):
        comm.allreduce_fusion(x, ws, 0)


def _problem(sm, symmetric, features=(), dtype="bfloat16", hidden=7168):
    from flashinfer.device import simulated
    from flashinfer.dispatch import Problem

    return Problem.make("allreduce_fusion", simulated(sm), dtypes={"input": dtype},
                        shape={"world_size": 8, "hidden_dim": hidden, "num_tokens": 128,
                               "symmetric_workspace": symmetric}, features=set(features))


@pytest.mark.parametrize("sm", ["8.0", "9.0", "12.0", None])
def test_auto_keeps_nccl_until_the_one_shot_kernels_are_measured(sm):
    from flashinfer.dispatch import select

    want = "reference" if sm is None else "torch:all_reduce"
    assert select(_problem(sm, 1, ("residual_rmsnorm",))).name == want


@pytest.mark.parametrize("sm, backend, features, dtype, want", [
    ("9.0", "triton", ("residual_rmsnorm",), "float16", "triton:one_shot"),
    ("9.0", "triton", ("residual_rmsnorm", "fp8_dynamic_quant"), "bfloat16", "triton:one_shot_fp8"),
    ("8.0", "triton", ("residual_rmsnorm", "fp8_quant"), "bfloat16", None),  # (no e4m3 in Triton)
    ("9.0", "triton", ("residual_rmsnorm", "fp8_group_quant"), "bfloat16", None),
    ("9.0", "torch:symm_mem_one_shot", ("residual_rmsnorm",), "bfloat16", "torch:symm_mem_one_shot"),
    ("9.0", "torch:symm_mem_two_shot", (), "float32", "torch:symm_mem_two_shot"),
    ("9.0", "torch:symm_mem_one_shot", (), "float16", None),  # (torch's kernels: bf16 / fp32)
])
def test_named_symmetric_kernels_on_simulated_sms(sm, backend, features, dtype, want):
    from flashinfer.dispatch import decide

    with flashinfer.use_backend(comm=backend):
        if want is None:
            with pytest.raises(Exception, match="allreduce_fusion"):
                decide(_problem(sm, 1, features, dtype))
        else:
            assert decide(_problem(sm, 1, features, dtype)).name == want
