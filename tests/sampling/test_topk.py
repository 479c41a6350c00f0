"""flashinfer.top_k (module flashinfer.topk) against float64 selection written here: the k largest
per row, tie-break modes at the boundary, deterministic and sorted output, argument checks."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer.topk import TopKTieBreak


def _as_sets(values, indices):
    return [sorted(zip(v.tolist(), i.tolist())) for v, i in zip(values, indices)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sorted_", [False, True])
def test_top_k_selects_the_largest(dtype, sorted_):
    torch.manual_seed(0)
    x = torch.randn(5, 300).to(dtype)  # fp16/bf16 rounding gives ties too: compare value sets
    values, indices = flashinfer.top_k(x, 17, sorted=sorted_)
    assert values.dtype == dtype and indices.dtype == torch.int64 and values.shape == (5, 17)
    torch.testing.assert_close(x.gather(1, indices), values, rtol=0, atol=0)
    want = torch.sort(x.double(), dim=1, descending=True).values[:, :17]
    torch.testing.assert_close(torch.sort(values.double(), dim=1, descending=True).values, want,
                               rtol=0, atol=0)
    if sorted_:
        assert bool((values[:, :-1] >= values[:, 1:]).all())


def test_tie_break_modes_choose_among_equal_values_by_index():
    x = torch.tensor([[5.0, 1.0, 3.0, 3.0, 3.0, 0.0]])
    for mode, want in ((TopKTieBreak.SMALLER_INDEX, [0, 2, 3]), (TopKTieBreak.LARGER_INDEX, [0, 4, 3]),
                       (1, [0, 2, 3]), (2, [0, 4, 3])):
        values, indices = flashinfer.top_k(x, 3, tie_break=mode)
        assert indices.tolist() == [want] and values.tolist() == [[5.0, 3.0, 3.0]]
    _, first = flashinfer.top_k(x, 3, deterministic=True)
    _, again = flashinfer.top_k(x, 3, deterministic=True)
    assert first.tolist() == again.tolist() == [[0, 2, 3]]


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(input=torch.randn(4), k=1), ValueError, "2-D"),
    (dict(input=torch.randn(2, 4, dtype=torch.float64), k=1), TypeError, "float64"),
    (dict(input=torch.randn(2, 4), k=5), ValueError, "k=5"),
    (dict(input=torch.randn(2, 4), k=0), ValueError, "k=0"),
    (dict(input=torch.randn(2, 4), k=1.5), TypeError, "k must be an int"),
    (dict(input=torch.randn(2, 4), k=1, tie_break=3), ValueError, "tie_break"),
    (dict(input=torch.randn(2, 4), k=1, sorted=1), TypeError, "sorted"),
])
def test_bad_arguments_are_named(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        flashinfer.top_k(**kwargs)


def test_module_and_alias():
    assert flashinfer.topk.topk is flashinfer.topk.top_k is flashinfer.top_k
