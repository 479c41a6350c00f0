"""flashinfer.comm on GPUs over NCCL: one process per GPU at world sizes 1, 2, 4 and 8 (as many
as the machine has), every backend that serves patterns 0 / 1 against float64 math, eager and
replayed from a CUDA graph (comm_helpers.gpu_worker). NVLink multicast stays off in every child
(comm_helpers.NO_MULTICAST)."""

import pytest
import torch

from comm_helpers import NO_MULTICAST, gpu_worker, spawn_ranks


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_backends_agree_with_float64_math_over_nccl(world, tmp_path, monkeypatch):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    for name, value in NO_MULTICAST.items():  # (inherited by the children)
        monkeypatch.setenv(name, value)
    spawn_ranks(gpu_worker, world, tmp_path, timeout=300)
