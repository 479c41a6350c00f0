"""flashinfer.aliasing: overlap() against brute force on generated strided views (never a missed
overlap; exact whenever the strides nest), and the checks' messages."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, strategies as st

from flashinfer.aliasing import (_layout, _nested_hit, check_no_overlap, check_writable,
                                 internal_overlap, overlap)

from conftest import FUZZ, raises_naming

POOL = torch.zeros(1 << 12, dtype=torch.uint8)
DTYPES = [torch.uint8, torch.int16, torch.float32, torch.float64]


def touched(t: torch.Tensor) -> set[int]:
    e, base, out = t.element_size(), t.data_ptr(), set()
    for idx in itertools.product(*[range(n) for n in t.shape]):
        start = base + e * sum(i * s for i, s in zip(idx, t.stride()))
        out.update(range(start, start + e))
    return out


@st.composite
def views(draw):
    dtype = draw(st.sampled_from(DTYPES))
    ndim = draw(st.integers(0, 3))
    sizes = [draw(st.integers(1, 4)) for _ in range(ndim)]
    if draw(st.booleans()):  # nested: each stride covers the dims inside it (any order)
        strides, extent = [], 1
        for n in reversed(sizes):
            strides.insert(0, extent + draw(st.integers(0, 3)))
            extent = strides[0] * n
        order = draw(st.permutations(range(ndim)))
        sizes, strides = [sizes[i] for i in order], [strides[i] for i in order]
    else:
        strides = [draw(st.integers(0, 5)) for _ in range(ndim)]
    return torch.as_strided(POOL.view(dtype), sizes, strides, draw(st.integers(0, 24)))


@FUZZ
@given(a=views(), b=views())
def test_overlap_never_misses_and_is_exact_for_nested_strides(a, b):
    truth = bool(touched(a) & touched(b))
    assert overlap(a, b) or not truth
    da, ia = _layout(a)
    db, ib = _layout(b)
    exact = _nested_hit(da, ia, db, ib, b.data_ptr() - a.data_ptr())
    assert exact is None or exact == truth


def test_split_views_of_one_buffer():
    qkv = torch.randn(6, 128)
    q, k, v = qkv[:, :64].view(6, 2, 32), qkv[:, 64:96].view(6, 1, 32), qkv[:, 96:]
    assert not overlap(q, k) and not overlap(k, v) and overlap(q, q[:, 1:]) and overlap(qkv, v)
    kv = torch.randn(5, 2, 3, 4)
    assert not overlap(kv[:, 0], kv[:, 1]) and overlap(kv[:, 0], kv[1:, 0])
    assert not overlap(torch.randn(3), torch.randn(3)) and not overlap(qkv[:0], qkv)


def test_checks_name_both_arguments():
    x = torch.randn(4, 8)
    check_no_overlap("f", "out", x, True, input=x)  # the same view is allowed when asked
    with raises_naming("f: out shares memory with input", "exactly the same tensor"):
        check_no_overlap("f", "out", x[1:], True, input=x)
    with raises_naming("f: out shares memory with input"):
        check_no_overlap("f", "out", x, input=x)
    check_no_overlap("f", "out", None, input=x)
    expanded = torch.randn(1, 8).expand(4, 8)
    assert internal_overlap(expanded) and not internal_overlap(x)
    with pytest.raises(ValueError, match="f: out has a dim of stride 0"):
        check_writable("f", "out", expanded)
