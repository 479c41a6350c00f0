"""flashinfer.comm's legacy TRT-LLM names (trtllm_ar) and vLLM custom all-reduce port (vllm_ar)
in this process (world size 1): upstream's signatures, what the IPC-workspace stand-ins return,
the no-ops, the refusals and the bad arguments, and the Decisions the calls make. The sums over
2 and 4 ranks against float64 math run in tests/comm/test_allreduce_fusion.py (spawned groups)."""

import inspect

import pytest
import torch

import flashinfer
import flashinfer.comm as comm
from comm_helpers import one_rank_group
from conftest import rel_error

P = comm.AllReduceFusionPattern
T, H = 3, 128

#: upstream's parameter names, in order (flashinfer/comm/trtllm_ar.py and vllm_ar.py, 0.6.18)
UPSTREAM_PARAMETERS = {
    "trtllm_create_ipc_workspace_for_all_reduce":
        "rank tp_size max_token_num hidden_dim group",
    "trtllm_destroy_ipc_workspace_for_all_reduce": "workspace group",
    "trtllm_create_ipc_workspace_for_all_reduce_fusion":
        "tp_rank tp_size max_token_num hidden_dim use_fp32_lamport group create_metadata "
        "comm_backend use_symm_dev_mem",
    "trtllm_destroy_ipc_workspace_for_all_reduce_fusion": "workspace group",
    "trtllm_lamport_initialize": "buffer_ptr size dtype",
    "trtllm_lamport_initialize_all": "buffer_0_ptr buffer_1_ptr buffer_2_ptr size dtype",
    "trtllm_custom_all_reduce":
        "inp out tp_size tp_rank token_num fusion_op_code strategy_code config_code "
        "launch_with_pdl flag_value peer_comm_buffer_ptrs peer_barrier_ptrs_in "
        "peer_barrier_ptrs_out bias residual weight weight_pre_residual_norm eps "
        "intermediate_buffer lamport_peer_comm_buffer_ptrs_0 lamport_peer_comm_buffer_ptrs_1 "
        "lamport_peer_comm_buffer_ptrs_2",
    "trtllm_allreduce_fusion":
        "allreduce_in world_size world_rank token_num hidden_dim workspace_ptrs launch_with_pdl "
        "trigger_completion_at_end fp32_acc pattern_code use_oneshot allreduce_out residual_in "
        "residual_out norm_out quant_out scale_out rms_gamma rms_eps scale_factor layout_code "
        "metadata block_quant_group_size weight_bias",
    "trtllm_moe_allreduce_fusion":
        "world_size world_rank token_num hidden_dim workspace_ptrs launch_with_pdl residual_in "
        "rms_gamma rms_eps scale_factor moe_reduction_device_num_experts "
        "moe_reduction_scale_input moe_reduction_active_experts_token_input "
        "moe_reduction_token_input layout_code moe_allreduce_out residual_out norm_out "
        "quant_out scale_out weight_bias",
    "trtllm_moe_finalize_allreduce_fusion":
        "allreduce_in residual_in norm_weight expanded_idx_to_permuted_idx norm_out "
        "residual_out quant_out scale_out workspace_ptrs launch_with_pdl world_rank world_size "
        "eps shared_expert_output expert_scale_factor routed_scaling_factor weight_bias",
    "compute_fp4_swizzled_layout_sf_size": "total_row total_column",
    "vllm_init_custom_ar": "ipc_tensors rank_data rank full_nvlink",
    "vllm_dispose": "fa",
    "vllm_all_reduce": "fa inp out reg_buffer reg_buffer_sz_bytes num_ctas",
    "vllm_get_graph_buffer_ipc_meta": "fa",
    "vllm_register_buffer": "fa fake_ipc_ptrs",
    "vllm_register_graph_buffers": "fa handles offsets",
    "vllm_meta_size": "",
}


@pytest.mark.parametrize("name", sorted(UPSTREAM_PARAMETERS))
def test_signatures_are_upstreams(name):
    fn = getattr(comm, name)
    assert name in comm.__all__
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind is not p.KEYWORD_ONLY]  # (ours: vllm_init_custom_ar(..., group=))
    assert [p.name for p in params] == UPSTREAM_PARAMETERS[name].split()


def test_enums_have_upstreams_codes():
    assert comm.AllReduceFusionOp.RESIDUAL_RMS_NORM == 1
    assert comm.AllReduceFusionOp.MOE_FINALIZE_ALLREDUCE_RESIDUAL_RMS_NORM == 9
    assert (comm.AllReduceStrategyType.NCCL, comm.AllReduceStrategyType.LOWPRECISION) == (0, 6)
    assert comm.AllReduceStrategyConfig.USE_MEMCPY | comm.AllReduceStrategyConfig.PUSH_MODE == 3
    assert [int(v) for v in comm.QuantizationSFLayout] == [0, 1, 2]
    assert comm.trtllm_ar.AllReduceFusionPattern is P
    assert comm.trtllm_ar.LamportTokenNumThreshold == 16
    assert comm.compute_fp4_swizzled_layout_sf_size(129, 5) == 256 * 8
    assert comm.compute_fp4_swizzled_layout_sf_size(128, 4) == 512
    assert comm.vllm_meta_size() == 3456  # sizeof(vllm::Signal): 3 x [36][8] uint32


@pytest.fixture
def world_of_one(tmp_path):
    with one_rank_group(tmp_path):
        yield


def _x(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fusion_workspace_stand_ins(world_of_one):
    with pytest.warns(DeprecationWarning, match="allreduce_fusion"):
        handles, ws = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(0, 1, 16, H)
    assert handles == [[0], [0], [0]] and handles.workspace is ws and ws.group is not None
    with pytest.warns(DeprecationWarning):
        _, ws3, meta = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            0, 1, 16, H, use_fp32_lamport=True, create_metadata=True)
        out = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            0, 1, 16, H, create_metadata=True, use_symm_dev_mem=True)
    assert meta == {"tp_rank": 0, "tp_size": 1, "max_token_num": 16, "hidden_dim": H,
                    "use_fp32_lamport": True, "buffer_size": 16 * H * 2, "flag_size": 256 * 4,
                    "lamport_comm_size": 16 * H * 4, "lamport_buffer_size": 16 * H * 12}
    assert len(out) == 4 and out[2] == [] and out[3]["use_fp32_lamport"] is False
    with pytest.raises(ValueError, match="use_symm_dev_mem is only supported with create_metadata"):
        comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(0, 1, 16, H, use_symm_dev_mem=True)
    with pytest.raises(NotImplementedError, match="comm_backend"):
        comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(0, 1, 16, H, comm_backend=object())
    with pytest.raises(ValueError, match="do not match the process group"):
        comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(0, 2, 16, H)
    with pytest.raises(ValueError, match="max_token_num must be a positive int, got 0"):
        comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(0, 1, 0, H)
    with pytest.raises(TypeError, match="takes the ipc_handles"):
        comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(ws)
    comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)
    assert ws.destroyed


def _fusion_call(ws, **over):
    x = _x(T * H)
    call = dict(allreduce_in=x, world_size=1, world_rank=0, token_num=T, hidden_dim=H,
                workspace_ptrs=ws, launch_with_pdl=False, trigger_completion_at_end=True,
                fp32_acc=False, pattern_code=P.kARResidualRMSNorm, use_oneshot=None,
                allreduce_out=None, residual_in=_x(T * H, seed=1),
                residual_out=torch.empty_like(x), norm_out=torch.empty_like(x), quant_out=None,
                scale_out=None, rms_gamma=_x(H, seed=2), rms_eps=1e-6, scale_factor=None,
                layout_code=None)
    call.update(over)
    comm.trtllm_allreduce_fusion(**call)
    return call


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_trtllm_allreduce_fusion_is_allreduce_fusion(world_of_one):
    handles, ws, meta = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
        0, 1, 8, H, create_metadata=True)
    with flashinfer.record_decisions() as log:
        call = _fusion_call(ws, metadata=meta, weight_bias=1.0)
    assert [d.problem.op for d in log] == ["allreduce_fusion"]
    assert log[0].problem.features == {"residual_rmsnorm", "gemma_weight"}
    uws = comm.create_allreduce_fusion_workspace("auto", 1, 0, 8, H, torch.bfloat16)
    want = comm.allreduce_fusion(call["allreduce_in"].view(T, H), uws, 1,
                                 residual_in=call["residual_in"].view(T, H),
                                 rms_gamma=call["rms_gamma"], weight_bias=1.0)
    assert torch.equal(call["norm_out"].view(T, H), want)
    q = torch.empty(T * H, dtype=torch.float8_e4m3fn)
    _fusion_call(ws, pattern_code=P.kARResidualRMSNormFP8Quant, norm_out=None, quant_out=q,
                 scale_factor=0.25, rms_eps=None, weight_bias=None)
    bad = [
        (TypeError, "workspace_ptrs must be the workspace that", dict(workspace_ptrs=handles)),
        (ValueError, "world_size=2, world_rank=0 do not match the workspace",
         dict(world_size=2)),
        (ValueError, r"token_num \* hidden_dim = 9 \* 128 exceeds the workspace's 8 \* 128",
         dict(token_num=9, allreduce_in=_x(9 * H))),
        (ValueError, r"use_fp32_lamport=True does not match allreduce_in's dtype",
         dict(metadata={**meta, "use_fp32_lamport": True})),
        (ValueError, r"workspace metadata is missing \['tp_size'\]",
         dict(metadata={k: v for k, v in meta.items() if k != "tp_size"})),
        (ValueError, "kARResidualRMSNorm needs residual_out", dict(residual_out=None)),
        (ValueError, "kARResidualRMSNorm needs norm_out", dict(norm_out=None)),
        (ValueError, "kAllReduce needs allreduce_out", dict(pattern_code=0)),
        (ValueError, r"residual_in must hold token_num \* hidden_dim = 3 \* 128 elements",
         dict(residual_in=_x(H))),
        (ValueError, "norm_out must be contiguous",
         dict(norm_out=torch.empty(T * H // 2, 2, dtype=torch.bfloat16).t())),
        (NotImplementedError, "kARResidualRMSNormOutFP4Quant .5. has no kernel here",
         dict(pattern_code=P.kARResidualRMSNormOutFP4Quant)),
    ]
    for error, message, over in bad:
        with pytest.raises(error, match=message):
            _fusion_call(ws, **over)
    comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(handles)
    with pytest.raises(RuntimeError, match="destroyed"):
        _fusion_call(ws)


def _custom_call(peers, **over):
    ptr = torch.tensor(peers[0], dtype=torch.int64)
    x = _x(T * H)
    call = dict(inp=x, out=torch.full_like(x, float("nan")), tp_size=1, tp_rank=0, token_num=T,
                fusion_op_code=comm.AllReduceFusionOp.NONE,
                strategy_code=comm.AllReduceStrategyType.AUTO, config_code=0,
                launch_with_pdl=False, flag_value=1, peer_comm_buffer_ptrs=ptr,
                peer_barrier_ptrs_in=ptr, peer_barrier_ptrs_out=ptr, bias=None, residual=None,
                weight=None, weight_pre_residual_norm=None, eps=None, intermediate_buffer=None,
                lamport_peer_comm_buffer_ptrs_0=None, lamport_peer_comm_buffer_ptrs_1=None,
                lamport_peer_comm_buffer_ptrs_2=None)
    call.update(over)
    comm.trtllm_custom_all_reduce(**call)
    return call


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_trtllm_custom_all_reduce(world_of_one):
    with pytest.warns(DeprecationWarning):
        peers = comm.trtllm_create_ipc_workspace_for_all_reduce(0, 1, 16, H)
    assert len(peers) == 7 and peers.workspace.sizes["flag_size"] == 25 * 4 * 2
    comm.trtllm_lamport_initialize_all(peers[4][0], peers[5][0], peers[6][0], 64, torch.float16)
    comm.trtllm_lamport_initialize(peers[4][0], 64, torch.bfloat16)
    with flashinfer.record_decisions() as log:
        call = _custom_call(peers, bias=_x(H, seed=5))  # (NONE ignores the bias, as upstream)
    assert torch.equal(call["out"], call["inp"])
    assert [d.problem.op for d in log] == ["allreduce_fusion"]
    inter = torch.empty(T * H, dtype=torch.bfloat16)
    call = _custom_call(peers, fusion_op_code=comm.AllReduceFusionOp.RESIDUAL_RMS_NORM,
                        residual=_x(T, H, seed=3), weight=_x(H, seed=4), bias=_x(H, seed=5),
                        intermediate_buffer=inter)
    h = call["inp"].double().view(T, H) + call["residual"].double() + call["bias"].double()
    norm = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-5) * call["weight"].double()
    assert rel_error(inter.view(T, H), h) < 1e-2 and rel_error(call["out"].view(T, H), norm) < 1e-2
    bad = [
        (NotImplementedError, "fusion op RESIDUAL_RMS_PREPOST_NORM has no kernel here",
         dict(fusion_op_code=comm.AllReduceFusionOp.RESIDUAL_RMS_PREPOST_NORM)),
        (ValueError, r"strategy_code must be one of AllReduceStrategyType's codes .*got 9",
         dict(strategy_code=9)),
        (ValueError, r"config_code must be one of AllReduceStrategyConfig's codes .*got 4",
         dict(config_code=4)),
        (ValueError, "RESIDUAL_RMS_NORM needs residual and weight",
         dict(fusion_op_code=comm.AllReduceFusionOp.RESIDUAL_RMS_NORM)),
        (ValueError, "inp and out must have one dtype and size",
         dict(out=torch.empty(T * H, dtype=torch.float16))),
        (ValueError, "do not match the process group", dict(tp_size=2)),
    ]
    for error, message, over in bad:
        with pytest.raises(error, match=message):
            _custom_call(peers, **over)
    with pytest.raises(ValueError, match="size must be an int >= 0, got -1"):
        comm.trtllm_lamport_initialize(0, -1, torch.float16)
    with pytest.raises(TypeError, match="dtype must be float16, bfloat16 or float32"):
        comm.trtllm_lamport_initialize_all(0, 0, 0, 8, torch.int8)
    comm.trtllm_destroy_ipc_workspace_for_all_reduce(peers)


def test_moe_fusions_are_refused_saying_what_to_do():
    with pytest.raises(NotImplementedError, match="trtllm_moe_allreduce_fusion: .*sum the "
                                                  "experts' outputs"):
        comm.trtllm_moe_allreduce_fusion(*[None] * 20)
    with pytest.raises(NotImplementedError, match="trtllm_moe_finalize_allreduce_fusion: .*"
                                                  "kARResidualRMSNorm"):
        comm.trtllm_moe_finalize_allreduce_fusion(*[None] * 16)


def test_vllm_custom_all_reduce(world_of_one):
    fa = comm.vllm_init_custom_ar([0], torch.empty(8, dtype=torch.uint8), 0, False)
    assert isinstance(fa, int) and fa != 0
    comm.vllm_register_buffer(fa, [12345])
    assert comm.vllm_get_graph_buffer_ipc_meta(fa) == ([], [])
    comm.vllm_register_graph_buffers(fa, [[]], [[]])
    x = _x(2, 3, H)
    out = torch.full_like(x, float("nan"))
    with flashinfer.record_decisions() as log:
        comm.vllm_all_reduce(fa, x, out, 0, 0, 8)
    assert torch.equal(out, x) and [d.problem.op for d in log] == ["allreduce_fusion"]
    comm.vllm_all_reduce(fa, x, out.view(-1), 7, x.numel() * 2, 1)  # (out of another shape)
    bad = [
        (ValueError, "inp and out must be non-empty, of one dtype and size",
         (x, out.float(), 0, 0, 8)),
        (ValueError, r"the registered buffer \(10 bytes\) cannot hold inp \(1536 bytes\)",
         (x, out, 1, 10, 8)),
        (ValueError, "num_ctas must be >= 1, got 0", (x, out, 0, 0, 0)),
        (TypeError, "reg_buffer must be an int", (x, out, None, 0, 8)),
        (ValueError, "out must be contiguous", (x, torch.empty_like(x).transpose(0, 2), 0, 0, 8)),
    ]
    for error, message, args in bad:
        with pytest.raises(error, match=message):
            comm.vllm_all_reduce(fa, *args)
    with pytest.raises(ValueError, match=r"fake_ipc_ptrs must be a list of 1 ints"):
        comm.vllm_register_buffer(fa, [1, 2])
    with pytest.raises(ValueError, match=r"handles must be a list of 1 lists"):
        comm.vllm_register_graph_buffers(fa, [], [])
    with pytest.raises(ValueError, match="do not match the process group"):
        comm.vllm_init_custom_ar([0, 0], torch.empty(8), 0, True)
    with pytest.raises(TypeError, match="rank_data must be a torch.Tensor"):
        comm.vllm_init_custom_ar([0], None, 0, True)
    comm.vllm_dispose(fa)
    with pytest.raises(ValueError, match="fa must be a live handle"):
        comm.vllm_all_reduce(fa, x, out, 0, 0, 8)
