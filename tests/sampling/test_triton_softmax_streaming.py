"""The streaming softmax (variant ``triton:streaming`` of op softmax, ``_softmax_kernels.py``):
one program per row and split rows against float64 ``torch.softmax``, both temperature forms,
three input dtypes, vocabularies that are not a multiple of the block, ``-inf`` entries, rows of
NaN or only ``-inf``, the chunk rule. CPU: the interpreter at small shapes; ``gpu``: 128k."""

import pytest
import torch

from conftest import poison, rel_error
from sampling_helpers import logits

triton = pytest.importorskip("triton")

from flashinfer.dispatch import kernel_for  # noqa: E402
from flashinfer.backends.triton.softmax import CHUNK_BLOCK, MAX_CHUNKS, split_chunks  # noqa: E402

pytestmark = [pytest.mark.usefixtures("kernel_device"),
              # the interpreter's numpy evaluates exp(-inf - -inf) before the kernel masks it
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


def streaming():
    return kernel_for("triton", "softmax", "streaming")


def expected(x, temperature):
    t = 1.0 if temperature is None else (
        temperature.double().cpu()[:, None] if torch.is_tensor(temperature) else temperature)
    return torch.softmax(x.double().cpu() / t, -1)


@pytest.mark.parametrize("chunks", [1, 3, 8], ids=["rows", "split3", "split8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_matches_float64_softmax(chunks, dtype):
    x = logits(3, 300, seed=1, dtype=dtype)
    x[1, :11] = float("-inf")
    for temperature in (None, 0.7, torch.tensor([0.5, 1.0, 2.0], device=x.device)):
        out = poison(torch.empty(3, 300, device=x.device))
        streaming()(x, out, temperature, chunks=chunks)
        assert rel_error(out.cpu(), expected(x, temperature)) < 1e-5


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_nan_row_is_nan_and_an_all_minus_inf_row_is_nan(chunks):
    x = logits(3, 70, seed=2)
    x[0, 5] = float("nan")
    x[1] = float("-inf")
    out = torch.full((3, 70), -7.0, device=x.device)
    streaming()(x, out, None, chunks=chunks)
    assert out[:2].isnan().all()
    assert rel_error(out[2:].cpu(), expected(x[2:], None)) < 1e-5


def test_the_rule_picks_the_split_path_and_it_matches():
    x = logits(2, 1000, seed=3)
    out = poison(torch.empty(2, 1000, device=x.device))
    streaming()(x, out, 1.3)  # 2 rows never fill half of the SMs: split
    assert rel_error(out.cpu(), expected(x, 1.3)) < 1e-5


@pytest.mark.parametrize("variant", ["default", "streaming"])
def test_non_contiguous_output(variant):
    x = logits(4, 129, seed=4)
    out = poison(torch.empty(129, 4, device=x.device)).t()
    kernel_for("triton", "softmax", variant)(x, out, None)
    assert rel_error(out.cpu(), expected(x, None)) < 1e-5


def test_chunk_rule():
    assert split_chunks(rows=256, vocab=128256, sms=132) == 1
    assert split_chunks(rows=66, vocab=128256, sms=132) == 1
    assert split_chunks(rows=1, vocab=128256, sms=132) == 126  # whole 1,024 blocks: 126 of them
    assert split_chunks(rows=16, vocab=128256, sms=132) == 17
    assert split_chunks(rows=1, vocab=300, sms=132) == -(-300 // CHUNK_BLOCK)
    # the write kernel's statistics width is MAX_CHUNKS at every row count (no compile per batch)
    assert split_chunks(rows=1, vocab=10**7, sms=1000) == MAX_CHUNKS


@pytest.mark.parametrize("chunks", [0, MAX_CHUNKS + 1])
def test_a_forced_chunk_count_outside_the_range_is_refused(chunks):
    x = logits(2, 64, seed=6)
    with pytest.raises(ValueError, match="chunks"):
        streaming()(x, torch.empty(2, 64, device=x.device), None, chunks=chunks)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 256])
def test_gpu_large_vocab(rows):
    x = logits(rows, 128256, seed=5, dtype=torch.bfloat16).cuda()
    out = poison(torch.empty(rows, 128256, device="cuda"))
    streaming()(x, out, 0.8)
    assert rel_error(out.cpu(), expected(x, 0.8)) < 1e-5
