"""Adapter checks of the cuDNN batch planners: what ``capability_db/cudnn.toml`` cannot say.

* head-dim limits per SM as for single-request attention (:func:`.support.head_dim_limit`; a
  decode with one query per request is cuDNN's single-row case);
* q and KV dtypes equal (the record lists each role's dtypes, not that they match);
* a window in prefill only together with the causal mask: cuDNN's left band bound with
  ``qo_len > kv_len`` rows and no right bound is not what the batch contract says for rows
  before the first key;
* version gates when ``cudnn`` imports and reports its library: frontend >= 1.13 and, for paged
  KV caches and ragged offsets with the padding mask, backend >= 9.5; causal and window as in
  :mod:`.support`.
"""

from __future__ import annotations

from ...reasons import Reason
from . import support

MIN_BACKEND_PAGED = 90500


def single_query(problem) -> bool:
    shape = dict(problem.shape)
    return problem.op == "batch_decode" and shape.get("q_len_per_req", 1) <= 1


def reasons(problem, versions: support.Versions | None) -> list[Reason]:
    """Every reason the cuDNN batch planner cannot serve ``problem`` beyond its record."""
    if problem.device != "cuda" or problem.sm is None:
        return []
    out: list[Reason] = []
    shape, dtypes = dict(problem.shape), dict(problem.dtypes)
    one_row = single_query(problem)
    backend = versions.backend if versions else None
    limit = support.head_dim_limit(problem.sm, one_row, backend)
    where = f"SM {problem.sm[0]}.{problem.sm[1]}" + (" with one query per request" if one_row else "")
    for fact in ("head_dim_qk", "head_dim_vo"):
        value = shape.get(fact)
        if value is not None and value > limit:
            out.append(Reason(fact, value, f"<={limit}",
                              f"{fact}={value} > {limit}: cuDNN SDPA serves head dims up to "
                              f"{limit} on {where}"))
    if "q" in dtypes and "kv" in dtypes and dtypes["q"] != dtypes["kv"]:
        out.append(Reason("dtypes.kv", dtypes["kv"], dtypes["q"],
                          f"kv dtype {dtypes['kv']} differs from q dtype {dtypes['q']}: the cuDNN "
                          f"batch graphs read q, k and v in one dtype"))
    if "window" in problem.features and "causal" not in problem.features and not one_row:
        out.append(Reason("features", "window without causal", "window with causal",
                          "cuDNN batch prefill serves a sliding window only with the causal mask"))
    if versions is None:
        return out
    if versions.frontend < support.MIN_FRONTEND:
        have = ".".join(map(str, versions.frontend))
        need = ".".join(map(str, support.MIN_FRONTEND))
        out.append(Reason("cudnn_frontend", have, f">={need}",
                          f"nvidia-cudnn-frontend {have} is older than {need}"))
    if backend is None:
        return out
    gates = [(MIN_BACKEND_PAGED, "paged KV caches and ragged offsets with the padding mask")]
    if "causal" in problem.features and not one_row:
        gates.append((support.MIN_BACKEND_CAUSAL, "the bottom-right causal mask at any length"))
    if "window" in problem.features:
        gates.append((support.MIN_BACKEND_WINDOW, "a sliding window (left bound)"))
    for minimum, what in gates:
        if backend < minimum:
            text, need = support.version_text(backend), support.version_text(minimum)
            out.append(Reason("cudnn_version", text, f">={need}",
                              f"cuDNN {text} is older than {need}, needed for {what}"))
    return out
