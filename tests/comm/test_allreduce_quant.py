"""The fp8 quantising patterns of flashinfer.comm.allreduce_fusion (2, 4, 8-11) on CPU.

The spawned gloo groups of test_allreduce_fusion.py check every pattern against float64 math
(per-tensor, per-token dynamic and per-token-group power-of-two scales, the packed scale layout
and its padding: comm_helpers.check_quant_patterns). Here, in this process (world size 1): the
refused patterns, the bad arguments, and the dynamic scale's floor.
"""

import pytest
import torch

import flashinfer
import flashinfer.comm as comm
from comm_helpers import one_rank_group

P = comm.AllReduceFusionPattern
FP8 = torch.float8_e4m3fn
T, H = 4, 256


@pytest.fixture
def world_of_one(tmp_path):
    with one_rank_group(tmp_path):
        yield comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, H, torch.bfloat16)


def _inputs():
    g = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(T, H, generator=g).to(torch.bfloat16) for _ in range(2))
    return x, dict(residual_in=residual, rms_gamma=torch.randn(H, generator=g).to(torch.bfloat16))


def _group_scales(tokens=T, hidden=H, gs=64):
    packs, rows = (hidden // gs + 3) // 4, (tokens + 3) // 4 * 4
    return torch.empty_strided((tokens, packs), (1, rows), dtype=torch.int32)


@pytest.mark.parametrize("pattern, what", [
    (P.kARResidualRMSNormFP4Quant, "fp4_quantize"), (P.kARResidualRMSNormOutFP4Quant, "NVFP4"),
    (P.kMoEReductionARResidualRMSNorm, "sum the experts' outputs"),
    (P.kMoEFinalizeARResidualRMSNorm, "finalise the MoE output")])
def test_fp4_and_moe_patterns_are_refused_saying_what_to_use(world_of_one, pattern, what):
    x, args = _inputs()
    with pytest.raises(NotImplementedError, match=rf"{pattern.name} \({int(pattern)}\) has no "
                                                  rf"kernel here: .*{what}"):
        comm.allreduce_fusion(x, world_of_one, pattern, **args)


def test_quantising_patterns_refuse_bad_arguments(world_of_one):
    ws = world_of_one
    x, args = _inputs()
    q = torch.empty(T, H, dtype=FP8)
    cases = [
        (ValueError, "kARResidualRMSNormFP8Quant needs quant_out", P.kARResidualRMSNormFP8Quant,
         dict(scale_factor=1.0)),
        (ValueError, "kARResidualRMSNormOutFP8Quant needs scale_factor",
         P.kARResidualRMSNormOutFP8Quant, dict(quant_out=q)),
        (TypeError, r"quant_out must be torch.float8_e4m3fn .*got torch.bfloat16",
         P.kARResidualRMSNormFP8Quant, dict(quant_out=x, scale_factor=1.0)),
        (ValueError, r"quant_out must be \[4, 256\] .*got \[4, 128\]",
         P.kARResidualRMSNormFP8Quant, dict(quant_out=q[:, :128], scale_factor=1.0)),
        (ValueError, r"scale_factor must be a finite number > 0, got -1.0",
         P.kARResidualRMSNormFP8Quant, dict(quant_out=q, scale_factor=-1.0)),
        (TypeError, r"scale_factor must be .* tensor or a float, got a torch.int32 tensor",
         P.kARResidualRMSNormFP8Quant,
         dict(quant_out=q, scale_factor=torch.ones(1, dtype=torch.int32))),
        (ValueError, r"scale_factor must hold one value .*got \[2\]",
         P.kARResidualRMSNormFP8Quant, dict(quant_out=q, scale_factor=torch.ones(2))),
        (ValueError, "kARResidualRMSNormDynamicFP8Quant needs scale_out",
         P.kARResidualRMSNormDynamicFP8Quant, dict(quant_out=q)),
        (TypeError, r"scale_out must be torch.float32 .*got torch.float16",
         P.kARResidualRMSNormDynamicFP8Quant,
         dict(quant_out=q, scale_out=torch.empty(T, 1, dtype=torch.float16))),
        (ValueError, r"scale_out must be \[4, 1\] .*got \[4\]",
         P.kARResidualRMSNormOutDynamicFP8Quant, dict(quant_out=q, scale_out=torch.empty(T))),
        (ValueError, "kARResidualRMSNormPerTokenGroupFP8PackedQuant needs block_quant_group_size",
         P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=_group_scales())),
        (ValueError, r"block_quant_group_size must be a positive int dividing hidden_dim=256, "
                     "got 48", P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=_group_scales(), block_quant_group_size=48)),
        (ValueError, r"block_quant_group_size must be .*got 0",
         P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=_group_scales(), block_quant_group_size=0)),
        (TypeError, r"scale_out must be torch.int32 .*got torch.float32",
         P.kARResidualRMSNormOutPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=torch.empty(T, 1), block_quant_group_size=64)),
        (ValueError, r"scale_out must be \[4, 1\] .*got \[4, 2\]",
         P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=_group_scales(gs=32), block_quant_group_size=64)),
        (ValueError, r"scale_out must have strides \(1, 4\) .*torch.empty_strided",
         P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
         dict(quant_out=q, scale_out=torch.empty(T, 2, dtype=torch.int32),
              block_quant_group_size=32)),
        (ValueError, r"layout_code must be None or a QuantizationSFLayout code \(0-2\), got 7",
         P.kARResidualRMSNorm, dict(layout_code=7)),
        (ValueError, "kARResidualRMSNormDynamicFP8Quant needs residual_in and rms_gamma",
         P.kARResidualRMSNormDynamicFP8Quant,
         dict(quant_out=q, scale_out=torch.empty(T, 1), residual_in=None)),
    ]
    for error, message, pattern, extra in cases:
        with pytest.raises(error, match=message):
            comm.allreduce_fusion(x, ws, pattern, **{**args, **extra})


def test_layout_code_is_accepted_where_it_does_not_apply(world_of_one):
    """vLLM passes layout_code=SWIZZLED_128x4 with every pattern."""
    x, args = _inputs()
    got = comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNorm,
                                layout_code=comm.QuantizationSFLayout.SWIZZLED_128x4, **args)
    want = comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNorm, **args)
    assert torch.equal(got, want)


def test_quantisation_arguments_a_pattern_does_not_use_are_ignored(world_of_one):
    """As upstream (its tests pass scale_factor, scale_out and a bf16 quant_out with every
    pattern): pattern 1 and the dynamic pattern leave such arguments untouched."""
    x, args = _inputs()
    unused = dict(quant_out=torch.full((T, H), float("nan"), dtype=torch.bfloat16),
                  scale_out=torch.full((T, 1), float("nan")), scale_factor=0.5,
                  block_quant_group_size=64)
    want = comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNorm, **args)
    got = comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNorm, **args, **unused)
    assert torch.equal(got, want) and unused["quant_out"].isnan().all()
    q, scales = torch.empty(T, H, dtype=FP8), torch.empty(T, 1)
    comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormDynamicFP8Quant, **args,
                          quant_out=q, scale_out=scales, scale_factor=0.5)
    q2, scales2 = torch.empty(T, H, dtype=FP8), torch.empty(T, 1)
    comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormDynamicFP8Quant, **args,
                          quant_out=q2, scale_out=scales2)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(scales, scales2)


def test_a_zero_row_takes_the_scale_floors(world_of_one):
    x, args = _inputs()
    x[1], args["residual_in"][1] = 0, 0
    q, s = torch.empty(T, H, dtype=FP8), torch.empty(T, 1)
    comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormDynamicFP8Quant, quant_out=q,
                          scale_out=s, **args)
    assert s[1, 0] == torch.tensor(2.0 ** -9 / 448, dtype=torch.float32)
    assert (q[1].float() == 0).all() and (s[[0, 2, 3]] > 2.0 ** -9 / 448).all()
    packed = _group_scales(gs=64)  # 4 groups: one int32 per token
    comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                          quant_out=q, scale_out=packed, block_quant_group_size=64, **args)
    # 1e-10 rounded up to a power of two is 2**-33: exponent byte 127 - 33
    assert packed[1, 0].item() == int.from_bytes(bytes([94] * 4), "little")
    assert (q[1].float() == 0).all() and (packed[[0, 2, 3]].view(torch.uint8) > 94).all()


def test_each_quantisation_is_its_own_problem_feature(world_of_one):
    x, args = _inputs()
    q = torch.empty(T, H, dtype=FP8)
    with flashinfer.record_decisions() as log:
        comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormFP8Quant, quant_out=q,
                              scale_factor=0.5, **args)
        comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormOutDynamicFP8Quant,
                              quant_out=q, scale_out=torch.empty(T, 1), weight_bias=1.0, **args)
        comm.allreduce_fusion(x, world_of_one, P.kARResidualRMSNormPerTokenGroupFP8PackedQuant,
                              quant_out=q, scale_out=_group_scales(), block_quant_group_size=64,
                              **args)
    assert [set(d.problem.features) for d in log] == [
        {"residual_rmsnorm", "fp8_quant"},
        {"residual_rmsnorm", "gemma_weight", "fp8_dynamic_quant"},
        {"residual_rmsnorm", "fp8_group_quant"}]
    assert {d.problem.op for d in log} == {"allreduce_fusion"}
    assert {d.backend for d in log} == {"reference"}
