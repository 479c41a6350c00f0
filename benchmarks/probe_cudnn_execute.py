"""Host cost of one eager cuDNN batch decode run(): the frontend's execute() called three ways.

    python benchmarks/probe_cudnn_execute.py

A decode wrapper (cudnn backend, 32/8 heads, d128, page 16) is planned and run once; then its
graph's ``execute()`` is timed with the variant pack keyed by Tensor handles (what the adapter
does), keyed by uid, and in the ordered form (``tensor_uids=``), and the whole ``run()``. Host
time per call: 300 calls back to back, one synchronisation at the end (at batch 1-16 the GPU
work is shorter, so this is what an eager caller waits for).
"""

from __future__ import annotations

import time

import torch

import flashinfer

HQ, HKV, D, PAGE = 32, 8, 128, 16


def per_call_us(fn, n=300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    print("batch kv   run()  execute(handles)  execute(uids)  execute(ordered)   [us per call]")
    for b, kv in ((1, 512), (16, 512), (64, 4096)):
        pages_per = -(-kv // PAGE)
        total = b * pages_per
        cache = torch.randn(total, 2, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16)
        indices = torch.randperm(total, dtype=torch.int64).to(torch.int32)
        indptr = torch.arange(b + 1, dtype=torch.int32) * pages_per
        last = torch.full((b,), kv - (pages_per - 1) * PAGE, dtype=torch.int32)
        ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="cudnn")
        w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.bfloat16)
        q = torch.randn(b, HQ, D, device="cuda", dtype=torch.bfloat16)
        out = w.run(q, cache)
        ref = out.clone()
        runner = next(iter(w._runners.values()))
        entry = runner._last[1]
        from flashinfer.backends.cudnn._batch_graphs import _binding, _workspace, container
        bound = _binding(0)
        t, buf, h = runner.buffers.tensors, runner.buffers, entry.handles
        k, v = container(cache[:, 0], "NHD"), container(cache[:, 1], "NHD")
        q_in, o_run = (buf.q_pad, buf.o_pad) if buf.q_pad is not None else (q, out)
        pack = {h["q"]: q_in, h["k"]: k, h["v"]: v, h["o"]: o_run, h["seq_len_q"]: t["seq_len_q"],
                h["seq_len_kv"]: runner.seq_len_kv, h["k_table"]: buf.page_table,
                h["v_table"]: buf.page_table, h["stats"]: buf.stats}
        wsp = _workspace(bound, q.device, entry.workspace_size)
        by_uid = {key.get_uid(): val for key, val in pack.items()}
        uids = list(by_uid)
        datas = list(by_uid.values())
        g = entry.graph
        row = [per_call_us(lambda: w.run(q, cache)),
               per_call_us(lambda: g.execute(pack, wsp, handle=bound.handle)),
               per_call_us(lambda: g.execute(by_uid, wsp, handle=bound.handle))]
        try:
            row.append(per_call_us(lambda: g.execute(datas, wsp, handle=bound.handle, tensor_uids=uids)))
        except Exception as exc:  # noqa: BLE001 - the ordered form is new in cudnn-frontend 1.3x
            print(f"  ordered execute: {type(exc).__name__}: {exc}")
            row.append(float("nan"))
        o_now = buf.o_pad[:b] if buf.o_pad is not None else out
        same = torch.equal(o_now, ref)
        print(f"{b:5d} {kv:5d} " + "  ".join(f"{x:14.1f}" for x in row) + f"   output same: {same}")


if __name__ == "__main__":
    main()
