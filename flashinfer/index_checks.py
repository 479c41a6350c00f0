"""Index arrays are data: how a bad entry is caught, and the per-device error record.

The contract (every function that dereferences an index array follows it)
--------------------------------------------------------------------------
* **Index arrays on the host** (CPU tensors, Python lists) are checked on the host before any
  kernel runs: a bad entry raises ``ValueError`` naming the function, the argument as the caller
  spelled it, the first bad entry, its value and what is allowed. No synchronisation is involved.
* **Index arrays on a GPU** are not read back on the hot path (that would wait for the GPU).
  Instead every kernel that dereferences them guards each access: an entry outside its range is
  skipped (nothing is read or written through it) and the first violation is written into this
  device's **error record**, a 4-element int64 tensor. The record becomes a ``ValueError`` at
  the next host-visible point:

  - :func:`check_errors` — explicit; waits for the device, raises, clears the record;
  - ``plan()`` of the batch attention wrappers — a non-blocking look (:func:`poll`) at the copy of
    the record made by the previous ``plan()`` (so a fault surfaces one step later, never with a
    wait);
  - ``FLASHINFER_CHECK_INDICES=1`` (debugging) — every such call reads its index arrays back and
    checks them on the host before launching, so the error is raised by the call itself.

Record layout (int64 ``[4]``): ``[code, key, bound, count]``. ``code`` is the :class:`Fault`
registered for (function, argument, rule), set once by the first reporter (compare-and-swap
from 0); ``key = entry << 32 | (value & 0xffffffff)`` is the minimum over the reporters of that
code, so the record names the lowest bad entry and its value (clamped to int32); ``bound`` is the
allowed bound written by the first reporter, for faults whose bound is the same for every entry;
``count`` counts bad entries seen. Triton kernels report with ``report_fault`` of
``backends/triton/_fault_kernels.py``; torch code with :func:`report_device` (device ops
only, no synchronisation, CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from . import envs

__all__ = ["Fault", "Check", "fault", "record", "report_device", "raise_first", "enforce",
           "check_errors", "clear", "poll", "host_check_wanted"]

INT64_MAX = (1 << 63) - 1
_EMPTY = (0, INT64_MAX, 0, 0)


@dataclass(frozen=True)
class Fault:
    """One kind of bad entry: ``argument`` of ``function`` (the caller's names) broke ``rule``.

    ``rule`` is the allowed set, e.g. ``"a page id in [0, {bound}) (the pages of the cache)"``;
    ``{bound}`` is filled with the bound of the call. ``same_bound`` says the bound is one number
    per call (device reports then keep it); a rule with per-entry bounds has no ``{bound}``, and
    host checks append the entry's bound to it."""

    code: int
    function: str
    argument: str
    rule: str
    same_bound: bool = True

    def message(self, entry: int, value: int, bound, *, on_device: bool, count: int = 1) -> str:
        rule = self.rule
        if "{bound}" in rule:
            rule = rule.format(bound=bound)
        elif bound is not None and not on_device:
            rule += f" (bound of this entry: {bound})"
        text = f"{self.function}: {self.argument}[{entry}] = {value} is out of range; allowed: {rule}"
        if on_device:
            more = f" ({count} bad entries reported since the last check)" if count > 1 else ""
            text += (f"{more}. Found by the kernel on the device, where the bad entries were skipped "
                     "(nothing was read or written through them); run with "
                     "FLASHINFER_CHECK_INDICES=1 to raise at the call itself")
        return text


_FAULTS: list[Fault | None] = [None]  # code 0: no error
_BY_KEY: dict[tuple[str, str, str], Fault] = {}


def fault(function: str, argument: str, rule: str, *, same_bound: bool = True) -> Fault:
    """Register (once) and return the :class:`Fault` of (function, argument, rule)."""
    key = (function, argument, rule)
    found = _BY_KEY.get(key)
    if found is None:
        found = Fault(len(_FAULTS), function, argument, rule, same_bound)
        _FAULTS.append(found)
        _BY_KEY[key] = found
    return found


@dataclass
class Check:
    """The entries of one argument that break one rule, over ``n`` tested items: ``bad`` bool
    ``[n]``, ``values`` ``[n]`` (the offending values), ``bound`` an int or a tensor ``[n]``
    (per-item bounds), ``entries`` the index into the argument of each item (default: the item
    itself, ``arange(n)``; e.g. the page-table slot a token looked up)."""

    fault: Fault
    bad: torch.Tensor
    values: torch.Tensor
    bound: int | torch.Tensor | None = None
    entries: torch.Tensor | None = None


# --------------------------------------------------------------------------------------------
# the record


_RECORDS: dict[torch.device, torch.Tensor] = {}


def _canonical(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def record(device) -> torch.Tensor:
    """This device's error record (int64 ``[4]``), created on first use.

    Created during a CUDA-graph capture, it is allocated and cleared on a side stream so that
    neither the memory nor the clearing becomes part of the graph."""
    device = _canonical(device)
    rec = _RECORDS.get(device)
    if rec is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            side = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                rec = torch.zeros(4, dtype=torch.int64, device=device)
                rec[1].fill_(INT64_MAX)
        else:
            rec = torch.tensor(_EMPTY, dtype=torch.int64, device=device)
        _RECORDS[device] = rec
    return rec


def _pack(entry: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return (entry << 32) | (values.long().clamp(-(1 << 31), (1 << 31) - 1) & 0xFFFFFFFF)


def report_device(check: Check) -> None:
    """Merge ``check`` into the record of its device with device ops only (no sync)."""
    bad = check.bad.reshape(-1)
    if bad.numel() == 0:
        return
    rec = record(bad.device)
    entry = (torch.arange(bad.numel(), device=bad.device) if check.entries is None
             else check.entries.reshape(-1).long())
    keys = torch.where(bad, _pack(entry, check.values.reshape(-1)), INT64_MAX)
    item = keys.argmin().view(1)  # indexing by a 0-d tensor would read it back (a sync)
    key = keys.index_select(0, item).squeeze(0)
    code = rec[0]
    won = (code == 0) & (key != INT64_MAX)
    mine = won | (code == check.fault.code)
    rec[1] = torch.where(mine, torch.minimum(rec[1], key), rec[1])
    if isinstance(check.bound, torch.Tensor):
        bound = check.bound.reshape(-1).long().index_select(0, item).squeeze(0)
    else:
        bound = int(check.bound or 0)
    rec[2] = torch.where(won, bound, rec[2])
    rec[3] += bad.sum()
    rec[0] = torch.where(won, check.fault.code, code)


def _unpack(key: int) -> tuple[int, int]:
    entry, low = key >> 32, key & 0xFFFFFFFF
    return entry, low - (1 << 32) if low >= 1 << 31 else low


def _raise_record(values: Sequence[int], reset) -> None:
    code, key, bound, count = (int(v) for v in values)
    if code == 0:
        return
    reset()
    found = _FAULTS[code] if 0 < code < len(_FAULTS) else None
    if found is None:
        raise ValueError(f"the device error record holds an unknown code {code}")
    entry, value = _unpack(key)
    raise ValueError(found.message(entry, value, bound if found.same_bound else None,
                                   on_device=True, count=count))


def check_errors(device=None) -> None:
    """Raise the first index fault the kernels of ``device`` (default: every device with a
    record) found since the last check, as ``ValueError``, and clear it. Waits for the device."""
    devices = [_canonical(device)] if device is not None else list(_RECORDS)
    for dev in devices:
        rec = _RECORDS.get(dev)
        if rec is None:
            continue
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        _raise_record(rec.tolist(), lambda dev=dev: clear(dev))


def clear(device=None) -> None:
    """Forget the recorded faults of ``device`` (default: every device) without raising."""
    for dev in ([_canonical(device)] if device is not None else list(_RECORDS)):
        rec = _RECORDS.get(dev)
        if rec is not None:
            rec.copy_(torch.tensor(_EMPTY))
        mirror = _MIRRORS.get(dev)
        if mirror is not None:
            mirror.pending = False


@dataclass
class _Mirror:
    host: torch.Tensor  # pinned int64 [4]
    event: torch.cuda.Event
    pending: bool = False


_MIRRORS: dict[torch.device, _Mirror] = {}


def poll(device) -> None:
    """Non-blocking: raise a fault that the copy queued by the previous ``poll`` brought back, if
    that copy has landed, then queue a new copy. Does nothing on the CPU (host checks raise at
    the call), during a CUDA-graph capture, or before any kernel made the device's record."""
    device = _canonical(device)
    rec = _RECORDS.get(device)
    if rec is None or device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return
    mirror = _MIRRORS.get(device)
    if mirror is None:
        mirror = _MIRRORS[device] = _Mirror(torch.zeros(4, dtype=torch.int64, pin_memory=True),
                                            torch.cuda.Event())
    if mirror.pending and mirror.event.query():
        mirror.pending = False
        values = mirror.host.tolist()
        _raise_record(values, lambda: clear(device))
    if not mirror.pending:
        mirror.host.copy_(rec, non_blocking=True)
        mirror.event.record()
        mirror.pending = True


# --------------------------------------------------------------------------------------------
# host checks


def host_check_wanted(device: torch.device) -> bool:
    """Whether a call on ``device`` checks its index arrays on the host before launching: always
    on the CPU, on a GPU only with ``FLASHINFER_CHECK_INDICES=1`` (and never while capturing)."""
    if device.type != "cuda":
        return True
    return envs.CHECK_INDICES.get() and not torch.cuda.is_current_stream_capturing()


def raise_first(checks: Iterable[Check]) -> None:
    """Raise ``ValueError`` for the first bad entry of the first failing check (reads the masks
    back: a synchronisation when they live on a GPU)."""
    for check in checks:
        bad = check.bad.reshape(-1)
        if bad.numel() == 0 or not bool(bad.any()):
            continue
        item = int(bad.nonzero()[0, 0])
        entry = item if check.entries is None else int(check.entries.reshape(-1)[item])
        value = int(check.values.reshape(-1)[item])
        bound = check.bound
        if isinstance(bound, torch.Tensor):
            bound = int(bound.reshape(-1)[item])
        raise ValueError(check.fault.message(entry, value, bound, on_device=False,
                                             count=int(bad.sum())))


def enforce(checks: Iterable[Check], device: torch.device) -> None:
    """Host check when wanted (:func:`host_check_wanted`), else merge into the device record."""
    checks = list(checks)
    if host_check_wanted(device):
        raise_first(checks)
    else:
        for check in checks:
            report_device(check)
