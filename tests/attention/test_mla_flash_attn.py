"""MLA through FA3's ``qv`` path (flashinfer/backends/flash_attn/mla.py) on the CPU: the vendor
call replaced by the float64 FA emulator (``qv . v`` added to the scores), so the gather of the
paged latent tokens, the varlen arguments and the lse conversion are checked against naive MLA:
ragged and causal batches, pages of 1 / 4 / 16, separate caches, page ids kept on the device
(looked up and checked at run, a bad one recorded)."""

from __future__ import annotations

import pytest
import torch

from attention_helpers import emulated_fa_calls  # noqa: F401 - the `calls` fixture
from conftest import poison, rel_error
from mla_helpers import _assert_lse, _case, _plan, naive
import flashinfer
from flashinfer.attention.mla_params import MLAScales
from flashinfer.dispatch import kernel_for

SCALE = 0.17


def _runner_for(arrays, page_size, causal, on_device_ids=False):
    """The FA3 MLA runner over the plan a CPU wrapper makes (ids on the "device": the plan's
    host copy of them dropped, as plan() does for ids on a GPU)."""
    plan = _plan(arrays, page_size, causal, SCALE, backend="reference")._plan
    if on_device_ids:
        plan.kv_indices_host, plan.max_page_id = None, None
    return kernel_for("flash_attn", "batch_mla", "fa3")(plan)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("causal,qo_lens", [(False, [1, 1, 1, 1]), (True, [2, 1, 3, 2])])
def test_matches_naive_mla(page_size, causal, qo_lens, calls):
    arrays, t = _case(qo_lens, [1, page_size - 1 or 1, page_size + 1, 40], page_size=page_size,
                      seed=page_size)
    runner = _runner_for(arrays, page_size, causal)
    out = poison(torch.empty_like(t["q_nope"][..., :32].expand(-1, -1, 32).contiguous()))
    lse = poison(torch.empty(t["q_nope"].shape[:2]))
    got = runner(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"], out, lse, MLAScales())
    want, want_lse = naive(arrays, t, page_size, causal, SCALE)
    assert got is out and rel_error(got, want) < 1e-5
    _assert_lse(lse, want_lse)
    assert calls[-1]["causal"] == causal and calls[-1]["max_k"] == 40


def test_separate_caches_and_no_out(calls):
    arrays, t = _case([1, 2], [9, 17], page_size=4, seed=3)
    runner = _runner_for(arrays, 4, True)
    ckv = torch.cat([t["ckv_cache"], torch.randn_like(t["ckv_cache"])], -1)[..., :32]  # strided
    got = runner(t["q_nope"], t["q_pe"], ckv, t["kpe_cache"].clone(), None, None, MLAScales())
    want, _ = naive(arrays, dict(t, ckv_cache=ckv), 4, True, SCALE)
    assert rel_error(got, want) < 1e-5


def test_page_ids_on_the_device_are_looked_up_and_checked(calls):
    arrays, t = _case([1, 1], [6, 9], page_size=4, seed=4)
    runner = _runner_for(arrays, 4, False, on_device_ids=True)
    got = runner(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"], None, None, MLAScales())
    assert rel_error(got, naive(arrays, t, 4, False, SCALE)[0]) < 1e-5
    flashinfer.check_errors()
    bad = dict(arrays, kv_indices=arrays["kv_indices"].clone())
    bad["kv_indices"][1] = 1 << 20
    runner = _runner_for(bad, 4, False, on_device_ids=True)
    got = runner(t["q_nope"], t["q_pe"], t["ckv_cache"], t["kpe_cache"], None, None, MLAScales())
    assert torch.isfinite(got).all()
    with pytest.raises(ValueError, match=r"kv_indices\[1\] = 1048576"):
        flashinfer.check_errors()


def test_declared_for_sm90_behind_the_triton_kernel():
    from flashinfer.dispatch import Problem, select
    from flashinfer.device import simulated

    problem = Problem.make("batch_mla", simulated("9.0"),
                           dtypes={"q": "bfloat16", "kv": "bfloat16", "o": "bfloat16"},
                           shape={"num_heads": 128, "head_dim_ckv": 512, "head_dim_kpe": 64,
                                  "page_size": 1}, features={"separate_caches"})
    decision = select(problem, assume_installed=True)
    assert decision.name == "triton"  # fa3 gathers tokens: slower in decode on the H200
    assert decision.order[decision.order.index("triton") + 1] == "flash_attn:fa3"
