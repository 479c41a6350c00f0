"""``autotune()``: measure the kernels a block's calls could use and make the fastest the rule
(upstream's ``flashinfer.autotune`` / ``flashinfer.autotuner.autotune``, on this dispatcher).

::

    with flashinfer.autotune(cache="tuned.json"):   # tune_mode=True
        model.forward(batch)                         # one representative step
    model.forward(batch)                             # now runs the measured winners

Inside a tuning block, the first call of each new Problem of a tunable op (below) with more
than one usable kernel, chosen by the default rules (not forced by ``backend=`` /
``use_backend`` / an environment override), runs every usable kernel on the call's own
arguments: one warm-up and :data:`REPEATS` timed runs each (CUDA: synchronised; the median),
then the fastest once more, so the call's outputs are the winner's. Each measured Problem
becomes a tuned rule (:mod:`flashinfer.dispatch_rules`: the op, the SM family, the exact shape
facts and features, the kernels fastest first, the timings as its basis), written at the end of
the block to ``cache`` (merged with the rules already in it) or, without ``cache``, to a
temporary file; ``FLASHINFER_TUNED_RULES`` then points at that file for the rest of the process
(decisions made from then on follow it; ``flashinfer explain`` shows the rule). ``tune_mode=
False`` only loads ``cache``. Rules match dtypes by the shape facts and features only (a rule
tuned on bf16 also orders an fp16 Problem of the same shape).

Tunable ops: kernels that write their outputs without reading them and read nothing they write
(so several kernels can run on one call's arguments): the dense GEMMs, single-request attention,
the gated activations, softmax and the sampling ops (their seeds are arguments, so every kernel
draws from the same stream). The norms, RoPE (in place) and the batch wrappers (their kernels
are chosen at plan()) are not. ``tuning_buckets``, ``round_up`` are accepted for upstream's
signature: Problems are already keyed by bucketed shapes here.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Iterable, Optional

import torch

from . import dispatch, envs

__all__ = ["autotune", "TUNABLE_OPS", "REPEATS"]

TUNABLE_OPS = frozenset({
    "mm_bf16", "bmm_fp8", "gemm_fp8_groupwise", "mm_fp4", "single_decode", "single_prefill",
    "act_and_mul", "softmax", "sampling_from_probs", "sampling_from_logits",
    "top_k_top_p_sampling_from_logits", "top_k_mask_logits", "renorm_probs",
})
REPEATS = 5


def _timed(fn, args, cuda: bool) -> float:
    """Median seconds of one call of ``fn(*args)`` (after one warm-up)."""
    fn(*args)
    times = []
    for _ in range(REPEATS):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*args)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _record_of(candidate, problem) -> tuple[str, str, str]:
    return candidate.backend, problem.op, candidate.variant


class _Tuner:
    """The observer of one tuning block: hands out measuring Decisions, keeps the results."""

    def __init__(self, skip_ops: Iterable[str]):
        self.skip = frozenset(skip_ops)
        self.results: dict = {}  # Problem -> [(seconds, candidate name)], fastest first

    def see(self, decision: "dispatch.Decision") -> "dispatch.Decision":
        problem = decision.problem
        if (problem.op not in TUNABLE_OPS or problem.op in self.skip
                or decision.source not in ("default", "tuned") or len(decision.order) < 2
                or problem in self.results):
            return decision
        return replace(decision, _kernel=[self._measuring(decision)])

    def _measuring(self, decision):
        problem = decision.problem
        cands = {c.name: c for c in decision.candidates if c.usable}

        def run(*args):
            known = self.results.get(problem)
            if known is not None:  # measured by an earlier call of this block
                return dispatch.kernel_for(*_record_of(cands[known[0][1]], problem))(*args)
            cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            timings = sorted((_timed(dispatch.kernel_for(*_record_of(cands[name], problem)), args, cuda), name)
                             for name in decision.order if name in cands)
            self.results[problem] = timings
            return dispatch.kernel_for(*_record_of(cands[timings[0][1]], problem))(*args)
        return run

    def rules(self) -> list[dict]:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        out = []
        for problem, timings in self.results.items():
            family = dispatch.sm_family(problem.sm)
            measured = ", ".join(f"{name} {seconds * 1e6:.1f} us" for seconds, name in timings)
            out.append({
                "op": problem.op,
                "name": f"autotune_{problem.op}_{hashlib.sha1(repr(problem).encode()).hexdigest()[:10]}",
                "families": [family],
                "when": {fact: {"values": [value]} for fact, value in problem.shape},
                "features": sorted(problem.features),
                "order": [name for _, name in timings],
                "basis": f"autotune() on {problem.device} (SM family {family}), {stamp}: {measured}",
            })
        return out


def _merge_write(path: str, rules: list[dict]) -> None:
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f).get("rules", [])
    names = {r["name"] for r in rules}
    with open(path, "w") as f:
        json.dump({"rules": rules + [r for r in kept if r.get("name") not in names]}, f, indent=1)


@contextlib.contextmanager
def autotune(tune_mode: bool = True, cache: Optional[str] = None, tuning_buckets=None,
             round_up=None, skip_ops: Optional[Iterable[str]] = None):
    """Measure, inside the block, the kernels of each new tunable Problem and make the fastest
    the tuned rule (module docstring). ``cache``: a JSON rules file, loaded at entry when it
    exists and written at exit; ``tune_mode=False``: load only; ``skip_ops``: op names (e.g.
    ``"mm_bf16"``) not to measure. Yields None."""
    if cache is not None and os.path.exists(cache):
        os.environ[envs.TUNED_RULES.name] = os.path.abspath(cache)
    if not tune_mode:
        yield None
        return
    tuner = _Tuner(skip_ops or ())
    try:
        with dispatch.observe(tuner):
            yield None
    finally:
        rules = tuner.rules()
        if rules:
            if cache is None:
                handle, cache = tempfile.mkstemp(prefix="flashinfer_tuned_", suffix=".json")
                os.close(handle)
            _merge_write(cache, rules)
            os.environ[envs.TUNED_RULES.name] = os.path.abspath(cache)
