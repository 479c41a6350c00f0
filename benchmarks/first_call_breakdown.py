import time, sys, importlib
t0=time.perf_counter()
import torch
t1=time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2=time.perf_counter()
import flashinfer
t3=time.perf_counter()
mod = sys.argv[1] if len(sys.argv) > 1 else ""
if mod:
    importlib.import_module(mod)
t4=time.perf_counter()
HQ,HKV,D=32,8,128
b,kv=4,4096
qo=torch.arange(b+1,dtype=torch.int32)*kv
q=torch.randn(b*kv,HQ,D,device="cuda",dtype=torch.bfloat16)
k=torch.randn(b*kv,HKV,D,device="cuda",dtype=torch.bfloat16); v=torch.randn_like(k)
ws=torch.empty(256*2**20,dtype=torch.uint8,device="cuda")
torch.cuda.synchronize()
t5=time.perf_counter()
w=flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws,"NHD")
w.plan(qo,qo,HQ,HKV,D,causal=True,q_data_type=torch.bfloat16)
t6=time.perf_counter()
w.run(q,k,v); torch.cuda.synchronize()
t7=time.perf_counter()
w.run(q,k,v); torch.cuda.synchronize()
t8=time.perf_counter()
print(f"import torch {t1-t0:.2f}s cuda init {t2-t1:.2f}s import flashinfer {t3-t2:.2f}s import {mod or '-'} {t4-t3:.2f}s plan {t6-t5:.2f}s first run {t7-t6:.2f}s second run {t8-t7:.3f}s chosen {w.decision.name}")
