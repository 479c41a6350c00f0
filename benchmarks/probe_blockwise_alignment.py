"""Which (N, K) torch._scaled_mm takes with DeepSeek block-wise scales (1x128 activations, 128x128
weights) on this GPU, and its error against float32 math on the same fp8 values."""
import torch
from flashinfer import quantization as Q
for n, k in [(576, 7168), (144, 512), (200, 512), (576, 7232), (96, 256)]:
    a = torch.randn(64, k, device="cuda"); w = torch.randn(n, k, device="cuda") / k**0.5
    try:
        aq, a_s = Q.quantize_fp8_blockwise(a, (1, 128)); wq, w_s = Q.quantize_fp8_blockwise(w, (128, 128))
        out = torch._scaled_mm(aq, wq.t(), a_s.t().contiguous().t(), w_s.contiguous().t(), out_dtype=torch.bfloat16)
        ref = (aq.float() * a_s.repeat_interleave(128, 1)[:, :k]) @ (wq.float() * w_s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]).t()
        print(n, k, "ok rel", float((out.float() - ref).norm() / ref.norm()))
    except Exception as e:
        print(n, k, "ERR", str(e).splitlines()[0][:120])
