"""First MLA plan() + run() in a fresh process (what a user feels: imports, kernel loads or
compiles): ``python benchmarks/mla_first_call.py PAGE HEADS``, DeepSeek shapes, batch 16, kv
4096, bf16, auto. Run each case in a process of its own, with a cold Triton cache to see a
compile (``TRITON_CACHE_DIR`` pointing at an empty directory)."""
import sys, time
t0 = time.perf_counter()
import torch
import flashinfer
page, heads = int(sys.argv[1]), int(sys.argv[2])
kv_dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
b, kv = 16, 4096
pe = -(-kv // page)
cache = torch.randn(b * pe, page, 576, device="cuda").to(kv_dtype)
q = torch.randn(b, heads, 576, device="cuda", dtype=torch.bfloat16)
t1 = time.perf_counter()
w = flashinfer.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
w.plan(torch.arange(b + 1, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32) * pe,
       torch.randperm(b * pe, dtype=torch.int32), torch.full((b,), kv, dtype=torch.int32), heads, 512, 64, page, False, 192 ** -0.5, torch.bfloat16, kv_dtype)
scales = dict(ckv_scale=1.0, kpe_scale=1.0) if kv_dtype == torch.float8_e4m3fn else {}
w.run(q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:], **scales)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"page={page} heads={heads} kv={kv_dtype} kernel={w.decision.name} first plan+run {t2 - t1:.2f} s (imports and inputs {t1 - t0:.2f} s)")
