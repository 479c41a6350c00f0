"""packbits / segment_packbits against numpy.packbits (both bit orders), segments packed on
their own, the indptr rules, and a packed mask that the attention functions read as the bool
mask it came from."""

import numpy as np
import pytest
import torch

import flashinfer
from flashinfer.quantization import packbits, segment_packbits


@pytest.mark.parametrize("bitorder", ["big", "little"])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1001])
def test_packbits_is_numpys(n, bitorder):
    g = torch.Generator().manual_seed(n)
    x = torch.rand(n, generator=g) > 0.5
    want = np.packbits(x.numpy(), bitorder=bitorder)
    got = packbits(x, bitorder)
    assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), want)


def test_default_bitorder_is_big_and_nonzero_is_one():
    x = torch.tensor([3, 0, 0, 0, 0, 0, 0, -1.5])
    assert packbits(x).tolist() == [0b10000001] and flashinfer.packbits is packbits
    assert packbits(torch.tensor([True, False]), "little").tolist() == [1]


@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_segments_are_packed_on_their_own(bitorder):
    g = torch.Generator().manual_seed(5)
    lens = [0, 3, 8, 13, 1, 0, 20]
    x = torch.rand(sum(lens), generator=g) > 0.3
    indptr = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
    packed, new_indptr = segment_packbits(x, indptr, bitorder)
    want = [np.packbits(s.numpy(), bitorder=bitorder) for s in torch.split(x, lens)]
    assert new_indptr.dtype == torch.int32
    assert new_indptr.tolist() == [0] + np.cumsum([len(w) for w in want]).tolist()
    assert np.array_equal(packed.numpy(), np.concatenate(want))


@pytest.mark.parametrize("indptr,entry", [([0, 5, 3], 2), ([0, 40], 1), ([-1, 4], 0)])
def test_bad_indptr_is_named(indptr, entry):
    with pytest.raises(ValueError, match=rf"indptr\[{entry}\]"):
        segment_packbits(torch.ones(16, dtype=torch.bool), torch.tensor(indptr))


def test_bad_arguments():
    with pytest.raises(ValueError, match="bitorder='middle'"):
        packbits(torch.ones(4, dtype=torch.bool), "middle")
    with pytest.raises(ValueError, match="x must be 1-D"):
        packbits(torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="indptr must be a torch.Tensor"):
        segment_packbits(torch.ones(4, dtype=torch.bool), [0, 4])
    with pytest.raises(ValueError, match="indptr must be a 1-D integer tensor"):
        segment_packbits(torch.ones(4, dtype=torch.bool), torch.tensor([0.0, 4.0]))


def test_a_little_packed_mask_is_the_mask_to_prefill():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(5, 2, 16, generator=g), torch.randn(11, 2, 16, generator=g),
               torch.randn(11, 2, 16, generator=g))
    mask = torch.rand(5, 11, generator=g) > 0.4
    mask[:, 0] = True  # every row sees a key
    dense = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    packed = flashinfer.single_prefill_with_kv_cache(
        q, k, v, packed_custom_mask=packbits(mask.flatten(), bitorder="little"))
    torch.testing.assert_close(packed, dense)
