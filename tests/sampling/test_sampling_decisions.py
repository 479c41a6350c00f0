"""Dispatch decisions for the sampling ops on simulated SMs (no GPU needed) and on the CPU."""

import pytest
import torch

import flashinfer
from flashinfer.device import simulated
from flashinfer.dispatch import Problem, select

SMS = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0", "cpu"]

PROBLEMS = {
    "sampling_from_probs": ({"probs": "float32"}, ["top_k", "top_p", "joint", "indices"]),
    "sampling_from_logits": ({"logits": "bfloat16"}, ["indices"]),
    "top_k_top_p_sampling_from_logits": ({"logits": "float32"}, ["top_k", "top_p", "indices"]),
    "renorm_probs": ({"probs": "float16"}, ["top_p"]),
    "top_k_mask_logits": ({"logits": "float32"}, []),
    "softmax": ({"logits": "bfloat16"}, ["temperature"]),
    "chain_speculative_sampling": ({"probs": "float32"}, []),
}

# the Triton kernel `auto` takes first on a GPU for each PROBLEMS entry (dispatch_rules/*.toml)
FIRST_TRITON = {
    "sampling_from_probs": "triton:two_pass",
    "sampling_from_logits": "triton:one_pass",
    "top_k_top_p_sampling_from_logits": "triton:two_pass",
    "renorm_probs": "triton:bracket",  # top-p renormalisation: the bracket-and-sort kernel
    "top_k_mask_logits": "triton:two_pass",
    "softmax": "triton:streaming",
    "chain_speculative_sampling": "triton",
}


def _problem(op, sm, features=None, top_k=64):
    dtypes, default_features = PROBLEMS[op]
    shape = {"batch_size": 64, "vocab_size": 131072}
    if op == "chain_speculative_sampling":
        shape["num_draft"] = 4
    if op in ("sampling_from_probs", "top_k_top_p_sampling_from_logits") and top_k is not None:
        shape["top_k"] = top_k
    return Problem.make(op, simulated(None if sm == "cpu" else sm), dtypes=dtypes, shape=shape,
                        features=default_features if features is None else features)


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op", list(PROBLEMS))
def test_default_order(op, sm):
    decision = select(_problem(op, sm), assume_installed=True)
    usable = {c.backend for c in decision.candidates if c.usable}
    assert {"reference", "torch"} <= usable
    if sm == "cpu":
        assert decision.backend == "reference"
        assert decision.order[:2] == ("reference", "torch")
    else:
        # triton first where its record accepts the problem, then the torch baseline (on SM 9.0
        # measured for every op, top-k masking included since the (512, 16) launch shape)
        expected = [b for b in ("triton", "torch", "reference") if b in usable]
        assert list(dict.fromkeys(n.split(":")[0] for n in decision.order)) == expected
        assert decision.backend == expected[0]
        if "triton" in usable:
            # the measured variant first where its check accepts the problem (a scalar top-k of
            # at most 512 for the two-pass kernels), the general kernel behind it
            assert decision.name == FIRST_TRITON[op]
            assert decision.order[0] == FIRST_TRITON[op]
    # the rule says where its order comes from: an H200 measurement or "not yet measured"
    assert "measured on the H200" in decision.basis or "not yet measured" in decision.basis


@pytest.mark.parametrize("sm", SMS)
@pytest.mark.parametrize("op", ["sampling_from_probs", "sampling_from_logits",
                                "chain_speculative_sampling"])
def test_tensor_seeds_reject_the_torch_backend(op, sm):
    features = ["seed_tensor"] + ([] if op == "chain_speculative_sampling" else ["indices"])
    decision = select(_problem(op, sm, features), assume_installed=True)
    torch_cand = next(c for c in decision.candidates if c.backend == "torch")
    assert [(r.field, r.actual) for r in torch_cand.reasons] == [("feature", "seed_tensor")]
    assert decision.backend != "torch"
    if sm == "cpu":
        assert decision.backend == "reference"


@pytest.mark.parametrize("sm", SMS[:-1])
@pytest.mark.parametrize("features,top_k,field", [
    (["top_k", "top_p"], 1024, "shape.top_k"),
    (["top_k", "top_k_per_row", "top_p"], None, "feature"),
    (["top_k", "min_p"], 64, "feature"),
    (["top_p"], None, "feature"),
], ids=["large_top_k", "top_k_per_row", "top_k_and_min_p", "top_p_alone"])
def test_calls_the_two_pass_sampler_does_not_serve_take_the_general_kernel(sm, features, top_k,
                                                                          field):
    decision = select(_problem("sampling_from_probs", sm, features, top_k), assume_installed=True)
    two_pass = next(c for c in decision.candidates if c.variant == "two_pass")
    assert not two_pass.usable and [r.field for r in two_pass.reasons] == [field]
    # top-p alone goes to the nucleus sampler; the rest to the general kernel
    assert decision.name == ("triton:nucleus" if features == ["top_p"] else "triton")


@pytest.mark.parametrize("sm", SMS[:-1])
@pytest.mark.parametrize("features", [["top_p", "min_p"], ["top_k", "top_p"], ["min_p"], []],
                         ids=["top_p_min_p", "top_k_top_p", "min_p", "plain"])
def test_the_nucleus_sampler_serves_top_p_alone(sm, features):
    decision = select(_problem("sampling_from_probs", sm, features, 64), assume_installed=True)
    nucleus = next(c for c in decision.candidates if c.variant == "nucleus")
    if features == []:
        assert [r.field for r in nucleus.reasons] == ["feature"]  # the check: no top_p
    else:
        assert not nucleus.usable
    assert decision.name != "triton:nucleus"


@pytest.mark.parametrize("sm", SMS[:-1])
@pytest.mark.parametrize("features", [[], ["min_p"], ["min_p", "indices", "seed_tensor"]],
                         ids=["plain", "min_p", "min_p_indices_seeds"])
def test_plain_and_min_p_sampling_take_the_two_pass_sampler(sm, features):
    decision = select(_problem("sampling_from_probs", sm, features, None), assume_installed=True)
    assert decision.name == "triton:two_pass"


def test_gpu_records_are_verified_only_where_they_ran():
    """verified_on = ["9.0"]: the H200 run; other SMs in the range stay unverified."""
    for sm, want in (("9.0", True), ("8.0", False), ("12.0", False)):
        decision = select(_problem("sampling_from_probs", sm), assume_installed=True)
        for backend in ("torch", "triton"):
            cand = next(c for c in decision.candidates if c.backend == backend)
            assert cand.verified == want, (sm, backend)


def test_calls_record_the_decision():
    p = torch.rand(4, 16)
    with flashinfer.record_decisions() as log:
        flashinfer.top_k_top_p_sampling_from_probs(p, 3, 0.5, seed=0, offset=0)
        flashinfer.top_p_renorm_probs(p, 0.5, backend="torch")
    assert [(d.problem.op, d.backend) for d in log] == [("sampling_from_probs", "reference"),
                                                        ("renorm_probs", "torch")]
    assert log[0].problem.features == frozenset({"top_k", "top_p"})
    assert dict(log[0].problem.shape) == {"batch_size": 4, "vocab_size": 16, "top_k": 4}


def test_environment_override_selects_the_family_backend(monkeypatch):
    monkeypatch.setenv("FLASHINFER_SAMPLING_BACKEND", "torch")
    with flashinfer.record_decisions() as log:
        flashinfer.sampling_from_probs(torch.rand(3, 10), seed=1, offset=0)
    assert log[-1].backend == "torch" and log[-1].source == "environment"
