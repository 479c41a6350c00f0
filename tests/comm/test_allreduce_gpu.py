"""flashinfer.comm on GPUs over NCCL: one process per GPU at world sizes 1, 2, 4 and 8 (as many
as the machine has), every backend that serves patterns 0 / 1 against float64 math, eager and
replayed from a CUDA graph (comm_helpers.gpu_worker). NVLink multicast stays off in every child
(comm_helpers.NO_MULTICAST)."""

import os

import pytest
import torch

from comm_helpers import NO_MULTICAST, gpu_worker


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_backends_agree_with_float64_math_over_nccl(world, tmp_path, monkeypatch):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    import torch.multiprocessing as mp

    for name, value in NO_MULTICAST.items():  # (inherited by the children)
        monkeypatch.setenv(name, value)
    results = [str(tmp_path / f"rank{r}") for r in range(world)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=gpu_worker,
                         args=(r, world, f"file://{tmp_path}/store", results[r]))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for r, path in enumerate(results):
        assert os.path.exists(path), f"rank {r} left no result (exit code {procs[r].exitcode})"
        assert open(path).read() == "ok", open(path).read()
