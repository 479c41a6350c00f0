"""Print the facts of a GPU machine that the adapters depend on (schemas, versions)."""
import inspect
import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
for name in ("_flash_attention_forward", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention",
             "_efficient_attention_forward"):
    print(name, getattr(torch.ops.aten, name).default._schema)
try:
    import triton
    print("triton", triton.__version__)
except Exception as e:
    print("triton import failed", e)
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version())
    print("sdpa doc:", (cudnn.pygraph.sdpa.__doc__ or "")[:3000])
except Exception as e:
    print("cudnn import failed", type(e).__name__, e)
q = torch.randn(128, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(256, 8, 128, device="cuda", dtype=torch.bfloat16)
cu_q = torch.tensor([0, 128], device="cuda", dtype=torch.int32)
cu_k = torch.tensor([0, 256], device="cuda", dtype=torch.int32)
try:
    out = torch.ops.aten._flash_attention_forward(q, k, k, cu_q, cu_k, 128, 256, 0.0, True, False,
                                                  scale=0.1, window_size_left=32, window_size_right=0)
    print("flash varlen ok", out[0].shape, out[1].shape, out[1].dtype)
except Exception as e:
    print("flash varlen failed", type(e).__name__, str(e)[:500])
