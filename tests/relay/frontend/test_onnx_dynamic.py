"""Control flow (If, Loop, Scan) and value-sized outputs (NonZero, Unique, Compress, NonMaxSuppression).

Each model runs through `OnnxRunner` with every input given at run time and is
checked against onnxruntime (onnx's reference evaluator gets Loop's scan
outputs, reverse Scans and Unique wrong).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

ort = pytest.importorskip("onnxruntime")

from kiln.relay.frontend import OnnxImportError, OnnxRunner, OnnxValueNeededError, from_onnx  # noqa: E402
from kiln.relay.frontend._onnx_dynamic import MAX_UNROLL  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name: str, dtype: int, shape: Any) -> Any:
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 17) -> Any:
    # ir_version 10: onnx's default is newer than onnxruntime 1.23 (the newest for Python 3.10) reads
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _check(model: Any, feeds: dict[str, np.ndarray]) -> None:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = OnnxRunner(model)(**feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _if_model() -> Any:
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [_vi("t", F, [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", F, [3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")
    return _model([node], [_vi("c", B, []), _vi("x", F, [3])], [_vi("y", F, [3])])


@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_the_branch_its_condition_picks(cond: bool) -> None:
    _check(_if_model(), {"c": np.array(cond), "x": np.array([1.0, -2.0, 3.0], np.float32)})


def test_if_condition_from_a_graph_input_is_a_value_the_import_needs() -> None:
    with pytest.raises(OnnxValueNeededError, match=r"If node 'if'.*input #0 \(cond\).*'c'"):
        from_onnx(_if_model())


def _loop_model(trip_as_input: bool = True, body_cond: str = "keep") -> Any:
    # body(i, cond, acc): acc + x * i; emits acc as a scan output; stops when i reaches 3 if body_cond == "stop"
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
             helper.make_node("Identity", ["acc_out"], ["scan"])]
    if body_cond == "keep":
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
    elif body_cond == "stop":
        nodes += [helper.make_node("Constant", [], ["three"], value=helper.make_tensor("three", I64, [], [3])),
                  helper.make_node("Less", ["i", "three"], ["cond_out"])]
    else:  # computed from the data: not known at import
        nodes += [helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=0),
                  helper.make_node("Constant", [], ["ten"], value=helper.make_tensor("ten", F, [], [10.0])),
                  helper.make_node("Less", ["s", "ten"], ["cond_out"])]
    body = helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond", B, []), _vi("acc", F, [2])],
                             [_vi("cond_out", B, []), _vi("acc_out", F, [2]), _vi("scan", F, [2])])
    inputs = [_vi("x", F, [2]), _vi("acc0", F, [2])]
    if trip_as_input:
        inputs.append(_vi("m", I64, []))
        loop = helper.make_node("Loop", ["m", "", "acc0"], ["acc", "steps"], body=body, name="loop")
        return _model([loop], inputs, [_vi("acc", F, [2]), _vi("steps", F, None)])
    trip = helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", I64, [], [MAX_UNROLL + 1]))
    loop = helper.make_node("Loop", ["m", "", "acc0"], ["acc", "steps"], body=body, name="loop")
    return _model([trip, loop], inputs, [_vi("acc", F, [2]), _vi("steps", F, None)])


@pytest.mark.parametrize("trip", [1, 5])
def test_loop_is_unrolled_with_its_scan_outputs(trip: int) -> None:
    x, acc0 = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)
    _check(_loop_model(), {"x": x, "acc0": acc0, "m": np.array(trip, np.int64)})


def test_loop_stops_where_its_body_condition_turns_false() -> None:
    x, acc0 = np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32)
    _check(_loop_model(body_cond="stop"), {"x": x, "acc0": acc0, "m": np.array(10, np.int64)})


def test_loop_limits_are_kiln_errors() -> None:
    with pytest.raises(OnnxImportError, match=rf"Loop node 'loop'.*more than {MAX_UNROLL} iterations"):
        from_onnx(_loop_model(trip_as_input=False))
    with pytest.raises(OnnxImportError, match=r"condition of iteration 0 is computed at run time"):
        from_onnx(_loop_model(body_cond="data"), values={"m": np.array(4, np.int64)})


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_accumulates_over_the_scan_axis(reverse: int) -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "row"], ["s_out"]), helper.make_node("Mul", ["s_out", "row"], ["y"])],
        "body", [_vi("s", F, [3]), _vi("row", F, [3])], [_vi("s_out", F, [3]), _vi("y", F, [3])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[reverse], scan_output_directions=[reverse])
    model = _model([node], [_vi("s0", F, [3]), _vi("xs", F, [4, 3])], [_vi("s", F, [3]), _vi("ys", F, [4, 3])])
    rng = np.random.default_rng(0)
    _check(model, {"s0": rng.normal(size=3).astype(np.float32), "xs": rng.normal(size=(4, 3)).astype(np.float32)})


def test_value_sized_outputs_match_the_reference() -> None:
    x = np.array([[0, 2, 0], [3, 0, 3]], np.float32)
    _check(_model([helper.make_node("NonZero", ["x"], ["y"])], [_vi("x", F, [2, 3])], [_vi("y", I64, None)]),
           {"x": x})
    unique = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], sorted=0)
    _check(_model([unique], [_vi("x", F, [2, 3])], [_vi("y", F, None), _vi("first", I64, None),
                                                  _vi("inverse", I64, None), _vi("counts", I64, None)]), {"x": x})
    compress = helper.make_node("Compress", ["x", "keep"], ["y"], axis=1)
    _check(_model([compress], [_vi("x", F, [2, 3]), _vi("keep", B, [3])], [_vi("y", F, None)]),
           {"x": x, "keep": np.array([True, False, True])})


def test_non_max_suppression_keeps_the_best_boxes_per_class() -> None:
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11], [0, 10.1, 1, 11.1],
                       [0, 100, 1, 101]]], np.float32)
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3], [0.1, 0.8, 0.2, 0.4, 0.9, 0.05]]], np.float32)
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou", "score"], ["picked"])
    model = _model([node], [_vi("boxes", F, [1, 6, 4]), _vi("scores", F, [1, 2, 6]), _vi("limit", I64, [1]),
                            _vi("iou", F, [1]), _vi("score", F, [1])], [_vi("picked", I64, None)])
    _check(model, {"boxes": boxes, "scores": scores, "limit": np.array([2], np.int64),
                   "iou": np.array([0.5], np.float32), "score": np.array([0.0], np.float32)})
