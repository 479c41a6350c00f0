"""Host cost of the MLA wrapper's run() and plan() against FlashMLA called directly (cProfile)."""
import cProfile, pstats, sys, time
import torch
import flashinfer
from flash_mla import flash_mla_with_kvcache, get_mla_metadata

def main():
    for heads, b, kv, backend in ((128, 1, 1024, "flashmla"), (16, 64, 4096, "flashmla"), (128, 128, 4096, "flashmla"), (128, 128, 4096, "triton")):
        page = 64; pe = -(-kv // page)
        cache = torch.randn(b * pe, page, 576, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(b, heads, 576, device="cuda", dtype=torch.bfloat16)
        arrays = (torch.arange(b + 1, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32) * pe,
                  torch.randperm(b * pe, dtype=torch.int32), torch.full((b,), kv, dtype=torch.int32))
        w = flashinfer.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), backend=backend)
        plan = lambda: w.plan(*arrays, heads, 512, 64, page, False, 192 ** -0.5, torch.bfloat16, torch.bfloat16)
        plan()
        args = (q[..., :512], q[..., 512:], cache[..., :512], cache[..., 512:])
        run = lambda: w.run(*args)
        meta, _ = get_mla_metadata()
        table = arrays[2].view(b, -1).cuda(); lens = arrays[3].cuda(); qd = q.view(b, 1, heads, 576); kc = cache.unsqueeze(2)
        direct = lambda: flash_mla_with_kvcache(qd, kc, table, lens, 512, meta, softmax_scale=0.07, use_legacy=True)
        for name, fn in (("run", run), ("direct", direct), ("plan", plan)):
            for _ in range(20): fn()
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(200): fn()
            host = (time.perf_counter() - t) / 200 * 1e6
            torch.cuda.synchronize(); total = (time.perf_counter() - t) / 200 * 1e6
            print(f"H={heads} B={b} kv={kv} {backend} {name}: host {host:.1f} us, with sync {total:.1f} us", flush=True)
        g = torch.cuda.CUDAGraph()
        for name, fn in (("run", run), ("direct", direct)):
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            fn(); torch.cuda.synchronize()
            s.record(); [fn() for _ in range(50)]; e.record(); torch.cuda.synchronize()
            print(f"   {name} events {s.elapsed_time(e) / 50 * 1e3:.1f} us/call", flush=True)

main()
