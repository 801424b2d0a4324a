"""The ops of ONNX's other domains: the training optimizers and ai.onnx.ml's Binarizer / ArrayFeatureExtractor."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln.relay.frontend import OnnxImportError, OnnxRunner, from_onnx  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
TRAINING, ML = "ai.onnx.preview.training", "ai.onnx.ml"
_RNG = np.random.default_rng(7)


def _model(node: Any, inputs: list[Any], n_out: int, domain: str) -> Any:
    outputs = [helper.make_tensor_value_info(o, F, None) for o in node.output[:n_out]]
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])


def _check(model: Any, feeds: dict[str, np.ndarray]) -> None:
    want = ReferenceEvaluator(model).run(None, feeds)
    got = OnnxRunner(model)(**feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)


def _optimizer_case(op: str, states: int, shapes: list[tuple[int, ...]], **attrs: Any) -> tuple[Any, dict[str, Any]]:
    groups = ["X", "G", "V", "H"][:2 + states]
    names = [f"{g}{i}" for g in groups for i in range(len(shapes))]
    node = helper.make_node(op, ["R", "T", *names], [f"{g}{i}_new" for g in ["X", "V", "H"][:1 + states]
                                                   for i in range(len(shapes))], domain=TRAINING, **attrs)
    inputs = [helper.make_tensor_value_info("R", F, []), helper.make_tensor_value_info("T", I64, [])]
    feeds: dict[str, Any] = {"R": np.array(0.1, np.float32)}
    for g in groups:
        for i, shape in enumerate(shapes):
            inputs.append(helper.make_tensor_value_info(f"{g}{i}", F, shape))
            value = _RNG.normal(size=shape)
            feeds[f"{g}{i}"] = (np.abs(value) if g == "H" else value).astype(np.float32)
    return _model(node, inputs, len(node.output), TRAINING), feeds


@pytest.mark.parametrize("step", [0, 3])
@pytest.mark.parametrize("op, states, attrs", [
    ("Adagrad", 1, {"decay_factor": 0.1, "epsilon": 1e-6, "norm_coefficient": 0.01}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.0}),
    ("Adam", 2, {"alpha": 0.8, "beta": 0.95, "epsilon": 1e-4, "norm_coefficient": 0.01,
                 "norm_coefficient_post": 0.02}),
])
def test_optimizers_update_every_tensor_like_the_reference(op: str, states: int, attrs: dict[str, Any],
                                                           step: int) -> None:
    model, feeds = _optimizer_case(op, states, [(3, 4), (5,)], **attrs)
    feeds["T"] = np.array(step, np.int64)
    _check(model, feeds)


def test_optimizer_inputs_must_come_in_groups() -> None:
    node = helper.make_node("Adagrad", ["R", "T", "X", "G"], ["X_new"], domain=TRAINING)
    inputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in [("R", F, []), ("T", I64, []), ("X", F, [2]),
                                                                     ("G", F, [2])]]
    with pytest.raises(OnnxImportError, match=r"Adagrad node.*3 inputs per optimized tensor; found 2 after T"):
        from_onnx(_model(node, inputs, 1, TRAINING))


def test_binarizer_and_array_feature_extractor() -> None:
    x = _RNG.normal(size=(3, 5)).astype(np.float32)
    node = helper.make_node("Binarizer", ["x"], ["y"], domain=ML, threshold=0.25)
    _check(_model(node, [helper.make_tensor_value_info("x", F, [3, 5])], 1, ML), {"x": x})
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ML)
    inputs = [helper.make_tensor_value_info("x", F, [3, 5]), helper.make_tensor_value_info("i", I64, [1, 3])]
    _check(_model(node, inputs, 1, ML), {"x": x, "i": np.array([[4, 0, 4]], np.int64)})
