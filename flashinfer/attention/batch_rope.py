"""``pos_encoding_mode="ROPE_LLAMA"`` in the batch wrappers on kernels that do not rotate.

The rule is :mod:`.positions`'s: a kernel other than the reference that applies RoPE itself
serves the call as planned; else, when the dispatcher's choice for the same batch without
positional encoding is not the reference, the wrapper keeps a *rotated* plan: a ragged prefill
plan of the same requests (same query rows, keys as one row per key, same causal / window /
soft cap / mask / scale / dtypes, no positional encoding), and each ``run()`` gathers the keys
and values it reads into rows (paged caches: one gather per operand), rotates q (row ``r`` of a
request at ``kv_len - qo_len + r``) and the key rows (key ``j`` at ``j``) with the ``rope`` op,
and runs that plan. FP8 keys and values are converted to the query dtype on the way (the
scales still apply: RoPE is linear). Else the reference rotates inside its kernel.

Not for CUDA-graph wrappers: the rotated plan's arrays are not the wrapper's fixed buffers, so
such a plan keeps the reference (which then refuses the capture, as it does today).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import dispatch
from . import positions
from .batch_checks import FP8_DTYPES, DeviceIdsCheck, largest_page_id
from .batch_params import BatchPlan, KVInput


class RotatedBatch:
    """A ragged plan of the batch without positional encoding and what ``run()`` gathers and
    rotates for it. ``rows``: for paged caches, ``(page id, slot)`` of every key row
    (``[total_kv]`` int64 on the device); ``None`` for ragged K/V (rows ``[0, total_kv)``)."""

    def __init__(self, ragged, plan: BatchPlan, q_pos: torch.Tensor, k_pos: torch.Tensor,
                 rows: tuple[torch.Tensor, torch.Tensor] | None, total_kv: int):
        self.ragged, self.plan = ragged, plan
        self.q_pos, self.k_pos, self.rows, self.total_kv = q_pos, k_pos, rows, total_kv
        # the rope kernels, chosen here: run() decides nothing
        kv_dtype = plan.q_dtype if plan.kv_dtype in FP8_DTYPES else plan.kv_dtype
        self.rotate_q = positions.rope_kernel(plan.device, plan.q_dtype, plan.total_qo,
                                              plan.num_qo_heads, plan.head_dim_qk)
        self.rotate_k = positions.rope_kernel(plan.device, kv_dtype, total_kv,
                                              plan.num_kv_heads, plan.head_dim_qk)

    @property
    def decision(self) -> dispatch.Decision:
        return self.ragged.decision

    def run(self, q: torch.Tensor, kv: KVInput, q_scale, k_scale, v_scale, out, lse,
            return_lse: bool, sinks):
        plan = self.plan
        if self.rows is None:  # ragged K/V: NHD row views
            k, v = kv.k[:self.total_kv], kv.v[:self.total_kv]
        elif plan.kv_layout == "NHD":  # [pages, page_size, H, D]
            k, v = kv.k[self.rows], kv.v[self.rows]
        else:  # HND [pages, H, page_size, D]: page and slot index around the head dim
            page, slot = self.rows
            k, v = kv.k[page, :, slot], kv.v[page, :, slot]
        if k.dtype in FP8_DTYPES:
            k, v = k.to(plan.q_dtype), v.to(plan.q_dtype)
        q = positions.rotate(q, self.q_pos, plan.rope_scale, plan.rope_theta, self.rotate_q)
        k = positions.rotate(k, self.k_pos, plan.rope_scale, plan.rope_theta, self.rotate_k)
        return self.ragged.run(q, k, v, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                               out=out, lse=lse, return_lse=return_lse, sinks=sinks)


def plan_rotation(wrapper, plan: BatchPlan, kv_indices: torch.Tensor | None, ragged_cls
                  ) -> RotatedBatch | None:
    """The rotated plan of a ROPE_LLAMA ``plan`` (see the module docstring), or ``None`` when
    the plan runs as it is: a kernel that rotates serves it, the plain choice is the
    reference, or the wrapper is a CUDA-graph one. ``kv_indices``: the paged plan's page ids
    (host or device; ``None`` for the ragged op); ``ragged_cls``: the ragged prefill wrapper."""
    if plan.cuda_graph:
        return None
    extras, problems, _ = wrapper._make_problems(plan)
    try:
        native = dispatch.decide(problems[extras.index(frozenset())], wrapper._backend)
        if native.backend != "reference":
            return None
    except dispatch.NoBackendError:
        pass  # e.g. strict mode on a GPU; the plain choice below decides
    qo_h = plan.qo_indptr_host.numpy().astype(np.int64)
    kv_lens = plan.kv_lens_host.numpy().astype(np.int64)
    kv_rows = np.zeros(plan.batch_size + 1, dtype=np.int32)
    kv_rows[1:] = np.cumsum(kv_lens)
    ragged = ragged_cls(wrapper._float_workspace_buffer, "NHD", backend=wrapper._backend)
    kv_dtype = plan.q_dtype if plan.kv_dtype in FP8_DTYPES else plan.kv_dtype
    ragged.plan(plan.qo_indptr_host, torch.from_numpy(kv_rows), plan.num_qo_heads,
                plan.num_kv_heads, plan.head_dim_qk, plan.head_dim_vo,
                custom_mask=plan.custom_mask, causal=plan.causal,
                window_left=plan.window_left, logits_soft_cap=plan.logits_soft_cap or None,
                sm_scale=plan.sm_scale, q_data_type=plan.q_dtype, kv_data_type=kv_dtype,
                o_data_type=plan.o_dtype)
    if not positions.runs_rotated(ragged.decision):
        return None  # the reference rotates inside, on the plan as it is
    dev = plan.device
    qo_lens = qo_h[1:] - qo_h[:-1]
    q_pos = np.concatenate([np.arange(n - m, n) for m, n in zip(qo_lens, kv_lens)] or [[]])
    local = np.concatenate([np.arange(n) for n in kv_lens] or [[]]).astype(np.int64)
    rows = None
    if plan.page_size:
        starts = plan.kv_indptr_host.numpy().astype(np.int64)[:-1]
        where = np.repeat(starts, kv_lens) + local // plan.page_size  # index into kv_indices
        page = kv_indices.to(dev)[torch.from_numpy(where).to(dev)].long()
        rows = (page, torch.from_numpy(local % plan.page_size).to(dev))
    return RotatedBatch(ragged, plan, torch.from_numpy(q_pos.astype(np.int64)).to(dev),
                        torch.from_numpy(local).to(dev), rows, int(kv_rows[-1]))


def adopt(wrapper, plan: BatchPlan, rotation: RotatedBatch, max_page, kv_indices) -> None:
    """Make ``rotation`` the wrapper's plan (its runner is the rotated ragged plan)."""
    if isinstance(max_page, DeviceIdsCheck):  # device page ids: checked here, one copy back
        max_page = largest_page_id(kv_indices.cpu().numpy(), max_page.name)
    wrapper._plan, wrapper._choices, wrapper.decision = plan, {}, rotation.decision
    wrapper._runners, wrapper._max_page, wrapper._rotation = {}, max_page, rotation


__all__ = ["RotatedBatch", "adopt", "plan_rotation"]
