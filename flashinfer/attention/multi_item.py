"""Multi-item scoring in the paged prefill wrapper: upstream's ``plan()`` arguments
``prefix_len_ptr``, ``token_pos_in_items_ptr``, ``token_pos_in_items_len`` and
``max_item_len_ptr``, served as the custom mask they define.

A scoring request is one sequence ``prefix D item_1 D item_2 D ...`` (``D`` a delimiter token):
every item is scored against the prefix alone, in one pass. Upstream's arguments, per request
``b`` (integer tensors, any device; read on the host by ``plan()``):

* ``prefix_len_ptr`` ``[B]``: ``P_b``, the prefix length in KV positions (cached tokens
  included).
* ``token_pos_in_items_ptr``: ``[B, L]`` flattened, ``L = token_pos_in_items_len``; entry ``t``
  of row ``b`` is the position inside its item of KV token ``P_b + t``: 0 for a delimiter, ``i``
  for the ``i``-th token after the last delimiter.
* ``max_item_len_ptr`` ``[B]``: at least the largest position of row ``b`` (upstream's kernels
  skip KV tiles by it; here it is only checked).

Visibility, for the query row at absolute position ``p`` and key ``j`` (as upstream's mask):
``j <= p`` and (``p < P_b`` or ``j < P_b`` or ``j > p - pos_b[p - P_b]``): prefix rows are
causal; an item token sees the prefix and its own item up to itself; a delimiter row sees the
prefix only; no row sees a delimiter key or another item. The mode is always causal (upstream
ignores ``causal``); ``window_left`` and ``logits_soft_cap`` still apply. A custom mask given
with it is refused (upstream silently drops it); a position table too short for a request, or
a ``max_item_len`` below a row's largest position, raises ``ValueError`` (upstream's kernels
would read past the table or skip keys). The mask holds ``sum(qo_len * kv_len)`` booleans.
"""

from __future__ import annotations

import torch

__all__ = ["multi_item_mask"]


def _int_vector(name: str, t, length: int | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"{name} must be a 1-D integer tensor, got "
                        f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if length is not None and t.shape[0] < length:
        raise ValueError(f"{name} must have at least {length} entries, got {t.shape[0]}")
    host = t.to("cpu", torch.int64)
    if bool((host < 0).any()):
        raise ValueError(f"{name} must be >= 0, got {host.tolist()[:16]}")
    return host


def multi_item_mask(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                    max_item_len_ptr, qo_lens: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
    """The flattened bool custom mask (``custom_mask`` layout: per request, ``[qo_len, kv_len]``
    row-major, concatenated) of the module's rule. ``qo_lens`` / ``kv_lens``: host int tensors
    ``[B]``."""
    if prefix_len_ptr is None or token_pos_in_items_ptr is None or max_item_len_ptr is None:
        given = [n for n, v in (("prefix_len_ptr", prefix_len_ptr),
                                ("token_pos_in_items_ptr", token_pos_in_items_ptr),
                                ("max_item_len_ptr", max_item_len_ptr)) if v is not None]
        raise ValueError(f"multi-item scoring needs prefix_len_ptr, token_pos_in_items_ptr and "
                         f"max_item_len_ptr together; got only {', '.join(given)}")
    if isinstance(token_pos_in_items_len, bool) or not isinstance(token_pos_in_items_len, int) \
            or token_pos_in_items_len < 1:
        raise ValueError(f"token_pos_in_items_len must be an int >= 1 (the row length of "
                         f"token_pos_in_items_ptr), got {token_pos_in_items_len!r}")
    batch = qo_lens.shape[0]
    width = token_pos_in_items_len
    prefix = _int_vector("prefix_len_ptr", prefix_len_ptr, batch)
    positions = _int_vector("token_pos_in_items_ptr", token_pos_in_items_ptr, batch * width)
    max_item = _int_vector("max_item_len_ptr", max_item_len_ptr, batch)
    masks = []
    for b in range(batch):
        n, kv_len, p_len = int(qo_lens[b]), int(kv_lens[b]), int(prefix[b])
        rows = torch.arange(kv_len - n, kv_len)[:, None]  # absolute query positions
        keys = torch.arange(kv_len)[None, :]
        visible = keys <= rows
        items = kv_len - p_len  # KV positions at or after the prefix
        if n and items > 0:
            if items > width:
                raise ValueError(f"request {b}: {items} KV positions follow its prefix of "
                                 f"{p_len}, token_pos_in_items_len is {width}")
            table = positions[b * width:b * width + items]
            if items and int(table.max()) > int(max_item[b]):
                raise ValueError(f"max_item_len_ptr[{b}]={int(max_item[b])} is below the largest "
                                 f"position in its items, {int(table.max())}")
            own = torch.full((n, 1), -1, dtype=torch.int64)  # p - pos: the item's start - 1
            in_items = rows[:, 0] >= p_len
            own[in_items, 0] = rows[in_items, 0] - table[rows[in_items, 0] - p_len]
            visible &= (rows < p_len) | (keys < p_len) | (keys > own)
        masks.append(visible.reshape(-1))
    return torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)
