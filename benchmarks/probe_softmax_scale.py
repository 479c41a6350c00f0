"""Which softmax scales each single-prefill backend computes without NaN (H200 probe)."""
import torch, flashinfer
from flashinfer.dispatch import BackendUnavailableError, NoBackendError
torch.manual_seed(0)
for be in ("flash_attn:fa3", "cudnn", "torch:flash_varlen", "torch:sdpa_efficient", "reference"):
    for causal in (True, False):
        row = []
        for scale in (30.0, 100.0, 300.0, 1e3, 3e3, 1e4):
            q = torch.randn(64, 8, 128, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(300, 2, 128, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(300, 2, 128, device="cuda", dtype=torch.bfloat16)
            try:
                o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, sm_scale=scale, backend=be)
                row.append(f"{scale:g}:{'ok' if bool(torch.isfinite(o).all()) else 'NaN'}")
            except (BackendUnavailableError, NoBackendError) as e:
                row.append(f"{scale:g}:n/a")
        print(be, "causal" if causal else "full", " ".join(row), flush=True)
