"""Host arrays a backend's runner builds, copied to the device without a synchronising copy."""

from __future__ import annotations

import numpy as np
import torch


def upload_array(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` on ``device``, copied through pinned memory: queued without the staged,
    stream-synchronising copy a pageable source makes (torch's caching host allocator keeps the
    pinned block until the copy has run). For a runner's arrays that a plan's own upload
    (``plan.extra``) did not carry."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


__all__ = ["upload_array"]
