"""torch backend for the sampling family: the sort + cumsum baseline users write today.

One descending sort per row gives every keep rule of :mod:`flashinfer.sampling.ops` as a prefix of
the sorted row (top-k, top-p and min-p keep "everything at least this large"), the exclusive
cumulative sum gives the mass strictly larger than each entry (ties share the sum of their first
member), and an inverse CDF over the kept prefix draws the sample. float32 throughout, any device.

Random numbers: one ``torch.Generator`` on the input's device per call, seeded from the Python
ints ``(seed, offset)`` through :func:`~flashinfer.backends.reference.sampling.mix64`; output row
``i`` uses the ``i``-th uniform. Tensor seeds are not served (reading them would sync the host),
so the records do not declare ``seed_tensor``.

Registered into the ``torch`` adapter's table (``backends/torch/attention.py`` imports this module).
"""

from __future__ import annotations

import torch

from ..reference.sampling import mix64


def _uniforms(seed, offset, shape: tuple[int, ...], device) -> torch.Tensor:
    if isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor):
        raise ValueError("the torch sampling backend takes Python-int seed/offset only")
    gen = torch.Generator(device=device)
    gen.manual_seed(mix64(seed, offset))
    return torch.rand(shape, generator=gen, device=device, dtype=torch.float32)


def _column(value, rows, dtype, device):
    """A per-row threshold as a ``[B, 1]`` column; a scalar stays a Python number (used as such
    in the comparisons: no host-to-device copy per call)."""
    if value is None or not isinstance(value, torch.Tensor):
        return value
    col = value.to(device=device, dtype=dtype)
    return (col if rows is None else col[rows]).unsqueeze(-1)


def _kth(s: torch.Tensor, k) -> torch.Tensor:
    """The k-th largest entry of each descending row ``s`` (``k`` clamped to [1, vocab])."""
    vocab = s.shape[-1]
    if isinstance(k, torch.Tensor):
        return s.gather(-1, (k.clamp(1, vocab) - 1).expand(s.shape[0], 1))
    k = min(max(int(k), 1), vocab)
    return s[:, k - 1:k]


def _top_k_keep(x: torch.Tensor, s: torch.Tensor, k):
    """Top-k keep mask of ``x`` given its rows sorted descending ``s``: ``x >= kth``, except where
    ``k <= 0`` or ``k >= vocab`` (no filter); ``None`` when a scalar ``k`` filters nothing."""
    vocab = s.shape[-1]
    if not isinstance(k, torch.Tensor):
        return x >= _kth(s, k) if 0 < int(k) < vocab else None
    return (k <= 0) | (k >= vocab) | (x >= _kth(s, k))


def _valid(p: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(p).all(-1) & (p >= 0).all(-1) & (p.sum(-1) > 0)


def _fraction_ok(ok: torch.Tensor, col) -> torch.Tensor:
    """``ok`` and, for a per-row top-p / min-p column ``[B, 1]``, whether it is in [0, 1] (NaN
    is not); a scalar was checked by the caller (no launch)."""
    if not isinstance(col, torch.Tensor):
        return ok
    return ok & ((col >= 0) & (col <= 1)).squeeze(-1)


def _sorted_keep(s: torch.Tensor, top_k, top_p, min_p, joint: bool) -> torch.Tensor:
    """Keep mask on rows ``s`` sorted descending (fp32); each rule keeps a prefix."""
    vocab = s.shape[-1]
    pos = torch.arange(vocab, device=s.device)
    keep = s > 0
    if top_k is not None:
        top = _top_k_keep(s, s, top_k)
        if top is not None:
            keep &= top
    if top_p is not None:
        exclusive = s.cumsum(-1) - s
        # ties: the mass strictly larger is the exclusive sum at the tie group's first member
        first = torch.where(torch.cat([torch.ones_like(s[:, :1], dtype=torch.bool),
                                       s[:, 1:] != s[:, :-1]], -1), pos, 0).cummax(-1).values
        larger = exclusive.gather(-1, first)
        total = torch.where(keep, s, 0).sum(-1, keepdim=True) if (top_k is not None and not joint) \
            else s.sum(-1, keepdim=True)
        keep &= (larger < top_p * total) | (s == s[:, :1]) | (top_p >= 1)
    if min_p is not None:
        keep &= s >= min_p * s[:, :1]
    return keep


def _draw_sorted(kept: torch.Tensor, order: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over descending kept weights; maps back through ``order``."""
    cdf = kept.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True)
    last = ((kept > 0).sum(-1, keepdim=True) - 1).clamp_min(0)
    return order.gather(-1, torch.minimum(idx, last)).squeeze(-1)


def _rows(indices, num_rows: int, count: int, device):
    if indices is None:
        return None, torch.ones(count, dtype=torch.bool, device=device)
    rows = indices.long()
    inside = (rows >= 0) & (rows < num_rows)
    return torch.where(inside, rows, 0), inside


def sampling_from_probs(probs, out, valid, indices, top_k, top_p, min_p, joint, deterministic,
                        seed, offset) -> None:
    count = out.numel()
    rows, inside = _rows(indices, probs.shape[0], count, probs.device)
    p = probs if rows is None else probs[rows]
    top_p = _column(top_p, rows, torch.float32, p.device)
    min_p = _column(min_p, rows, torch.float32, p.device)
    # a threshold row outside its rule makes the row invalid (module docstring of sampling)
    ok = _fraction_ok(_fraction_ok(inside & _valid(p), top_p), min_p)
    s, order = torch.where(ok.unsqueeze(-1), p, 0).sort(dim=-1, descending=True)
    keep = _sorted_keep(s, _column(top_k, rows, torch.int64, p.device), top_p, min_p, joint)
    ok = ok & keep[:, 0]  # every rule keeps a prefix: empty iff the first is not kept
    token = _draw_sorted(torch.where(keep, s, 0), order, _uniforms(seed, offset, (count,), p.device))
    out.copy_(torch.where(ok, token, 0))
    valid.copy_(ok)


def sampling_from_logits(logits, out, indices, deterministic, seed, offset) -> None:
    count = out.numel()
    rows, inside = _rows(indices, logits.shape[0], count, logits.device)
    x = (logits if rows is None else logits[rows]).float()
    ok = inside & ~torch.isnan(x).any(-1) & (x > -torch.inf).any(-1) & ~(x == torch.inf).any(-1)
    p = torch.softmax(torch.where(ok.unsqueeze(-1), x, 0), dim=-1)
    # exponential race: argmax p / E, E ~ Exp(1), samples p / sum(p); p = 0 never wins
    e = -torch.log1p(-_uniforms(seed, offset, tuple(p.shape), p.device))
    token = (p / e).argmax(-1)
    out.copy_(torch.where(ok, token, 0))


def renorm_probs(probs, out, top_k, top_p) -> None:
    p = probs.float()
    top_p = _column(top_p, None, torch.float32, p.device)
    ok = _fraction_ok(_valid(p), top_p).unsqueeze(-1)  # a bad top_p row: zeros
    s, order = torch.where(ok, p, 0).sort(dim=-1, descending=True)
    keep = _sorted_keep(s, _column(top_k, None, torch.int64, p.device), top_p, None, False)
    kept = torch.where(keep, s, 0)
    total = kept.sum(-1, keepdim=True)
    normed = torch.where(ok, kept / torch.where(total > 0, total, 1), 0)
    out.copy_(torch.zeros_like(p).scatter_(-1, order, normed))


def top_k_mask_logits(logits, out, top_k) -> None:
    k = _column(top_k, None, torch.int64, logits.device)
    s, _ = logits.sort(dim=-1, descending=True)
    keep = _top_k_keep(logits, s, k)
    out.copy_(logits if keep is None else logits.masked_fill(~keep, -torch.inf))


def top_k_top_p_sampling_from_logits(logits, out, indices, top_k, top_p, joint, deterministic,
                                     seed, offset) -> None:
    """``torch.softmax`` (a NaN or +inf logit, or none finite, makes the row NaN: token 0), then
    :func:`sampling_from_probs`."""
    probs = torch.softmax(logits.float(), dim=-1)
    valid = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    sampling_from_probs(probs, out, valid, indices, top_k, top_p, None, joint, deterministic, seed,
                        offset)


#: the largest float32: 1 / T is clamped to it (T below ~3e-39 would give inf, then NaN)
_FLT_MAX = torch.finfo(torch.float32).max


def softmax(logits, out, temperature) -> None:
    """``softmax((x - max x) * min(1 / T, FLT_MAX))``: no overflow for a tiny T; a temperature
    row that is not a finite number > 0 gives zeros."""
    x = logits.float()
    if temperature is None:
        out.copy_(torch.softmax(x, dim=-1))
        return
    if isinstance(temperature, torch.Tensor):
        t = temperature.float().unsqueeze(-1)
        inv_t = t.reciprocal().clamp_max(_FLT_MAX)
    else:
        inv_t = min(1.0 / float(temperature), _FLT_MAX)
    y = torch.softmax((x - x.amax(-1, keepdim=True)) * inv_t, dim=-1)
    if isinstance(temperature, torch.Tensor):
        y = torch.where((t > 0) & (t < torch.inf), y, 0)
    out.copy_(y)


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, output, accepted,
                               emitted, deterministic, seed, offset) -> None:
    batch, n, vocab = draft_probs.shape
    dev = draft_probs.device
    u = _uniforms(seed, offset, (batch, n + 1), dev)
    ids = draft_token_ids.long()
    inside = (ids >= 0) & (ids < vocab)
    safe = torch.where(inside, ids, 0).unsqueeze(-1)
    p_draft = draft_probs.float().gather(-1, safe).squeeze(-1)
    p_target = target_probs[:, :n].float().gather(-1, safe).squeeze(-1)
    accept = inside & (u[:, :n] * p_draft < p_target)
    pos = accept.int().cumprod(-1).sum(-1)  # first rejected draft, or n
    padded = torch.cat([draft_probs.float(), torch.zeros_like(draft_probs[:, :1]).float()], 1)
    at = pos.view(batch, 1, 1).expand(batch, 1, vocab)
    t = target_probs.float().gather(1, at).squeeze(1)
    residual = t - padded.gather(1, at).squeeze(1)
    residual = torch.where(residual > 0, residual, 0)  # relu; a NaN weighs nothing
    weights = torch.where(residual.sum(-1, keepdim=True) > 0, residual, torch.where(t > 0, t, 0))
    s, order = weights.sort(dim=-1, descending=True)
    final = torch.where(s[:, 0] > 0, _draw_sorted(s, order, u[:, n]), 0)  # no weight: token 0
    col = torch.arange(n + 1, device=dev)
    drafts = torch.cat([ids, ids[:, :1]], 1)
    result = torch.where(col < pos.unsqueeze(-1), drafts, -1)
    result = torch.where(col == pos.unsqueeze(-1), final.unsqueeze(-1), result)
    output.copy_(result)
    accepted += accept.sum(-1).to(accepted.dtype)
    emitted += pos.to(emitted.dtype)
