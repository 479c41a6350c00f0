"""cuDNN adapter: single-request prefill and decode attention through cuDNN frontend SDPA graphs.

The kernels follow the canonical signature of :mod:`flashinfer.attention_params`
(``out, lse = kernel(q, k, v, params)``) and serve what ``capability_db/cudnn.toml`` declares:
fp16/bf16, causal (bottom-right), GQA/MQA, sliding window, base-2 lse, NHD or HND views.
How a call is split into graphs and planned once per geometry is in :mod:`.plan`; per-SM
head-dim limits and cuDNN version gates (the adapter checks) in :mod:`.support`; building,
caching and running graphs in :mod:`._graphs`, the only module that imports ``cudnn`` and the
only one imported lazily, inside the kernels.
"""

from __future__ import annotations

import sys

from .. import KernelTable
from . import support

KERNELS = KernelTable("cudnn")


@KERNELS.kernel("single_prefill")
def single_prefill(q, k, v, params):
    """q ``[qo_len, Hq, D]``, k/v ``[kv_len, Hkv, D]`` (views) → out ``[qo_len, Hq, D]``, lse or None."""
    from . import _graphs

    return _graphs.attention(q, k, v, params)


@KERNELS.kernel("single_decode")
def single_decode(q, k, v, params):
    """q ``[1, Hq, D]``, k/v ``[kv_len, Hkv, D]`` (views) → out ``[1, Hq, D]``, lse or None."""
    from . import _graphs

    return _graphs.attention(q, k, v, params)


@KERNELS.check("single_prefill")
def _check_prefill(problem):
    return support.reasons(problem, support.installed_versions())


@KERNELS.check("single_decode")
def _check_decode(problem):
    return support.reasons(problem, support.installed_versions())


def graph_cache_state() -> dict:
    """Hits, misses, evictions and size of the graph cache (one entry per call geometry, holding
    its one or two graphs); {} before first use."""
    graphs = sys.modules.get(__name__ + "._graphs")
    return graphs.state() if graphs is not None else {}
