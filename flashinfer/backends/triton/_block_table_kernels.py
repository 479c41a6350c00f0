"""@triton.jit kernel that turns CSR page ids into a fixed-width block table (imported on first
use by :mod:`flashinfer.backends.shared.block_table`).

:func:`block_table_kernel`, grid ``(batch,)``: program ``b`` copies request ``b``'s page ids
``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]`` into row ``b`` of ``table [batch, width]``,
in blocks of ``BLOCK``. An id outside ``[0, num_pages)`` is recorded in the device's error
record (rule ``page_code``, the entry of ``kv_indices`` it came from) and written as page 0, so
the kernel that reads the table stays inside the cache. Entries past a request's pages are left
as they are (the reader never looks at them); reads stay inside the first ``capacity`` ids and
writes inside the row.
"""

import triton
import triton.language as tl

from ._fault_kernels import report_faults


# the width, the page count and the capacity change with the caches and buffers: not
# specialised on, so one compile serves every wrapper
@triton.jit(do_not_specialize=["width", "num_pages", "capacity", "page_code"])
def block_table_kernel(kv_indptr_ptr, kv_indices_ptr, table_ptr, err_ptr, width, num_pages,
                       capacity, page_code, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(kv_indptr_ptr + b)
    count = tl.minimum(tl.load(kv_indptr_ptr + b + 1) - start, width)
    row = table_ptr + b.to(tl.int64) * width
    for j0 in range(0, count, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        entry = start + j
        ok = (j < count) & (entry >= 0) & (entry < capacity)
        page = tl.load(kv_indices_ptr + entry, mask=ok, other=0)
        bad = ok & ((page < 0) | (page >= num_pages))
        n_bad = tl.sum(bad.to(tl.int32), 0)
        if n_bad > 0:
            first_bad = tl.min(tl.where(bad, entry, 2147483647), 0)
            value = tl.max(tl.where(bad & (entry == first_bad), page, -2147483647), 0)
            report_faults(err_ptr, page_code, first_bad, value, num_pages, n_bad)
        tl.store(row + j, tl.where(bad, 0, page), mask=j < count)
