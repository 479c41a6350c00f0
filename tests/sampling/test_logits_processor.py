"""flashinfer.logits_processor: legalization by tensor type, the checks, the default fusions, and
the pipelines' results against the sampling functions they fuse into (same seed, same draw)."""

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
