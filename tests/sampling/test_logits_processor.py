"""flashinfer.logits_processor: legalization by tensor type, the checks, the default fusions, and
the pipelines' results against the sampling functions they fuse into (same seed, same draw); on
CUDA (marker ``gpu``), pipelines against the CPU and the float64 keep sets (never exact draws
across devices)."""

from __future__ import annotations

import pytest
import torch

import flashinfer
from flashinfer import logits_processor as lp
from flashinfer.logits_processor import (
    FusionRule, LogitsPipe, MinP, Sample, Softmax, TaggedTensor, Temperature, TensorType, TopK,
    TopP,
)


def _names(ops):
    return [type(op).__name__ for op in ops]


def test_legalization_and_default_fusions():
    pipe = LogitsPipe([Temperature(), Softmax(), TopK(), Sample()])
    assert pipe.initial_type == TensorType.LOGITS
    assert _names(pipe.ops) == ["TemperatureOp", "SoftmaxOp", "ProbsTopKOp", "ProbsSampleOp"]
    assert _names(pipe.compiled_ops) == ["FusedTemperatureSoftmaxOp", "FusedProbsTopKSampleOp"]
    joint = LogitsPipe([Softmax(), TopK(joint_topk_topp=True), TopP(), Sample()])
    assert _names(joint.compiled_ops) == ["SoftmaxOp", "FusedProbsTopKTopPSampleOp"]
    sequential = LogitsPipe([Softmax(), TopK(), TopP(), Sample()])
    assert _names(sequential.compiled_ops) == ["SoftmaxOp", "ProbsTopKOp", "FusedProbsTopPSampleOp"]
    logits_pipe = LogitsPipe([TopK(), Sample()], input_type=TensorType.LOGITS)
    assert _names(logits_pipe.compiled_ops) == ["LogitsTopKOp", "LogitsSampleOp"]
    assert "compiled_ops=[LogitsTopKOp -> LogitsSampleOp]" in repr(logits_pipe)


@pytest.mark.parametrize("processors, kwargs, words", [
    ([TopK(), Sample()], {}, "input_type"),
    ([TopP(), Softmax()], {}, "Softmax takes LOGITS"),
    ([Softmax(), Softmax()], dict(input_type=TensorType.LOGITS), "Softmax takes LOGITS"),
    ([Temperature(), Sample(), Sample()], {}, "takes LOGITS or PROBS, got INDICES"),
    ([], {}, "at least one"),
])
def test_pipelines_that_cannot_be_built(processors, kwargs, words):
    with pytest.raises(ValueError, match=words):
        LogitsPipe(processors, **kwargs)


def test_results_equal_the_fused_sampling_functions():
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 3
    pipe = LogitsPipe([Temperature(), Softmax(), TopK(), TopP(), Sample()])
    torch.manual_seed(7)
    got = pipe(logits, temperature=0.7, top_k=20, top_p=0.8)
    probs = flashinfer.sampling.top_k_renorm_probs(flashinfer.sampling.softmax(logits, 0.7), 20)
    torch.manual_seed(7)
    want = flashinfer.sampling.top_p_sampling_from_probs(probs, 0.8)
    assert torch.equal(got, want)
    masked = LogitsPipe([TopK(top_k=5)], input_type=TensorType.LOGITS)(logits)
    assert torch.equal(torch.isfinite(masked).sum(-1), torch.full((4,), 5))
    argmax = LogitsPipe([Softmax(), TopK(), Sample()])(logits, top_k=1)
    assert torch.equal(argmax.long(), logits.argmax(-1))


def test_min_p_and_call_parameters_override_defaults():
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(3, 50) * 2, -1)
    kept = LogitsPipe([MinP(min_p=0.5)], input_type=TensorType.PROBS)(probs)
    want = torch.where(probs >= 0.5 * probs.amax(-1, keepdim=True), probs, 0)
    torch.testing.assert_close(kept, want / want.sum(-1, keepdim=True))
    pipe = LogitsPipe([TopK(top_k=50)], input_type=TensorType.PROBS)
    assert int((pipe(probs, top_k=2) > 0).sum(-1).max()) == 2  # the call's top_k wins
    with pytest.raises(ValueError, match="required parameter 'top_p'"):
        LogitsPipe([TopP()], input_type=TensorType.PROBS)(probs)


def test_custom_processor_and_fusion_rule():
    class DoubleOp(lp.ParameterizedOp):
        IN = OUT = TensorType.LOGITS

        def __call__(self, tensor, **kwargs):
            return TaggedTensor(tensor.data * 2, self._validate_input_type(tensor))

    class Double(lp.LogitsProcessor):
        def legalize(self, input_type):
            return [DoubleOp()]

    class QuadOp(DoubleOp):
        def __call__(self, tensor, **kwargs):
            return TaggedTensor(tensor.data * 4, self._validate_input_type(tensor))

    rule = FusionRule((DoubleOp, DoubleOp), lambda w: True, lambda w: QuadOp(), prio=50)
    pipe = LogitsPipe([Double(), Double()], input_type=TensorType.LOGITS, custom_fusion_rules=[rule])
    assert _names(pipe.compiled_ops) == ["QuadOp"]
    x = torch.randn(2, 3)
    torch.testing.assert_close(pipe(x), x * 4)
    uncompiled = LogitsPipe([Double(), Double()], compile=False, input_type=TensorType.LOGITS)
    assert uncompiled.compiled_ops is None and torch.equal(uncompiled(x), x * 4)


# --- GPU: pipelines on CUDA tensors vs the CPU and float64 keep sets ----------------------------

DEV = "cuda"
VOCAB = 32000
SPREADS = (3.0, 40.0, 160.0, 640.0)  # flat to peaked rows
DRAWS = 500  # per row, one batched call through ``indices``


def _grid_logits(seed):
    """float32 logits ``[4, VOCAB]``: row r a seeded random permutation of an evenly spaced grid
    over [-SPREADS[r], SPREADS[r]]. Distinct values whose probabilities differ by at least 1e-4
    relatively, and a sorted row that does not depend on the seed: the keep sets below have no
    near-ties, whatever the float32 rounding of either device."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.linspace(-1.0, 1.0, VOCAB, dtype=torch.float64)
    return torch.stack([(s * grid)[torch.randperm(VOCAB, generator=g)] for s in SPREADS]).float()


def _keep(logits, temperature, top_k, top_p, joint):
    """float64 keep mask ``[rows, VOCAB]``: the ``top_k[r]`` largest of softmax(logits /
    temperature[r]), then those whose strictly larger mass is below ``top_p[r]`` times the top-k
    mass (``joint``: times the whole row's mass); and the smallest distance, relative to that
    mass, of any such larger mass from the threshold (how close the inputs come to a tie)."""
    p = torch.softmax(logits.double() / torch.tensor(temperature, dtype=torch.float64)[:, None], -1)
    order = p.argsort(-1, descending=True)
    keep, margin = torch.zeros(p.shape, dtype=torch.bool), float("inf")
    for r in range(p.shape[0]):
        head = order[r, :top_k[r]]
        base = p[r].sum() if joint else p[r, head].sum()
        gap = p[r, head].cumsum(0) - p[r, head] - top_p[r] * base
        keep[r, head[gap < 0]] = True
        margin = min(margin, float(gap.abs().min() / base))
    return keep, margin


def _draw_rows():
    """int32 ``[4 * DRAWS]``: each input row DRAWS times (outputs read rows through it)."""
    return torch.arange(len(SPREADS), dtype=torch.int32).repeat_interleave(DRAWS)


def _assert_on_the_gpu(log, *ops):
    """Each of ``ops`` was dispatched, every Decision for the CUDA device (the backend is the
    dispatcher's choice: triton or torch on an H200, not required here)."""
    seen = [d.problem.op for d in log]
    assert set(ops) <= set(seen), seen
    assert all(d.problem.device == torch.device(DEV).type for d in log), [d.name for d in log]


@pytest.mark.gpu
def test_gpu_temperature_softmax_top_k_top_p_sample_pipeline():
    """Temperature, Softmax, TopK, TopP (, Sample) on CUDA: the CPU's probabilities, kept draws."""
    # filtered probabilities: the same zeros, values to float32 rounding (rtol 1e-4, atol 1e-7);
    # every sampled token inside the float64 keep set
    logits = _grid_logits(40)
    params = dict(temperature=0.7, top_k=50, top_p=0.8)
    keep, margin = _keep(logits, [0.7] * 4, [50] * 4, [0.8] * 4, joint=False)
    assert margin > 1e-3  # (a property of the grid, checked: no token near the top-p threshold)
    filtered = [Temperature(), Softmax(), TopK(), TopP()]
    want = LogitsPipe(filtered)(logits, **params)
    assert torch.equal(want > 0, keep)  # the CPU path keeps the float64 set
    with flashinfer.record_decisions() as log:
        got = LogitsPipe(filtered)(logits.to(DEV), **params)
    _assert_on_the_gpu(log, "softmax", "renorm_probs")
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-7)
    assert torch.equal(got.cpu() > 0, keep)

    pipe = LogitsPipe(filtered + [Sample()])
    assert _names(pipe.compiled_ops) == ["FusedTemperatureSoftmaxOp", "ProbsTopKOp",
                                         "FusedProbsTopPSampleOp"]
    rows = _draw_rows()
    torch.manual_seed(41)
    with flashinfer.record_decisions() as log:
        tokens = pipe(logits.to(DEV), indices=rows.to(DEV), **params)
    _assert_on_the_gpu(log, "softmax", "renorm_probs", "sampling_from_probs")
    tokens = tokens.cpu().long()
    assert tokens.shape == rows.shape and bool(keep[rows.long(), tokens].all())
    # every row keeps >= 25 tokens, none above 7% of the mass: one token DRAWS times is a bug
    assert all(tokens[rows == r].unique().numel() > 1 for r in range(len(SPREADS)))


@pytest.mark.gpu
def test_gpu_fused_joint_top_k_top_p_pipeline():
    """Fused joint top-k / top-p sampling pipeline on CUDA: every draw in the float64 keep set."""
    # Softmax, TopK(joint_topk_topp=True), TopP, Sample with per-row top_k / top_p tensors; the
    # row with top_k = 1 always gives its argmax
    logits = _grid_logits(42)
    top_k, top_p = [1, 1000, 300, 50], [0.5, 0.7, 0.6, 0.8]
    keep, margin = _keep(logits, [1.0] * 4, top_k, top_p, joint=True)
    assert margin > 1e-4
    pipe = LogitsPipe([Softmax(), TopK(joint_topk_topp=True), TopP(), Sample()])
    assert _names(pipe.compiled_ops) == ["SoftmaxOp", "FusedProbsTopKTopPSampleOp"]
    rows = _draw_rows()
    torch.manual_seed(43)
    with flashinfer.record_decisions() as log:
        tokens = pipe(logits.to(DEV), indices=rows.to(DEV),
                      top_k=torch.tensor(top_k, dtype=torch.int32, device=DEV),
                      top_p=torch.tensor(top_p, device=DEV))
    _assert_on_the_gpu(log, "softmax", "sampling_from_probs")
    tokens = tokens.cpu().long()
    assert tokens.shape == rows.shape and bool(keep[rows.long(), tokens].all())
    assert bool((tokens[rows == 0] == logits[0].argmax()).all())


@pytest.mark.gpu
def test_gpu_top_k_1_pipelines_give_the_argmax():
    """top_k = 1 pipelines on CUDA, on probabilities and on logits, give each row's argmax."""
    # a per-row temperature tensor; and the masked logits (top_k = 20) equal the CPU's
    logits = _grid_logits(44)
    temperature = torch.tensor([0.5, 1.0, 1.5, 2.0])
    rows = _draw_rows()
    on_probs = LogitsPipe([Temperature(), Softmax(), TopK(), Sample()])
    on_logits = LogitsPipe([Temperature(), TopK(), Sample()])
    assert _names(on_probs.compiled_ops) == ["FusedTemperatureSoftmaxOp", "FusedProbsTopKSampleOp"]
    assert _names(on_logits.compiled_ops) == ["TemperatureOp", "LogitsTopKOp", "LogitsSampleOp"]
    kw = dict(temperature=temperature.to(DEV), top_k=1)
    torch.manual_seed(45)
    for pipe, ops in ((on_probs, ("softmax", "sampling_from_probs")),
                      (on_logits, ("top_k_mask_logits", "sampling_from_logits"))):
        with flashinfer.record_decisions() as log:
            tokens = pipe(logits.to(DEV), indices=rows.to(DEV), **kw)
        _assert_on_the_gpu(log, *ops)
        assert torch.equal(tokens.cpu().long(), logits.argmax(-1)[rows.long()])
    masking = LogitsPipe([Temperature(), TopK()])
    want = masking(logits, temperature=temperature, top_k=20)
    got = masking(logits.to(DEV), temperature=temperature.to(DEV), top_k=20).cpu()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert (torch.isfinite(want).sum(-1) == 20).all()
    torch.testing.assert_close(got, want)
