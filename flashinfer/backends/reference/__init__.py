"""Reference backend: pure PyTorch, float32 accumulation, CPU and GPU; the test oracle. One
module per op family; the capability records name the kernel functions in them."""
