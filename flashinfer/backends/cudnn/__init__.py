"""cuDNN adapter: attention through cuDNN frontend SDPA graphs, GEMMs through its matmul graphs.

The kernels follow the canonical signature of :mod:`flashinfer.attention.params`
(``out, lse = kernel(q, k, v, params)``) and serve what ``capability_db/cudnn.toml`` declares:
fp16/bf16, causal (bottom-right), GQA/MQA, sliding window, base-2 lse, NHD or HND views.
How a call is split into graphs and planned once per geometry is in :mod:`.plan`; per-SM
head-dim limits and cuDNN version gates (the adapter checks) in :mod:`.support`; building,
caching and running graphs in :mod:`._graphs`, the only module that imports ``cudnn`` and the
only one imported lazily, inside the kernels.

GEMMs: ``mm_bf16`` and ``bmm_fp8`` as matmul graphs (:mod:`.gemm`, built and cached in
:mod:`._gemm_graphs`).

Batch attention (:mod:`flashinfer.attention.batch_params`): planners for ``batch_decode``,
``batch_prefill_paged`` and ``batch_prefill_ragged``; bucketed graph keys and padded metadata in
:mod:`.batch_buckets`, adapter checks in :mod:`.batch_support`, graphs and runners in
:mod:`._batch_graphs` (imports ``cudnn``, imported lazily inside the planners).
"""

from __future__ import annotations

import sys

from . import batch_support, support
from ..shared.paged_mapping import block_sparse as block_sparse_paged  # noqa: F401 (a record's kernel)



def single_prefill(q, k, v, params):
    """q ``[qo_len, Hq, D]``, k/v ``[kv_len, Hkv, D]`` (views) → out ``[qo_len, Hq, D]``, lse or None."""
    from . import _graphs

    return _graphs.attention(q, k, v, params)


def single_decode(q, k, v, params):
    """q ``[1, Hq, D]``, k/v ``[kv_len, Hkv, D]`` (views) → out ``[1, Hq, D]``, lse or None."""
    from . import _graphs

    return _graphs.attention(q, k, v, params)


def prefill_reasons(problem):
    return support.reasons(problem, support.installed_versions())


def decode_reasons(problem):
    return support.reasons(problem, support.installed_versions())


def batch_planner(plan):
    """A :class:`~flashinfer.attention.batch_params.BatchPlan` → its runner (host work here)."""
    from . import _batch_graphs

    return _batch_graphs.plan(plan)


def _batch_prepare(plan):
    """Two-phase form (``Prepared``): the host part before the plan's upload."""
    from . import _batch_graphs

    return _batch_graphs.prepare(plan)


batch_planner.prepare = _batch_prepare


def batch_reasons(problem):
    return batch_support.reasons(problem, support.installed_versions())



def graph_cache_state() -> dict:
    """Hits, misses, evictions and size of the graph cache (one entry per call geometry, holding
    its one or two graphs); {} before first use."""
    graphs = sys.modules.get(__name__ + "._graphs")
    return graphs.state() if graphs is not None else {}


def batch_graph_cache_state() -> dict:
    """Hits, misses, evictions and size of the batch graph cache (one entry per bucketed spec and
    KV-operand geometry) and the number of CUDA-graph buffer stores; {} before first use."""
    graphs = sys.modules.get(__name__ + "._batch_graphs")
    return graphs.state() if graphs is not None else {}

