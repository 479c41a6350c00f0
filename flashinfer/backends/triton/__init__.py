"""Triton backend: our own kernels. Triton is imported lazily, when a kernel first runs, because
the dispatcher imports these modules while choosing, also on machines without Triton.

Each op family's kernel functions (launch configuration, the functions the capability records
name) live in ``<family>.py``; the @triton.jit kernels themselves sit in ``_<family>_kernels.py``
modules that only the kernel functions import.
"""
