"""flashinfer.utils: upstream's enums, device queries (on simulated capabilities and toolkits),
its backend heuristics, the integer helpers and their argument checks."""

import pytest
import torch

import flashinfer
from flashinfer import utils as U


def test_enums_have_upstreams_codes():
    assert [U.PosEncodingMode[n] for n in ("NONE", "ROPE_LLAMA", "ALIBI")] == [0, 1, 2]
    assert [int(m) for m in U.MaskMode] == [0, 1, 2, 3] and U.MaskMode.MULTIITEMSCORING == 3
    assert (U.TensorLayout.NHD, U.TensorLayout.HND) == (0, 1)


@pytest.fixture
def gpu(monkeypatch):
    """A simulated CUDA device: set its capability and torch's CUDA toolkit."""
    def make(cc, toolkit="12.8"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.version, "cuda", toolkit)
        monkeypatch.setattr(U, "_capability", lambda index: cc)
        return torch.device("cuda", 0)
    return make


@pytest.mark.parametrize("cc,toolkit,true", [
    ((9, 0), "12.8", {"is_sm90a_supported", "device_support_pdl"}),
    ((9, 0), "12.2", {"device_support_pdl"}),
    ((10, 0), "12.9", {"is_sm100a_supported", "is_sm100f_supported", "is_cvt_rs_supported",
                       "device_support_pdl"}),
    ((10, 0), "12.8", {"is_sm100a_supported", "is_cvt_rs_supported", "device_support_pdl"}),
    ((12, 0), "12.8", {"is_sm120a_supported", "is_sm12x_supported", "device_support_pdl"}),
    ((12, 1), "12.9", {"is_sm121a_supported", "is_sm120f_supported", "is_sm12x_supported",
                       "device_support_pdl"}),
    ((8, 0), "12.8", set()),
])
def test_capability_queries(gpu, cc, toolkit, true):
    device = gpu(cc, toolkit)
    names = ("is_sm90a_supported", "is_sm100a_supported", "is_sm100f_supported",
             "is_sm110a_supported", "is_sm120a_supported", "is_sm120f_supported",
             "is_sm121a_supported", "is_sm12x_supported", "is_cvt_rs_supported",
             "device_support_pdl")
    assert {n for n in names if getattr(U, n)(device)} == true
    assert U.get_compute_capability(device) == cc


def test_a_cpu_build_or_device_supports_nothing(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not U.is_sm90a_supported("cuda:0") and not U.is_sm90a_supported("cpu")
    with pytest.raises(ValueError, match="device must be a CUDA device, got cpu"):
        U.get_compute_capability("cpu")


def test_upstreams_heuristics(gpu):
    h100 = gpu((9, 0))
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    assert U.determine_attention_backend(h100, "NONE", False, False, bf16, bf16) == "fa3"
    assert U.determine_attention_backend(h100, 0, False, True, bf16, bf16) == "fa2"  # mask
    assert U.determine_attention_backend(h100, "ALIBI", False, False, bf16, bf16) == "fa2"
    assert U.determine_attention_backend(h100, 0, False, False, bf16, fp8) == "fa2"
    assert U.determine_attention_backend(h100, 0, False, False, bf16, bf16, head_dim_qk=192,
                                         head_dim_vo=128) == "fa3"
    assert U.determine_attention_backend(h100, 0, False, False, bf16, bf16, head_dim_qk=96,
                                         head_dim_vo=96) == "fa2"
    assert (U.determine_mla_backend(h100), U.determine_gemm_backend(h100)) == ("fa3", "sm90")
    a100 = gpu((8, 0))
    assert (U.determine_attention_backend(a100, 0, False, False, bf16, bf16),
            U.determine_gemm_backend(a100)) == ("fa2", "sm80")


def test_integer_helpers():
    assert [U.next_positive_power_of_2(x) for x in (-3, 0, 1, 2, 3, 64, 65)] == [
        1, 1, 1, 2, 4, 64, 128]
    assert (U.ceil_div(7, 2), U.ceil_div(8, 2), U.round_up(129, 128), U.round_up(0, 4)) == (
        4, 4, 256, 0)
    with pytest.raises(ValueError, match="y must be > 0"):
        U.round_up(3, 0)
    with pytest.raises(TypeError, match="x must be an int"):
        U.next_positive_power_of_2(2.5)


def test_containers_and_errors():
    t = U.FP4Tensor(torch.zeros(4, 8, dtype=torch.uint8), torch.ones(4, 1), 2, (4, 16))
    assert (t.scale_start_index, t.original_shape) == (2, (4, 16))
    assert issubclass(U.BackendSupportedError, Exception) and flashinfer.utils is U


def test_compilation_context_normalises_archs_as_upstream(monkeypatch):
    from flashinfer.compilation_context import CompilationContext

    norm = CompilationContext._normalize_cuda_arch
    assert norm(9, 0) == (9, "0a") and norm(10, 3) == (10, "3a") and norm(8, 6) == (8, "6")
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    assert norm(12, 0) == (12, "0f") and norm(12, 1) == (12, "1a")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(RuntimeError, match="12.9"):
        norm(12, 0)
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0 12.0f 8.6")
    assert CompilationContext().TARGET_CUDA_ARCHS == {(9, "0a"), (12, "0f"), (8, "6")}


def test_check_cuda_arch(monkeypatch):
    from flashinfer.jit.core import check_cuda_arch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0) if i == 0 else (7, 0))
    with pytest.raises(RuntimeError, match="GPU 1 is SM 7.0"):
        check_cuda_arch()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 0))
    assert check_cuda_arch() is None
