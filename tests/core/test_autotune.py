"""flashinfer.autotune (flashinfer/autotuner.py): a tuning block measures the usable kernels of
each new tunable Problem on the call's own arguments, returns the winner's outputs, and leaves a
tuned rule that later decisions follow; forced backends, untunable ops and tune_mode=False are
left alone."""

from __future__ import annotations

import json

import pytest
import torch

import flashinfer
from flashinfer import dispatch


@pytest.fixture
def tuned_env(monkeypatch):
    monkeypatch.delenv("FLASHINFER_TUNED_RULES", raising=False)  # restored after the test
    yield


def _decision(fn):
    with dispatch.record_decisions() as log:
        out = fn()
    return log[-1], out


def test_a_tuning_block_measures_and_leaves_a_rule(tuned_env, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    before, want = _decision(lambda: flashinfer.silu_and_mul(x))
    assert len(before.order) >= 2  # reference and Triton (the interpreter on a CPU)
    cache = tmp_path / "tuned.json"
    with flashinfer.autotune(cache=str(cache)):
        got = flashinfer.silu_and_mul(x)
        again = flashinfer.silu_and_mul(x)  # measured already: the winner runs
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)
    rules = json.loads(cache.read_text())["rules"]
    assert [r["op"] for r in rules] == ["act_and_mul"] and "autotune()" in rules[0]["basis"]
    after, _ = _decision(lambda: flashinfer.silu_and_mul(x))
    assert after.source == "tuned" and after.rule == rules[0]["name"]
    assert list(after.order) == rules[0]["order"]
    with flashinfer.autotune(cache=str(cache)):  # a second block merges, same rule name
        flashinfer.silu_and_mul(torch.randn(2, 32))
    names = [r["name"] for r in json.loads(cache.read_text())["rules"]]
    assert len(names) == 2 and rules[0]["name"] in names


def test_forced_backends_and_untunable_ops_are_not_measured(tuned_env, tmp_path):
    x, w = torch.randn(4, 64), torch.randn(64)
    cache = tmp_path / "t.json"
    with flashinfer.autotune(cache=str(cache)):
        flashinfer.silu_and_mul(x, backend="reference")
        flashinfer.rmsnorm(x, w)
    assert not cache.exists()


def test_tune_mode_false_only_loads_the_cache(tuned_env, tmp_path, monkeypatch):
    cache = tmp_path / "t.json"
    x = torch.randn(4, 64)
    with flashinfer.autotune(cache=str(cache)):
        flashinfer.silu_and_mul(x)
    monkeypatch.delenv("FLASHINFER_TUNED_RULES")
    with flashinfer.autotune(tune_mode=False, cache=str(cache)):
        decision, _ = _decision(lambda: flashinfer.silu_and_mul(x))
    assert decision.source == "tuned"
