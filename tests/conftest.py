"""Shared test set-up.

Without a GPU, Triton kernels run in Triton's interpreter: TRITON_INTERPRET must be set before
any @triton.jit function is defined, so it is set here, before tests import the kernels. The
dispatcher still prefers the reference backend on CPU; Triton tests ask for backend="triton".
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()

#: relative Frobenius-error tolerance by dtype (DESIGN.md)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative Frobenius error; NaN anywhere in ``actual`` gives inf (NaN never passes)."""
    a, e = actual.double(), expected.double()
    if torch.isnan(a).any():
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN so unwritten elements fail the comparison."""
    return t.fill_(float("nan"))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dispatch_cache():
    """Each test sees a fresh Decision cache (tests change env vars and overrides)."""
    from flashinfer.dispatch import clear_cache

    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def kernel_device():
    """Tensors made without a device land on the GPU when there is one (Triton kernels run
    natively) and on the CPU otherwise (they run in Triton's interpreter): the same small-shape
    kernel tests cover both. Use through ``pytestmark = pytest.mark.usefixtures(...)``."""
    with torch.device("cuda" if HAS_CUDA else "cpu"):
        yield


def capture_cuda_graph(fn):
    """Run ``fn`` once on a side stream (warm-up outside the capture), then capture it into a
    CUDA graph and return the graph (replay it after refilling the inputs in place)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph
