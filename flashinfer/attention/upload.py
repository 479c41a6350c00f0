"""One host-to-device copy per plan(): the index arrays a batch plan needs on the device.

A plan needs ``qo_indptr``, ``kv_indptr``, ``kv_lens``, ``kv_last_page_len`` and the page ids on
the device, and a two-phase planner may add arrays of its own (cuDNN decode: ``seq_len_kv`` and
the page-table source, see ``batch_params.Prepared``). Copied one by one that is a
``cudaMemcpyAsync`` from pageable memory each (a staged, partly blocking copy) and an allocation
each: most of a plan's host time at batch 64. :class:`PlanUpload` packs the host arrays (numpy
or CPU tensors) into a pinned buffer and copies them with one non-blocking copy into one device
buffer the wrapper owns; the returned tensors are views of it (cached: a serving loop repeats
its layout). When every array is numpy and none has a fixed buffer (the common plan), each sits
in a slot of a power of two entries, so the offsets hold while a serving loop's page counts
vary from step to step, and the layout's offsets are worked out once.

Arrays already on the device (page ids kept there by the caller) travel through the same pinned
buffer: one device-to-host copy into their slot, queued before the host-to-device copy on the
same stream (so it lands first). That snapshots them (a later change to the caller's tensor
does not change the planned batch) and leaves a host copy that plan() bounds-checks
(:meth:`PlanUpload.host_copy`), for the price of one copy launch: a device-to-device copy, and
a second one for a tail, plus a separate copy to the host for the check, cost about three
times that in plan() on the H200's host (``benchmarks/plan_timeline.py``).

Lifetime: the views stay valid until the wrapper's next plan(), which overwrites the buffer, as
upstream's plan() overwrites its int workspace. The copy is queued on the current stream, after
the runs of the previous plan. The pinned buffers form a ring that grows (up to
:data:`RING_MAX`) while each of its buffers still has a copy waiting in the stream, so a host
that runs steps ahead of the GPU is not held back by an earlier plan's copy; only when all are
busy is the oldest copy waited for (an event).

A CUDA-graph wrapper hands its fixed buffers in ``fixed``: those arrays are copied into them
(from the pinned buffer), because a captured run reads those exact addresses.
"""

from __future__ import annotations

import numpy as np
import torch

from .batch_params import Tail

#: alignment of every array in the packed buffers, in int32 elements (256 bytes: what cuDNN
#: wants of the operands a planner sends along, see ``Prepared``)
ALIGN = 64
#: the most pinned staging buffers a wrapper keeps (see ``PlanUpload._staging``)
RING_MAX = 16


class PlanUpload:
    """Per-wrapper staging: ``upload(arrays, fixed, non_blocking) -> {name: device tensor}``."""

    def __init__(self, device: torch.device):
        self.device = device
        # a ring of pinned staging buffers, each with the event of the last copy out of it
        # (see _staging): a plan() does not wait for the previous plans' copies, which queue
        # behind the previous steps' kernels when the host runs ahead of the GPU
        self._ring: list[list] = []  # [pinned tensor, its numpy view, event or None]
        self._slot = 0
        self._stream: tuple | None = None  # (raw current-stream key, its Stream object)
        self._buffer: torch.Tensor | None = None
        # views by (which buffer, offset, length): a serving loop plans the same layout over
        # and over, and a tensor slice costs a few microseconds of host time on slow hosts
        self._views: dict[tuple, torch.Tensor] = {}
        self._host_copies: dict[str, np.ndarray] = {}  # the last upload's arrays from the device
        # the offsets of the last all-numpy layout (_upload_numpy): (layout, offsets)
        self._memo: tuple | None = None

    def upload(self, arrays: dict, fixed: dict, non_blocking: bool) -> dict[str, torch.Tensor]:
        """``arrays``: 1-D int32 arrays — numpy, CPU tensors, tensors on ``self.device``, or a
        :class:`Tail` of one; ``fixed``: the fixed buffer of a name, or None / absent (a view of
        this wrapper's buffer is returned)."""
        if self.device.type != "cuda":
            return {name: _into(fixed.get(name), _tensor(t)) for name, t in arrays.items()}
        layout = _numpy_layout(arrays) if all(v is None for v in fixed.values()) else None
        if layout is not None:
            return self._upload_numpy(arrays, layout, non_blocking)
        parts, length = {}, {}
        for name, t in arrays.items():
            array, count = (t.array, t.count) if isinstance(t, Tail) else (t, 0)
            if isinstance(array, torch.Tensor):
                if array.device.type == "cpu":
                    array = array.numpy()
                elif array.device.type != "cuda" or array.device.index != self._index():
                    # its copy to the host would run on another device's stream
                    raise ValueError(f"{name} is on {array.device} but the workspace buffer is "
                                     f"on {self.device}")
            parts[name] = (array, count)
            length[name] = array.shape[0] + count
        # the loose arrays first: they sit at the same offsets in the pinned and the device
        # buffer, so one copy moves them all; then the fixed ones (copied into their buffers)
        order = ([n for n in arrays if fixed.get(n) is None]
                 + [n for n in arrays if fixed.get(n) is not None])
        offset, total, loose_end = {}, 0, 0
        for name in order:
            offset[name] = total
            if fixed.get(name) is None:
                loose_end = total + length[name]
            total += -(-length[name] // ALIGN) * ALIGN
        pinned, flat, event = self._staging(total)
        self._host_copies = {}
        for name, (array, count) in parts.items():
            start, n = offset[name], array.shape[0]
            if isinstance(array, np.ndarray):
                flat[start:start + n] = array
            else:  # from the device, through its pinned slot
                self._view(pinned, start, n).copy_(array, non_blocking=non_blocking)
                self._host_copies[name] = flat[start:start + n]
            if count:
                flat[start + n:start + n + count] = 0
        out = {}
        if order and fixed.get(order[0]) is None:  # loose arrays (first in the order)
            self._device_buffer(max(loose_end, 1))
        if loose_end:
            self._view("device", 0, loose_end).copy_(self._view(pinned, 0, loose_end),
                                                     non_blocking=non_blocking)
        for name in order:
            target, n = fixed.get(name), length[name]
            if target is None:
                out[name] = self._view("device", offset[name], n)
                continue
            if n > target.shape[0]:
                raise ValueError(f"the fixed buffer for {name} holds {target.shape[0]} entries, "
                                 f"the plan needs {n}")
            target[:n].copy_(self._view(pinned, offset[name], n), non_blocking=non_blocking)
            out[name] = target[:n]
        self._record(event)
        return out

    def _upload_numpy(self, arrays: dict, layout: tuple, non_blocking: bool) -> dict:
        """:meth:`upload` of host arrays only (the common plan): each in a slot of a power of
        two entries, so the offsets (and the cached views) stay while the lengths of a serving
        loop's steps vary within their slots; the offsets are worked out once per layout."""
        if self._memo is None or self._memo[0] != layout:
            offsets, total = [], 0
            for _, slot in layout:
                offsets.append(total)
                total += slot
            self._memo = (layout, offsets)
        offsets = self._memo[1]
        end = offsets[-1] + next(reversed(arrays.values())).shape[0] if arrays else 0
        pinned, flat, event = self._staging(end)
        self._host_copies = {}
        for array, start in zip(arrays.values(), offsets):
            flat[start:start + array.shape[0]] = array
        self._device_buffer(max(end, 1))
        if end:
            self._view("device", 0, end).copy_(self._view(pinned, 0, end),
                                               non_blocking=non_blocking)
        out = {name: self._view("device", start, array.shape[0])
               for (name, array), start in zip(arrays.items(), offsets)}
        self._record(event)
        return out

    def _record(self, event: torch.cuda.Event | None) -> None:
        """Records the copy out of the current staging buffer (its event made on first use)."""
        if event is None:
            event = self._ring[self._slot][2] = torch.cuda.Event()
        event.record(self.current_stream())

    def host_copy(self, name: str) -> np.ndarray:
        """The host copy of the last upload's array ``name`` that came from the device (its
        tail left out), once its copy has landed: waits for that upload."""
        self._ring[self._slot][2].synchronize()
        return self._host_copies[name]

    def _view(self, which, start: int, n: int) -> torch.Tensor:
        """``which[start:start + n]`` for ``"device"`` (the wrapper's buffer) or a pinned
        staging tensor, cached."""
        key = (id(which) if isinstance(which, torch.Tensor) else which, start, n)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 256:
                self._views.clear()
            buf = self._buffer if which == "device" else which
            view = self._views[key] = buf[start:start + n]
        return view

    def _index(self) -> int:
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def current_stream(self) -> torch.cuda.Stream:
        """The current stream, rebuilt only when it changed (``torch.cuda.current_stream()``
        builds a Python object per call: several microseconds a plan on a slow host)."""
        index = self._index()
        raw = torch._C._cuda_getCurrentStream(index)
        if self._stream is None or self._stream[0] != raw:
            self._stream = (raw, torch.cuda.current_stream(index))
        return self._stream[1]

    def _staging(self, n: int) -> tuple[torch.Tensor, np.ndarray, torch.cuda.Event | None]:
        """A pinned buffer of the ring whose last copy has finished (at least ``n`` int32;
        tensor, numpy view, event). The ring grows while every buffer still waits in the
        stream (the host runs ahead of the GPU), up to :data:`RING_MAX`; then the oldest copy
        is waited for."""
        count = len(self._ring)
        slot = (self._slot + 1) % count if count else 0
        entry = self._ring[slot] if count else None
        if entry is None or (entry[2] is not None and not entry[2].query() and count < RING_MAX):
            slot = (self._slot + 1) if count else 0
            entry = [None, None, None]
            self._ring.insert(slot, entry)
        elif entry[2] is not None:
            entry[2].synchronize()
        self._slot = slot
        if entry[0] is None or entry[0].shape[0] < n:
            size = max(n, 4096, 0 if entry[0] is None else 2 * entry[0].shape[0])
            if entry[0] is not None:  # its cached views go with it
                self._views = {k: v for k, v in self._views.items() if k[0] != id(entry[0])}
            entry[0] = torch.empty(size, dtype=torch.int32, pin_memory=True)
            entry[1] = entry[0].numpy()
        return entry[0], entry[1], entry[2]

    def _device_buffer(self, n: int) -> None:
        if self._buffer is None or self._buffer.shape[0] < n:
            size = max(n, 4096, 0 if self._buffer is None else 2 * self._buffer.shape[0])
            self._buffer = torch.empty(size, dtype=torch.int32, device=self.device)
            self._views = {k: v for k, v in self._views.items() if k[0] != "device"}


def _numpy_layout(arrays: dict) -> tuple | None:
    """``(name, slot)`` of each array when all are numpy, else None: the slot its length's
    power of two, at least :data:`ALIGN` (so every offset stays aligned)."""
    layout = []
    for name, t in arrays.items():
        if type(t) is not np.ndarray:
            return None
        n = t.shape[0]
        layout.append((name, ALIGN if n <= ALIGN else 1 << (n - 1).bit_length()))
    return tuple(layout)


def _tensor(t) -> torch.Tensor:
    if isinstance(t, Tail):
        t = t.joined()
    return torch.from_numpy(t) if isinstance(t, np.ndarray) else t


def _into(target: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """CPU plans (the reference and Triton's interpreter): a private copy, or the fixed buffer."""
    if target is None:
        return t.clone()
    if t.shape[0] > target.shape[0]:
        raise ValueError(f"a fixed buffer holds {target.shape[0]} entries, the plan needs {t.shape[0]}")
    target[:t.shape[0]].copy_(t)
    return target[:t.shape[0]]


__all__ = ["PlanUpload"]
