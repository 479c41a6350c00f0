"""Bit packing (upstream ``flashinfer.quantization.packbits`` / ``segment_packbits``, also
top-level): boolean masks to uint8, eight elements a byte, as the packed custom masks of the
attention functions take them.

Upstream's default ``bitorder`` is ``"big"`` (element ``8j`` is the most significant bit of byte
``j``, as ``numpy.packbits``), while every attention mask argument wants ``"little"`` (element
``8j`` in bit 0): pass ``bitorder="little"`` for masks. Elements are 0 / nonzero (bool, integer
or float); a segment's last byte is padded with zero bits. Plain tensor ops, on the input's
device: nothing to dispatch.
"""

from __future__ import annotations

import torch

__all__ = ["packbits", "segment_packbits"]

_ORDERS = ("big", "little")


def _weights(bitorder, device: torch.device) -> torch.Tensor:
    if bitorder not in _ORDERS:
        raise ValueError(f"bitorder={bitorder!r} is not valid; allowed: 'big', 'little'")
    powers = 1 << torch.arange(8, device=device, dtype=torch.int32)
    return powers.flip(0) if bitorder == "big" else powers


def _flat(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
    return x


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """Pack the 1-D tensor ``x`` (0 / nonzero) into uint8 ``[ceil(len(x) / 8)]``, padded with
    zero bits; ``bitorder`` ``"big"`` (upstream's default) or ``"little"`` (masks)."""
    x = _flat(x)
    weights = _weights(bitorder, x.device)
    bits = torch.zeros(-(-x.shape[0] // 8) * 8, dtype=torch.int32, device=x.device)
    bits[:x.shape[0]] = x != 0
    return (bits.view(-1, 8) * weights).sum(-1).to(torch.uint8)


def segment_packbits(x: torch.Tensor, indptr: torch.Tensor, bitorder: str = "big"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack each segment ``x[indptr[i]:indptr[i + 1]]`` on its own (as :func:`packbits`).

    ``indptr``: 1-D integer ``[B + 1]``, non-decreasing, within ``[0, len(x)]`` (read on the
    host: a device tensor costs a synchronisation, as upstream's does). Returns ``(packed uint8
    [new_indptr[-1]], new_indptr int32 [B + 1])`` on ``x``'s device, ``new_indptr`` the cumulative
    byte counts ``ceil(segment length / 8)``.
    """
    x = _flat(x)
    weights = _weights(bitorder, x.device)
    if not isinstance(indptr, torch.Tensor):
        raise TypeError(f"indptr must be a torch.Tensor, got {type(indptr).__name__}")
    if indptr.dim() != 1 or indptr.shape[0] < 1 or indptr.is_floating_point() or (
            indptr.dtype == torch.bool):
        raise ValueError(f"indptr must be a 1-D integer tensor [batch + 1], got dtype "
                         f"{indptr.dtype}, shape {tuple(indptr.shape)}")
    offsets = indptr.to("cpu", torch.int64)
    lens = offsets[1:] - offsets[:-1]
    bad = torch.nonzero((lens < 0) | (offsets[1:] > x.shape[0]))
    if offsets[0] < 0 or offsets[0] > x.shape[0] or bad.numel():
        i = 0 if offsets[0] < 0 or offsets[0] > x.shape[0] else int(bad[0]) + 1
        raise ValueError(f"indptr[{i}] = {int(offsets[i])} is not valid: entries must be "
                         f"non-decreasing and within [0, len(x) = {x.shape[0]}]")
    nbytes = (lens + 7) // 8
    new_indptr = torch.zeros(offsets.shape[0], dtype=torch.int64)
    new_indptr[1:] = nbytes.cumsum(0)
    total = int(new_indptr[-1])
    segment = torch.repeat_interleave(torch.arange(lens.shape[0]), nbytes)     # byte -> segment
    first = offsets[segment] + 8 * (torch.arange(total) - new_indptr[segment])  # its first element
    source = first[:, None] + torch.arange(8)                                   # [total, 8]
    inside = source < offsets[segment + 1][:, None]
    source, inside = source.to(x.device), inside.to(x.device)
    bits = (x[source.clamp(max=max(x.shape[0] - 1, 0))] != 0) & inside if total else inside
    packed = (bits.to(torch.int32) * weights).sum(-1).to(torch.uint8)
    return packed, new_indptr.to(device=x.device, dtype=torch.int32)
