"""What the capability table cannot say about cuDNN SDPA: per-SM head-dim limits and version gates.

The record (``capability_db/cudnn.toml``) admits ``head_dim <= 256``, multiple of 8, on SM
8.0-12.1. cuDNN's real limits depend on the architecture, on whether the query is a single row
(cuDNN's "decode only mode", ``s_q == 1``) and on the backend version (cuDNN frontend
``sdpa_support_surface.h`` and the support matrix of the Attention docs):

==================  =======================  ======================================
SM                  prefill (``s_q > 1``)    single query row (``s_q == 1``)
==================  =======================  ======================================
9.x                 256                      256
10.x, 11.x          256 (128 before 9.9)     128
8.x, 12.x           256 from 9.10, else 128  128
==================  =======================  ======================================

When the backend version is unknown (the ``cudnn`` module does not import here, or its library
does not load: a simulated SM), SM 8.x/12.x prefill is held to 128 and SM 10.x prefill allowed
256, the limits of the cuDNN versions this adapter targets.

Version gates, checked only when ``cudnn`` imports and its library reports a version:

* frontend >= 1.13: ``generate_stats`` and the diagonal-band mask arguments used here;
* backend >= 9.0 for anything; >= 9.6 for the bottom-right causal mask at any ``s_q``/``s_kv``
  (9.3-9.5 need multiples of 64); >= 9.10.2 for a window (before it a left bound needed a
  right bound and was refused for ``s_q == 1`` and some Hopper shapes).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ...optional_packages import import_error
from ...reasons import Reason

MIN_FRONTEND = (1, 13, 0)
MIN_BACKEND = 90000
MIN_BACKEND_CAUSAL = 90600
MIN_BACKEND_WINDOW = 91002


@dataclass(frozen=True)
class Versions:
    frontend: tuple[int, int, int]
    backend: int | None  # cudnn.backend_version(), e.g. 91900 for 9.19.0; None if the library is absent


def version_text(backend: int) -> str:
    """``91002`` → ``"9.10.2"`` (cuDNN 9 numbering; 8.x is ``8906`` → ``"8.9.6"``)."""
    if backend >= 90000:
        return f"{backend // 10000}.{backend // 100 % 100}.{backend % 100}"
    return f"{backend // 1000}.{backend // 100 % 10}.{backend % 100}"


def parse_frontend(text: str) -> tuple[int, int, int]:
    """``"1.32.0"`` / ``"1.8.0.post1"`` → ``(1, 32, 0)``; unparsable parts count as 0."""
    parts = [int(m) if m else 0 for m in (re.match(r"\d*", p).group() for p in text.split(".")[:3])]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


@functools.lru_cache(maxsize=1)
def installed_versions() -> Versions | None:
    """Frontend and backend versions of the installed ``cudnn`` module, or None if it does not import."""
    if import_error("cudnn"):
        return None
    import cudnn

    frontend = parse_frontend(str(getattr(cudnn, "__version__", "0")))
    try:
        backend = int(cudnn.backend_version())
    except Exception:  # noqa: BLE001 - no libcudnn here (e.g. a CPU machine): version unknown
        backend = None
    return Versions(frontend, backend)


def head_dim_limit(sm: tuple[int, int], single_query: bool, backend: int | None) -> int:
    """Largest head dim cuDNN SDPA forward serves on ``sm`` (see the table above)."""
    major = sm[0]
    if major == 9:
        return 256
    if single_query:
        return 128
    if major in (10, 11):
        return 256 if backend is None or backend >= 90900 else 128
    return 256 if backend is not None and backend >= 91000 else 128


def reasons(problem, versions: Versions | None) -> list[Reason]:
    """Every reason cuDNN cannot serve ``problem`` beyond its capability record (empty = can)."""
    if problem.device != "cuda" or problem.sm is None:
        return []
    out: list[Reason] = []
    shape = dict(problem.shape)
    single_query = problem.op == "single_decode" or shape.get("qo_len") == 1
    backend = versions.backend if versions else None
    limit = head_dim_limit(problem.sm, single_query, backend)
    where = f"SM {problem.sm[0]}.{problem.sm[1]}" + (" with one query row" if single_query else "")
    for fact in ("head_dim_qk", "head_dim_vo"):
        value = shape.get(fact)
        if value is not None and value > limit:
            out.append(Reason(fact, value, f"<={limit}",
                              f"{fact}={value} > {limit}: cuDNN SDPA serves head dims up to {limit} "
                              f"on {where}"))
    if versions is None:
        return out
    if versions.frontend < MIN_FRONTEND:
        need = ".".join(map(str, MIN_FRONTEND))
        have = ".".join(map(str, versions.frontend))
        out.append(Reason("cudnn_frontend", have, f">={need}",
                          f"nvidia-cudnn-frontend {have} is older than {need} (needs generate_stats "
                          f"and the diagonal-band mask API)"))
    if backend is None:
        return out
    gates = [(MIN_BACKEND, "SDPA forward")]
    if "causal" in problem.features and not single_query:
        gates.append((MIN_BACKEND_CAUSAL, "the bottom-right causal mask at any length"))
    if "window" in problem.features:
        gates.append((MIN_BACKEND_WINDOW, "a sliding window (left bound) in every form used here"))
    for minimum, what in gates:
        if backend < minimum:
            out.append(Reason("cudnn_version", version_text(backend), f">={version_text(minimum)}",
                              f"cuDNN {version_text(backend)} is older than {version_text(minimum)}, "
                              f"needed for {what}"))
    return out
