"""Temporary probe (not committed): where the host time of each overhead row goes."""
import json, os, sys, time, statistics
import torch
sys.path.insert(0, os.path.dirname(__file__))
import overhead as oh
import flashinfer
from flashinfer import dispatch

def us(fn, calls=300, reps=7):
    for _ in range(30): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s = time.perf_counter()
        for _ in range(calls): fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - s) / calls * 1e6)
    return round(statistics.median(ts), 2)

def ops_of(fn):
    from torch.profiler import profile, ProfilerActivity
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(); torch.cuda.synchronize()
    cpu = [(e.key, e.count) for e in prof.key_averages() if e.device_type.name == "CPU"]
    return cpu

out = {}
def rec(k, v):
    out[k] = v; print(k, v, flush=True)

for row in oh.ROWS:
    t = oh._inputs(row)
    fn = oh._public_call(flashinfer, row, t, False)
    try:
        rec(f"{row}.ops", ops_of(fn))
    except Exception as e:
        rec(f"{row}.ops_error", repr(e))

# rmsnorm pieces
t = oh._inputs("rmsnorm"); x, w, o = t["x"], t["w"], t["out"]
rec("rms.ours", us(lambda: flashinfer.rmsnorm(x, w, out=o)))
k = dispatch.kernel_for("triton", "rmsnorm")
rec("rms.adapter_2d", us(lambda: k(x, w, o, None, 1e-6, 0.0)))
rec("rms.torch_F_rms_norm", us(lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)))
try:
    f = torch.ops.aten._fused_rms_norm
    rec("rms.aten_fused_rms_norm", us(lambda: f(x, [4096], w, 1e-6)))
except Exception as e:
    rec("rms.aten_fused_err", repr(e))
from flashinfer.backends.triton import _norm_kernels, launch
kern = _norm_kernels.rmsnorm_kernel
args = (x, w, o, x, 8, 1, 4096, x.stride(0), 0, o.stride(0), 0, x.stride(0), 0, 1e-6, 0.0)
kw = dict(HAS_RESIDUAL=False, ROWS=1, BLOCK=4096, SINGLE_PASS=True, num_warps=16)
rec("rms.triton_plain", us(lambda: kern[(8,)](*args, **kw)))
fk = launch.fast(kern)
rec("rms.fastkernel", us(lambda: fk[(8,)](*args, **kw)))
binder = kern.device_caches[0][4]
rec("rms.binder_only", us(lambda: binder(*args, **kw)))
rec("rms.current_device", us(lambda: torch.cuda.current_device()))
rec("rms.raw_stream", us(lambda: torch._C._cuda_getCurrentRawStream(0)))
compiled = next(iter(fk.compiled.values()))
bound = binder(*args, **kw)[0]
vals = tuple(bound.values())
st = torch._C._cuda_getCurrentRawStream(0)
rec("rms.launcher_only", us(lambda: compiled.run(8, 1, 1, st, compiled.function, compiled.packed_metadata, None, None, None, *vals)))
rec("empty_like", us(lambda: torch.empty_like(x)))
rec("x[None]", us(lambda: x[None]))
rec("w.contiguous", us(lambda: w.contiguous()))
# sampling pieces
t = oh._inputs("sampling")
p = t["probs"]
ks = dispatch.kernel_for("triton", "sampling_from_probs", "two_pass")
so = torch.empty(1, dtype=torch.int32, device="cuda"); sv = torch.empty(1, dtype=torch.bool, device="cuda")
rec("samp.ours", us(lambda: flashinfer.sampling.top_k_top_p_sampling_from_probs(p, 50, 0.9)))
rec("samp.adapter", us(lambda: ks(p, so, sv, None, 50, 0.9, None, False, True, 1234, 0)))
for name in ("FLASHINFER_TRITON_FAST_LAUNCH",):
    pass
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_hotpath.json"), "w"), indent=1)
