"""Upstream's module path ``flashinfer.jit``. Nothing is compiled on a call here (the kernels are
vendor libraries, torch's, or Triton kernels shipped compiled in kernel packs), so this package
keeps only the probes engines call: :func:`flashinfer.jit.core.check_cuda_arch`."""
