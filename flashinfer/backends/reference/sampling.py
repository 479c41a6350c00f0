"""Reference sampling kernels: plain torch, float64 where it matters, written to be read.

Every kernel takes the canonical signature documented in :mod:`flashinfer.sampling.ops`. The keep
rules are computed exactly in float64 from "how many entries are strictly larger" and "how much
mass is strictly larger" than each entry (a sort plus a suffix sum, so ties are handled as the
contract says). Samples are drawn by inverse CDF over the kept entries.

Random numbers: output row ``i`` gets its own CPU ``torch.Generator`` seeded from
``(seed_i, offset_i, i)`` through a splitmix64 mix; ``seed_i``/``offset_i`` are the Python ints,
or the tensor entries (read with ``.item()``: the reference may sync). The uniforms are drawn on
the CPU and moved to the input's device once, so one call costs one copy instead of one tiny
launch per row; results are identical on every device for the same (seed, offset).
"""

from __future__ import annotations

import torch


_M64 = (1 << 64) - 1


def mix64(*words: int) -> int:
    """splitmix64 over the words: a well spread 63-bit seed (manual_seed takes it as is)."""
    h = 0x9E3779B97F4A7C15
    for w in words:
        h = (h ^ (int(w) & _M64)) & _M64
        h = (h * 0xBF58476D1CE4E5B9) & _M64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _M64
        h ^= h >> 29
    return h & ((1 << 63) - 1)


def _word(value, i: int) -> int:
    """Entry ``i`` of a seed/offset: a Python int, or a [1]/[B] int64 tensor."""
    if isinstance(value, torch.Tensor):
        return int(value[i if value.numel() > 1 else 0].item())
    return int(value)


def uniforms(seed, offset, rows: int, per_row: int, device) -> torch.Tensor:
    """float64 ``[rows, per_row]`` uniforms in [0, 1), one generator per output row."""
    # a host generator, explicitly on the host (a caller's `with torch.device("cuda")` must not
    # move these tensors off it)
    out = torch.empty(rows, per_row, dtype=torch.float64, device="cpu")
    gen = torch.Generator(device="cpu")
    for i in range(rows):
        gen.manual_seed(mix64(_word(seed, i), _word(offset, i), i))
        out[i] = torch.rand(per_row, generator=gen, dtype=torch.float64, device="cpu")
    return out.to(device)


def _per_row(value, rows: torch.Tensor, dtype) -> torch.Tensor | None:
    """A threshold (None, scalar, or [R] tensor) as a float64/int64 column for the mapped rows."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.to(rows.device)[rows].to(dtype).unsqueeze(-1)
    return torch.full((rows.numel(), 1), value, dtype=dtype, device=rows.device)


def larger_count_and_mass(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each entry x of each row: #{j: p_j > p_x} and sum{p_j: p_j > p_x} (float64)."""
    vocab = p.shape[-1]
    ascending, _ = p.sort(dim=-1)
    at_most = torch.searchsorted(ascending, p, right=True)  # entries <= p_x
    suffix = ascending.flip(-1).cumsum(-1).flip(-1)  # suffix[j] = sum(ascending[j:])
    suffix = torch.cat([suffix, torch.zeros_like(suffix[..., :1])], dim=-1)
    return vocab - at_most, suffix.gather(-1, at_most)


def valid_rows(p: torch.Tensor) -> torch.Tensor:
    """A row is a distribution iff finite, no negative entry and a positive sum."""
    return torch.isfinite(p).all(-1) & (p >= 0).all(-1) & (p.sum(-1) > 0)


def fraction_ok(value: torch.Tensor | None) -> torch.Tensor | bool:
    """Per row (``[n]``, from a ``[n, 1]`` column): a top-p / min-p in [0, 1] (NaN is not)."""
    if value is None:
        return True
    return ((value >= 0) & (value <= 1)).squeeze(-1)


def temperature_ok(t: torch.Tensor) -> torch.Tensor:
    """A temperature that is a finite number > 0 (NaN is not)."""
    return (t > 0) & (t < torch.inf)


def keep_mask(p: torch.Tensor, top_k, top_p, min_p, joint: bool) -> torch.Tensor:
    """The contract's keep rules on float64 rows ``p`` (thresholds already per row, [n, 1])."""
    count, mass = larger_count_and_mass(p)
    keep = p > 0
    if top_k is not None:
        vocab = p.shape[-1]
        no_filter = (top_k <= 0) | (top_k >= vocab)
        keep &= no_filter | (count < top_k)
    if top_p is not None:
        total = p.sum(-1, keepdim=True)
        if top_k is not None and not joint:  # top-p on the top-k renormalised distribution
            total = torch.where(keep, p, 0).sum(-1, keepdim=True)
        is_max = p == p.max(-1, keepdim=True).values
        keep &= (top_p >= 1) | (mass < top_p * total) | is_max
    if min_p is not None:
        keep &= p >= min_p * p.max(-1, keepdim=True).values
    return keep


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn from each row of non-negative ``weights`` with uniforms ``u`` [n]; a row of
    zeros gives 0. Never an index of a zero weight."""
    cdf = weights.cumsum(-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    positive = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights)
    last = torch.where(weights > 0, positive, -1).max(-1).values  # last positive index
    return torch.minimum(idx, last).clamp_min(0)


def _mapped_rows(indices, num_rows: int, count: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row read by each output (clamped) and whether ``indices[i]`` was inside [0, R)."""
    if indices is None:
        return torch.arange(count, device=device), torch.ones(count, dtype=torch.bool, device=device)
    rows = indices.long()
    inside = (rows >= 0) & (rows < num_rows)
    return torch.where(inside, rows, 0), inside


def sampling_from_probs(probs, out, valid, indices, top_k, top_p, min_p, joint, deterministic,
                        seed, offset) -> None:
    count = out.numel()
    rows, inside = _mapped_rows(indices, probs.shape[0], count, probs.device)
    p = probs.double()[rows]
    top_p, min_p = _per_row(top_p, rows, torch.float64), _per_row(min_p, rows, torch.float64)
    # a threshold outside its rule (module docstring of flashinfer.sampling.ops) makes the row invalid
    ok = inside & valid_rows(p) & fraction_ok(top_p) & fraction_ok(min_p)
    p = torch.where(ok.unsqueeze(-1), p, 0)
    kept = torch.where(keep_mask(p, _per_row(top_k, rows, torch.int64), top_p, min_p, joint),
                       p, 0)
    ok &= (kept > 0).any(-1)  # an empty kept set is never a valid draw
    u = uniforms(seed, offset, count, 1, probs.device)[:, 0]
    token = torch.where(ok, inverse_cdf(kept, u), 0)
    out.copy_(token)
    valid.copy_(ok)


def sampling_from_logits(logits, out, indices, deterministic, seed, offset) -> None:
    count = out.numel()
    rows, inside = _mapped_rows(indices, logits.shape[0], count, logits.device)
    x = logits.double()[rows]
    ok = inside & ~torch.isnan(x).any(-1) & (x > -torch.inf).any(-1) & ~(x == torch.inf).any(-1)
    x = torch.where(ok.unsqueeze(-1), x, 0)
    p = torch.softmax(x, dim=-1)  # -inf logits get exactly 0
    u = uniforms(seed, offset, count, 1, logits.device)[:, 0]
    out.copy_(torch.where(ok, inverse_cdf(p, u), 0))


def top_k_top_p_sampling_from_logits(logits, out, indices, top_k, top_p, joint, deterministic,
                                     seed, offset) -> None:
    """The float64 softmax, then :func:`sampling_from_probs` (an invalid logit row: a NaN
    distribution, so token 0)."""
    x = logits.double()
    bad = torch.isnan(x).any(-1) | ~(x > -torch.inf).any(-1) | (x == torch.inf).any(-1)
    probs = torch.softmax(torch.where(bad.unsqueeze(-1), 0.0, x), dim=-1)
    probs[bad] = float("nan")
    valid = torch.empty(out.shape, dtype=torch.bool, device=out.device)
    sampling_from_probs(probs, out, valid, indices, top_k, top_p, None, joint, deterministic, seed,
                        offset)


def renorm_probs(probs, out, top_k, top_p) -> None:
    rows = torch.arange(probs.shape[0], device=probs.device)
    p = probs.double()
    top_p = _per_row(top_p, rows, torch.float64)
    ok = (valid_rows(p) & fraction_ok(top_p)).unsqueeze(-1)  # a bad top_p row: zeros
    p = torch.where(ok, p, 0)
    kept = torch.where(keep_mask(p, _per_row(top_k, rows, torch.int64), top_p, None, False),
                       p, 0)
    total = kept.sum(-1, keepdim=True)
    out.copy_(torch.where(ok, kept / torch.where(total > 0, total, 1), 0))


def top_k_mask_logits(logits, out, top_k) -> None:
    rows = torch.arange(logits.shape[0], device=logits.device)
    x = logits.double()
    k = _per_row(top_k, rows, torch.int64)
    larger, _ = larger_count_and_mass(x)
    keep = (k <= 0) | (k >= x.shape[-1]) | (larger < k)
    out.copy_(torch.where(keep, logits, torch.tensor(-torch.inf, dtype=logits.dtype,
                                                         device=logits.device)))


def softmax(logits, out, temperature) -> None:
    """``softmax((x - max x) / T)`` in float64 (no overflow for a tiny T); a temperature row
    that is not a finite number > 0 gives zeros."""
    x = logits.double()
    if temperature is None:
        out.copy_(torch.softmax(x, dim=-1))
        return
    t_t = isinstance(temperature, torch.Tensor)
    t = temperature.double().unsqueeze(-1) if t_t else float(temperature)
    y = torch.softmax((x - x.amax(-1, keepdim=True)) / t, dim=-1)
    out.copy_(torch.where(temperature_ok(t), y, 0) if t_t else y)


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, output, accepted,
                               emitted, deterministic, seed, offset) -> None:
    batch, n, vocab = draft_probs.shape
    u = uniforms(seed, offset, batch, n + 1, draft_probs.device).cpu()
    draft = draft_probs.double().cpu()
    target = target_probs.double().cpu()
    ids = draft_token_ids.long().cpu()
    result = torch.full((batch, n + 1), -1, dtype=torch.int64)
    n_accepted = torch.zeros(batch, dtype=torch.int64)
    n_emitted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        accepts = []
        for i in range(n):
            d = int(ids[b, i])
            inside = 0 <= d < vocab
            accepts.append(inside and bool(u[b, i] * draft[b, i, d] < target[b, i, d]))
        pos = accepts.index(False) if False in accepts else n
        result[b, :pos] = ids[b, :pos]
        # weights: the positive entries (relu; a NaN weighs nothing)
        t_pos = target[b, pos]
        weights = torch.where(t_pos > 0, t_pos, 0)
        if pos < n:
            residual = t_pos - draft[b, pos]
            residual = torch.where(residual > 0, residual, 0)
            weights = residual if residual.sum() > 0 else weights
        result[b, pos] = inverse_cdf(weights.nan_to_num(0), u[b, n:n + 1])[0]
        n_accepted[b] = sum(accepts)
        n_emitted[b] = pos
    output.copy_(result)
    accepted += n_accepted.to(accepted.device, accepted.dtype)
    emitted += n_emitted.to(emitted.device, emitted.dtype)
