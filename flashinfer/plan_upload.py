"""One host-to-device copy per plan(): the index arrays a batch plan needs on the device.

A plan needs ``qo_indptr``, ``kv_indptr``, ``kv_lens``, ``kv_last_page_len`` and the page ids on
the device. Copied one by one that is five ``cudaMemcpyAsync`` from pageable memory (each a
staged, partly blocking copy) and five allocations: most of a plan's host time at batch 64.
:class:`PlanUpload` packs the host arrays into one pinned buffer, reused across plans, and
copies them with one non-blocking copy into one device buffer the wrapper owns; the returned
tensors are views of it. Arrays already on the device (page ids kept there by the caller) are
copied into their slot device to device, which also snapshots them: a later change to the
caller's tensor does not change the planned batch.

Lifetime: the views stay valid until the wrapper's next plan(), which overwrites the buffer, as
upstream's plan() overwrites its int workspace. The copy is queued on the current stream, after
the runs of the previous plan. Before the pinned buffer is refilled, the previous copy out of it
is waited for (an event; normally long finished).

A CUDA-graph wrapper hands its fixed buffers in ``fixed``: those arrays are copied into them
(from the pinned buffer), because a captured run reads those exact addresses.
"""

from __future__ import annotations

import torch

#: alignment of every array in the packed buffers, in int32 elements (64 bytes)
ALIGN = 16


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class PlanUpload:
    """Per-wrapper staging: ``upload(arrays, fixed, non_blocking) -> {name: device tensor}``."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pinned: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None
        self._buffer: torch.Tensor | None = None

    def upload(self, arrays: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor | None],
               non_blocking: bool) -> dict[str, torch.Tensor]:
        """``arrays``: 1-D int32 tensors, on the host or already on ``self.device``; ``fixed``:
        the fixed buffer of a name, or None (a view of this wrapper's buffer is returned)."""
        if self.device.type != "cuda":
            return {name: _into(fixed.get(name), t) for name, t in arrays.items()}
        on_host = {n: t.device.type == "cpu" for n, t in arrays.items()}
        # order: loose host arrays, loose device arrays | fixed host arrays. The loose host
        # arrays then sit at the same offsets in the pinned and the device buffer: one copy.
        loose = sorted((n for n in arrays if fixed.get(n) is None), key=lambda n: not on_host[n])
        pinned_order = [n for n in loose if on_host[n]]
        pinned_order += [n for n in arrays if fixed.get(n) is not None and on_host[n]]
        offset, total = {}, 0
        for name in loose + [n for n in pinned_order if n not in loose]:
            offset[name] = total
            total += _round_up(arrays[name].shape[0])
        staging = self._staging(total)
        flat = staging.numpy()
        for name in pinned_order:
            t = arrays[name]
            flat[offset[name]:offset[name] + t.shape[0]] = t.numpy()

        out = {}
        if loose:
            last = loose[-1]
            device_buf = self._device_buffer(offset[last] + arrays[last].shape[0])
            loose_host = [n for n in loose if on_host[n]]
            if loose_host:
                end = offset[loose_host[-1]] + arrays[loose_host[-1]].shape[0]
                device_buf[:end].copy_(staging[:end], non_blocking=non_blocking)
            for name in loose:
                view = device_buf[offset[name]:offset[name] + arrays[name].shape[0]]
                if not on_host[name]:
                    view.copy_(arrays[name], non_blocking=non_blocking)  # device to device
                out[name] = view
        for name in arrays:
            target = fixed.get(name)
            if target is None:
                continue
            t, n = arrays[name], arrays[name].shape[0]
            if n > target.shape[0]:
                raise ValueError(f"the fixed buffer for {name} holds {target.shape[0]} entries, "
                                 f"the plan needs {n}")
            src = staging[offset[name]:offset[name] + n] if on_host[name] else t
            target[:n].copy_(src, non_blocking=non_blocking)
            out[name] = target[:n]
        if self._copied is None:
            self._copied = torch.cuda.Event()
        self._copied.record()
        return out

    def _staging(self, n: int) -> torch.Tensor:
        """``n`` int32 of the pinned buffer, once the previous copy out of it has finished."""
        if self._copied is not None:
            self._copied.synchronize()
        if self._pinned is None or self._pinned.shape[0] < n:
            size = max(n, 4096, 0 if self._pinned is None else 2 * self._pinned.shape[0])
            self._pinned = torch.empty(size, dtype=torch.int32, pin_memory=True)
        return self._pinned[:n]

    def _device_buffer(self, n: int) -> torch.Tensor:
        if self._buffer is None or self._buffer.shape[0] < n:
            size = max(n, 4096, 0 if self._buffer is None else 2 * self._buffer.shape[0])
            self._buffer = torch.empty(size, dtype=torch.int32, device=self.device)
        return self._buffer


def _into(target: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """CPU plans (the reference and Triton's interpreter): a private copy, or the fixed buffer."""
    if target is None:
        return t.clone()
    if t.shape[0] > target.shape[0]:
        raise ValueError(f"a fixed buffer holds {target.shape[0]} entries, the plan needs {t.shape[0]}")
    target[:t.shape[0]].copy_(t)
    return target[:t.shape[0]]


__all__ = ["PlanUpload"]
