"""nn.softmax_cross_entropy and nn.nll_loss: numerics against numpy and ONNX's reference evaluator, compiled
(llvm) against the numpy reference, errors, and gradients against central finite differences in float64."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_grad_helpers import check_op_grad
from op_helpers import check_build, ref

from kiln import relay
from kiln.errors import KilnError
from kiln.relay.op.loss import LossLabelError

OPS = ["nn.softmax_cross_entropy", "nn.nll_loss"]
ONNX_NAME = {"nn.softmax_cross_entropy": "SoftmaxCrossEntropyLoss", "nn.nll_loss": "NegativeLogLikelihoodLoss"}
RNG = np.random.default_rng(11)
# (scores shape, ignore_index, with class weights): 2-d, and spatial dims; ignore inside and outside [0, C)
SETTINGS = [((5, 4), None, False), ((5, 4), 2, True), ((3, 4, 2, 3), None, True), ((3, 4, 5), -100, False),
            ((4, 3, 2), 1, False)]
REDUCTIONS = ["none", "sum", "mean"]


def inputs(shape: tuple[int, ...], ignore: int | None, weighted: bool, dtype: str = "float64",
           log: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores (log-probabilities for nll_loss when `log`), labels with a few set to `ignore`, weights."""
    c = shape[1]
    x = RNG.standard_normal(shape)
    if log:
        x = x - np.log(np.sum(np.exp(x), axis=1, keepdims=True))
    labels = RNG.integers(0, c, (shape[0], *shape[2:])).astype("int64")
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
        labels.reshape(-1)[1] = (ignore + 1) % c if 0 <= ignore < c else 0  # at least one element counts
    w = RNG.uniform(0.5, 2.0, c) if weighted else np.array(1.0)
    return x.astype(dtype), labels, w.astype(dtype)


def numpy_loss(op: str, x: np.ndarray, labels: np.ndarray, w: np.ndarray, ignore: int | None,
               reduction: str) -> np.ndarray:
    """The loss written directly from ONNX's definition, one element at a time."""
    logp = x - np.log(np.sum(np.exp(x), axis=1, keepdims=True)) if op == "nn.softmax_cross_entropy" else x
    each = np.zeros(labels.shape)
    weights = np.zeros(labels.shape)
    for index in np.ndindex(labels.shape):
        k = labels[index]
        if k == ignore:
            continue
        weights[index] = w[k] if w.ndim else w
        each[index] = -weights[index] * logp[(index[0], k, *index[1:])]
    return {"none": each, "sum": each.sum(), "mean": each.sum() / weights.sum()}[reduction]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_loss_matches_numpy_and_compiles(op: str, reduction: str, setting: Any) -> None:
    shape, ignore, weighted = setting
    x, labels, w = inputs(shape, ignore, weighted, log=op == "nn.nll_loss")
    got = ref(op, x, labels, w, ignore_index=ignore, reduction=reduction)
    np.testing.assert_allclose(got, numpy_loss(op, x, labels, w, ignore, reduction), rtol=1e-12)
    check_build(op, x, labels, w, rtol=1e-10, atol=1e-12, ignore_index=ignore, reduction=reduction)
    x32 = x.astype("float32")
    check_build(op, x32, labels, w.astype("float32"), rtol=1e-5, atol=1e-6, ignore_index=ignore,
                reduction=reduction)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_loss_matches_onnx_reference_evaluator(op: str, reduction: str, setting: Any) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    shape, ignore, weighted = setting
    x, labels, w = inputs(shape, ignore, weighted, dtype="float32", log=op == "nn.nll_loss")
    names = ["x", "labels", *(["w"] if weighted else [])]
    kw: dict[str, Any] = {"reduction": reduction}
    if ignore is not None:
        kw["ignore_index"] = ignore
    node = helper.make_node(ONNX_NAME[op], names, ["loss"], **kw)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
           helper.make_tensor_value_info("labels", TensorProto.INT64, labels.shape)]
    if weighted:
        ins.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape))
    out = helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "g", ins, [out]), opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": x, "labels": labels, **({"w": w} if weighted else {})}
    (want,) = ReferenceEvaluator(model).run(None, feeds)[:1]
    assert onnx is not None
    got = ref(op, x, labels, w, ignore_index=ignore, reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("setting", SETTINGS[:4], ids=str)
def test_loss_gradient_matches_finite_differences(op: str, reduction: str, setting: Any) -> None:
    shape, ignore, weighted = setting
    x, labels, w = inputs(shape, ignore, weighted, log=op == "nn.nll_loss")
    grads = check_op_grad(op, [x, labels, w], ignore_index=ignore, reduction=reduction)
    assert grads[1] is None  # no gradient to the labels


@pytest.mark.parametrize("op", OPS)
def test_loss_gradient_compiled(op: str) -> None:
    x, labels, w = inputs((4, 3, 2), 1, True)
    check_op_grad(op, [x, labels, w], compiled=True, ignore_index=1, reduction="mean")


def test_ignored_elements_get_no_gradient() -> None:
    x, labels, w = inputs((6, 4), 2, True)
    (dx, _, _) = check_op_grad("nn.softmax_cross_entropy", [x, labels, w], ignore_index=2, reduction="sum")
    assert dx is not None
    np.testing.assert_array_equal(dx[labels == 2], 0)


def test_constructor_defaults_weight_to_one_of_the_scores_dtype() -> None:
    x = relay.var("x", shape=(3, 4), dtype="float64")
    y = relay.var("y", shape=(3,), dtype="int64")
    f = relay.infer_type(relay.Function([x, y], relay.nn.softmax_cross_entropy(relay.nn.relu(x), y)))
    assert str(f.body.checked_type) == str(relay.TensorType((), "float64"))
    xs, ls, _ = inputs((3, 4), None, False)
    got = relay.build(f).create_executor()(xs, ls)
    np.testing.assert_allclose(np.asarray(got), numpy_loss("nn.softmax_cross_entropy", np.maximum(xs, 0), ls,
                                                           np.array(1.0), None, "mean"), rtol=1e-10)


@pytest.mark.parametrize(("build", "match"), [
    (lambda: (relay.var("x", shape=(4,)), relay.var("y", shape=(4,), dtype="int64"), None), "rank 1"),
    (lambda: (relay.var("x", shape=(4, 3)), relay.var("y", shape=(4,), dtype="float32"), None), "integer labels"),
    (lambda: (relay.var("x", shape=(4, 3)), relay.var("y", shape=(3,), dtype="int64"), None), r"labels of shape"),
    (lambda: (relay.var("x", shape=(4, 3)), relay.var("y", shape=(4,), dtype="int64"),
              relay.var("w", shape=(4,))), "class weights"),
    (lambda: (relay.var("x", shape=(4, 3), dtype="int32"), relay.var("y", shape=(4,), dtype="int64"),
              relay.var("w", shape=(3,), dtype="int32")), "floating-point"),
])
@pytest.mark.parametrize("op", OPS)
def test_bad_inputs_are_kiln_errors_naming_the_op(op: str, build: Any, match: str) -> None:
    x, y, w = build()
    make = relay.nn.softmax_cross_entropy if op == "nn.softmax_cross_entropy" else relay.nn.nll_loss
    params = [v for v in (x, y, w) if v is not None]
    with pytest.raises(KilnError, match=match) as info:
        relay.infer_type(relay.Function(params, make(x, y, w)))
    assert op in str(info.value)


@pytest.mark.parametrize("op", OPS)
def test_bad_attrs_and_labels_are_refused(op: str) -> None:
    make = relay.nn.softmax_cross_entropy if op == "nn.softmax_cross_entropy" else relay.nn.nll_loss
    x, y = relay.var("x", shape=(2, 3)), relay.var("y", shape=(2,), dtype="int64")
    with pytest.raises(KilnError, match="reduction"):
        make(x, y, reduction="average")
    with pytest.raises(LossLabelError, match=f"{op}: label 3 is out of the 3 classes"):
        ref(op, np.zeros((2, 3)), np.array([0, 3]), np.array(1.0))


def test_an_out_of_range_label_reads_inside_the_scores() -> None:
    x, labels, w = inputs((4, 3), None, True)
    labels[0] = 7  # clamped to class 2 by the kernel; the reference refuses it
    from op_helpers import build_op

    (got,) = build_op("nn.nll_loss", x, labels, w, reduction="none")
    assert np.isfinite(got).all() and got[0] == -w[2] * x[0, 2]


@pytest.mark.parametrize("op", OPS)
def test_loss_differentiates_through_the_gradient_pass(op: str) -> None:
    from kiln.testing import check_grad

    x, w = relay.var("x", shape=(5, 3), dtype="float64"), relay.var("w", shape=(4, 3), dtype="float64")
    y, cw = relay.var("y", shape=(5,), dtype="int64"), relay.var("cw", shape=(4,), dtype="float64")
    scores = relay.nn.dense(x, w)
    if op == "nn.nll_loss":
        scores = relay.nn.log_softmax(scores, axis=1)
    make = relay.nn.softmax_cross_entropy if op == "nn.softmax_cross_entropy" else relay.nn.nll_loss
    func = relay.Function([x, w, y, cw], make(scores, y, cw, ignore_index=0))
    labels = np.array([1, 0, 3, 2, 1], "int64")
    check_grad(func, [RNG.standard_normal((5, 3)), RNG.standard_normal((4, 3)), labels, RNG.uniform(0.5, 2, 4)])
