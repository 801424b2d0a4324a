"""The ONNX converters of kiln/relay/frontend/_onnx_reduce.py, beyond ONNX's backend node cases.

Each model is built with onnx.helper, imported, compiled for the host CPU and run with every graph
input fed at run time; outputs are compared with onnxruntime, ONNX's reference evaluator or a numpy
formula written out here. The cases cover what the backend cases leave out: N-D losses with weights
and ignore_index in and out of the class range, the weighted mean that ignores the ignored elements,
noop_with_empty_axes and empty reductions, log-sum-exp of huge and infinite rows, long scans, scale
broadcasting, both GroupNormalization opsets, zero norms, and the errors for malformed nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.frontend import OnnxImportError  # noqa: E402

# onnxruntime before 1.25 (1.23 is the newest for Python 3.10) lacks kernels of newer opsets and gets cases wrong
OLD_ORT = tuple(int(p) for p in ort.__version__.split(".")[:2]) < (1, 25)

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)


def rand(*shape: int, dtype: Any = np.float32) -> Array:
    return rng.standard_normal(shape).astype(dtype)


def model(node: Any, inputs: dict[str, Array], n_out: int = 1, inits: dict[str, Array] | None = None,
          opset: int = 18, out_dtype: Any = None) -> Any:
    """A one-node model: graph inputs shaped and typed like `inputs`, `inits` as initializers, outputs y0, y1,
    ... of `out_dtype` (default: the first input's dtype)."""
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(out_dtype or next(iter(inputs.values())).dtype))

    def info(name: str, a: Array) -> Any:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)

    graph = helper.make_graph(
        [node], "g", [info(n, v) for n, v in inputs.items()],
        [helper.make_tensor_value_info(f"y{i}", out_type, None) for i in range(n_out)],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def node(op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> Any:
    return helper.make_node(op_type, list(inputs), [f"y{i}" for i in range(n_out)], name="n", **attrs)


def run(m: Any, inputs: dict[str, Array]) -> list[Array]:
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(**inputs)
    return [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]


def run_ort(m: Any, inputs: dict[str, Array]) -> list[Array]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, inputs)]


def run_reference(m: Any, inputs: dict[str, Array]) -> list[Array]:
    return [np.asarray(o) for o in ReferenceEvaluator(m).run(None, inputs)]


def assert_close(got: list[Array], want: list[Array], rtol: float = 1e-5, atol: float = 1e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def check_against_ort(m: Any, inputs: dict[str, Array], rtol: float = 1e-5, atol: float = 1e-5) -> list[Array]:
    got = run(m, inputs)
    assert_close(got, run_ort(m, inputs), rtol, atol)
    return got


# --- losses ---------------------------------------------------------------------------------------

LOSS_GRID = [
    # input shape, reduction, weighted, ignore_index
    ((5, 4), "mean", False, None),
    ((5, 4), "none", True, 2),
    ((3, 4, 2, 3), "mean", True, 1),
    ((3, 4, 2, 3), "mean", False, -1),
    ((2, 3, 5), "sum", True, 7),  # out of the class range: ignored elements index no class
    ((2, 3, 5), "none", False, 0),
]


def _targets(shape: tuple[int, ...], ignore: int | None) -> Array:
    c = shape[1]
    t = rng.integers(0, c, (shape[0], *shape[2:])).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore  # every third element ignored
    return t


@pytest.mark.parametrize(("shape", "reduction", "weighted", "ignore"), LOSS_GRID)
def test_nll_loss_matches_onnxruntime(shape: tuple[int, ...], reduction: str, weighted: bool,
                                      ignore: int | None) -> None:
    inputs = {"x": rand(*shape), "t": _targets(shape, ignore)}
    if weighted:
        inputs["w"] = rng.random(shape[1]).astype(np.float32) + 0.5
    kw: dict[str, Any] = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    check_against_ort(model(node("NegativeLogLikelihoodLoss", list(inputs), **kw), inputs, opset=22), inputs)


@pytest.mark.parametrize(("shape", "reduction", "weighted", "ignore"), LOSS_GRID)
def test_softmax_cross_entropy_loss_and_log_prob_match_onnxruntime(
    shape: tuple[int, ...], reduction: str, weighted: bool, ignore: int | None
) -> None:
    inputs = {"x": rand(*shape) * 3, "t": _targets(shape, ignore)}
    if weighted:
        inputs["w"] = rng.random(shape[1]).astype(np.float32) + 0.5
    kw: dict[str, Any] = {"reduction": reduction} | ({"ignore_index": ignore} if ignore is not None else {})
    m = model(node("SoftmaxCrossEntropyLoss", list(inputs), n_out=2, **kw), inputs, n_out=2, opset=13)
    check_against_ort(m, inputs)


def test_mean_loss_divides_by_the_weights_of_the_elements_not_ignored() -> None:
    x = rand(4, 3, 2)
    t = np.array([[0, 1], [2, 2], [1, 0], [2, 1]], np.int64)
    w = np.array([0.5, 2.0, 3.0], np.float32)
    picked = -np.take_along_axis(x, t[:, None, :], axis=1)[:, 0, :]
    keep = t != 2
    # without weights: the mean over the 5 elements not ignored, not over all 8
    m = model(node("NegativeLogLikelihoodLoss", ["x", "t"], ignore_index=2), {"x": x, "t": t}, opset=22)
    (got,) = run(m, {"x": x, "t": t})
    np.testing.assert_allclose(got, picked[keep].sum() / keep.sum(), rtol=1e-6)
    # with weights: the weighted sum over the sum of the weights of those 5 elements
    m = model(node("NegativeLogLikelihoodLoss", ["x", "t", "w"], ignore_index=2), {"x": x, "t": t, "w": w}, opset=22)
    (got,) = run(m, {"x": x, "t": t, "w": w})
    np.testing.assert_allclose(got, (picked * w[t])[keep].sum() / w[t][keep].sum(), rtol=1e-6)


def test_softmax_cross_entropy_of_float64_scores_with_int32_labels() -> None:
    inputs = {"x": rand(6, 5, dtype=np.float64), "t": rng.integers(0, 5, 6).astype(np.int32)}
    m = model(node("SoftmaxCrossEntropyLoss", ["x", "t"], reduction="sum"), inputs, opset=13)
    check_against_ort(m, inputs, rtol=1e-10)


@pytest.mark.parametrize(
    ("shapes", "attrs", "message"),
    [
        ({"x": (3, 4, 2), "t": (3, 4)}, {}, r"input #1 \(target\) has shape \(3, 4\); .* it must be \(3, 2\)"),
        ({"x": (3, 4), "t": (3,), "w": (3,)}, {}, r"input #2 \(weight\) must have shape \(4,\)"),
        ({"x": (3, 4), "t": (3,)}, {"reduction": "max"}, "attribute 'reduction' must be 'none', 'sum' or 'mean'"),
    ],
)
def test_malformed_loss_nodes_are_errors_naming_the_node(shapes: dict[str, tuple[int, ...]], attrs: dict[str, Any],
                                                          message: str) -> None:
    inputs = {k: (rand(*s) if k != "t" else np.zeros(s, np.int64)) for k, s in shapes.items()}
    m = model(node("NegativeLogLikelihoodLoss", list(inputs), **attrs), inputs, opset=22)
    with pytest.raises(OnnxImportError, match="NegativeLogLikelihoodLoss node 'n'.*" + message):
        relay.frontend.from_onnx(m)


# --- composite reductions -------------------------------------------------------------------------

REDUCE_OPS = ["ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _reduce_data(op: str, shape: tuple[int, ...]) -> Array:
    x = rand(*shape)
    return np.abs(x) + 0.1 if op == "ReduceLogSum" else x


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([-1, 0], 0), (None, 0)])
def test_reductions_with_axes_as_input_match_onnxruntime(op: str, axes: list[int] | None, keepdims: int) -> None:
    x = _reduce_data(op, (3, 4, 5))
    inits = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    m = model(node(op, ["x", *inits], keepdims=keepdims), {"x": x}, inits=inits, opset=18)
    check_against_ort(m, {"x": x})


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reductions_with_axes_as_attribute_match_onnxruntime(op: str) -> None:
    x = _reduce_data(op, (2, 3, 4))
    m = model(node(op, ["x"], axes=[0, 2], keepdims=1), {"x": x}, opset=13)
    check_against_ort(m, {"x": x})


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_noop_with_empty_axes_applies_the_elementwise_part(op: str) -> None:
    # ONNX's reference reduces over no axis: ReduceL1 gives |x|, ReduceSumSquare x^2, ReduceLogSum log x
    x = _reduce_data(op, (2, 3))
    m = model(node(op, ["x"], noop_with_empty_axes=1), {"x": x}, opset=18)
    assert_close(run(m, {"x": x}), run_reference(m, {"x": x}), rtol=1e-6)


@pytest.mark.parametrize(("op", "identity"), [("ReduceL1", 0.0), ("ReduceL2", 0.0), ("ReduceSumSquare", 0.0),
                                              ("ReduceLogSum", -np.inf), ("ReduceLogSumExp", -np.inf)])
def test_a_reduction_of_no_elements_is_its_identity(op: str, identity: float) -> None:
    x = np.zeros((2, 0, 4), np.float32)
    inits = {"axes": np.array([1], np.int64)}
    m = model(node(op, ["x", "axes"], keepdims=1), {"x": x}, inits=inits, opset=18)
    (got,) = run(m, {"x": x})
    np.testing.assert_array_equal(got, np.full((2, 1, 4), identity, np.float32))


def test_log_sum_exp_neither_overflows_nor_turns_infinite_rows_into_nan() -> None:
    x = np.array([[1000.0, 1000.0, 999.0], [-np.inf, -np.inf, -np.inf], [np.inf, 1.0, 2.0]], np.float32)
    m = model(node("ReduceLogSumExp", ["x", "axes"], keepdims=0), {"x": x}, inits={"axes": np.array([1])}, opset=18)
    (got,) = run(m, {"x": x})
    np.testing.assert_allclose(got, [1000 + np.log(2 + np.exp(-1)), -np.inf, np.inf], rtol=1e-6)


def test_reduction_axes_out_of_range_or_repeated_are_errors() -> None:
    x = rand(2, 3)
    for axes, message in (([2], "attribute 'axes' holds an axis that is 2, out of range for an input of rank 2"),
                          ([1, -1], r"axes \[1, -1\] names an axis twice")):
        m = model(node("ReduceL1", ["x"], axes=axes), {"x": x}, opset=13)
        with pytest.raises(OnnxImportError, match="ReduceL1 node 'n': " + message):
            relay.frontend.from_onnx(m)
    m = model(node("ReduceL2", ["x", "axes"]), {"x": x}, inits={"axes": np.array([-3])}, opset=18)
    with pytest.raises(OnnxImportError, match=r"ReduceL2 node 'n': input #1 \(axes\) holds an axis that is -3, out"):
        relay.frontend.from_onnx(m)


# --- scans ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "opset"), [("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize(("shape", "axis"), [((7,), 0), ((3, 6), -1), ((4, 3, 2), 1)])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_scans_match_the_reference_evaluator(op: str, opset: int, shape: tuple[int, ...], axis: int,
                                             exclusive: int, reverse: int) -> None:
    x = rng.integers(-3, 4, shape).astype(np.float32 if op == "CumSum" else np.int32)
    inits = {"axis": np.array(axis, np.int64)}
    m = model(node(op, ["x", "axis"], exclusive=exclusive, reverse=reverse), {"x": x}, inits=inits, opset=opset)
    got, want = run(m, {"x": x}), run_reference(m, {"x": x})
    assert got[0].dtype == want[0].dtype
    np.testing.assert_array_equal(got[0], want[0])


def test_a_long_cumsum_keeps_float32_accuracy() -> None:
    x = rng.random((2, 3000)).astype(np.float32)
    m = model(node("CumSum", ["x", "axis"]), {"x": x}, inits={"axis": np.array([1], np.int32)}, opset=14)
    (got,) = run(m, {"x": x})
    np.testing.assert_allclose(got, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-5)


def test_a_scan_axis_out_of_range_or_not_one_integer_is_an_error() -> None:
    x = rand(2, 3)
    for axis, message in ((np.array(2), r"input #1 \(axis\) is 2, out of range for an input of rank 2"),
                          (np.array([0, 1]), r"input #1 \(axis\) must be one integer")):
        m = model(node("CumSum", ["x", "axis"]), {"x": x}, inits={"axis": axis.astype(np.int64)}, opset=14)
        with pytest.raises(OnnxImportError, match="CumSum node 'n': " + message):
            relay.frontend.from_onnx(m)


# --- normalizations -------------------------------------------------------------------------------


_OLD_ORT_RMS = pytest.mark.skipif(OLD_ORT, reason="onnxruntime < 1.25 refuses a scale that broadcasts")


@pytest.mark.parametrize(("shape", "axis", "scale_shape"), [((3, 8), -1, (8,)), ((2, 3, 4), 1, (3, 4)),
                                                           pytest.param((2, 3, 4), 0, (1, 4), marks=_OLD_ORT_RMS),
                                                           pytest.param((2, 5), 0, (), marks=_OLD_ORT_RMS)])
def test_rms_normalization_matches_onnxruntime(shape: tuple[int, ...], axis: int,
                                               scale_shape: tuple[int, ...]) -> None:
    inputs = {"x": rand(*shape), "s": rand(*scale_shape)}
    check_against_ort(model(node("RMSNormalization", ["x", "s"], axis=axis, epsilon=1e-3), inputs, opset=23), inputs)


def test_rms_normalization_of_float16_computes_in_float32() -> None:
    x = (rand(4, 64) * 200).astype(np.float16)  # x * x overflows float16
    inputs = {"x": x, "s": np.ones(64, np.float16)}
    (got,) = run(model(node("RMSNormalization", ["x", "s"]), inputs, opset=23), inputs)
    x32 = x.astype(np.float32)
    want = x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + 1e-5)
    assert got.dtype == np.float16 and np.all(np.isfinite(got))
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_rms_normalization_refuses_a_scale_that_would_broadcast_the_output() -> None:
    inputs = {"x": rand(3, 4), "s": rand(2, 3, 4)}
    with pytest.raises(OnnxImportError, match=r"RMSNormalization node 'n': the scale has shape \(2, 3, 4\)"):
        relay.frontend.from_onnx(model(node("RMSNormalization", ["x", "s"]), inputs, opset=23))


@pytest.mark.skipif(OLD_ORT, reason="onnxruntime < 1.25 has no LpNormalization-22")
@pytest.mark.parametrize(("axis", "p"), [(-1, 2), (0, 1), (1, 2)])
def test_lp_normalization_matches_onnxruntime_and_zero_norms_give_zero(axis: int, p: int) -> None:
    x = rand(3, 4)
    x[1, :] = 0.0
    x[:, 2] = 0.0
    got = check_against_ort(model(node("LpNormalization", ["x"], axis=axis, p=p), {"x": x}, opset=22), {"x": x})
    assert np.all(np.isfinite(got[0]))


def test_lp_normalization_refuses_other_norms() -> None:
    with pytest.raises(OnnxImportError, match="LpNormalization node 'n': attribute 'p' must be 1 or 2, found 3"):
        relay.frontend.from_onnx(model(node("LpNormalization", ["x"], p=3), {"x": rand(2, 2)}, opset=22))


def _group_norm(x: Array, groups: int, scale: Array, bias: Array, eps: float, per_group: bool) -> Array:
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1).astype(np.float64)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    if per_group:
        return (y * scale[:, None] + bias[:, None]).reshape(x.shape).astype(x.dtype)
    along = (c,) + (1,) * (x.ndim - 2)
    return (y.reshape(x.shape) * scale.reshape(along) + bias.reshape(along)).astype(x.dtype)


@pytest.mark.parametrize(("opset", "shape", "groups"), [(18, (2, 6, 3, 2), 3), (21, (2, 6, 3, 2), 2),
                                                        (21, (3, 4, 5), 4), (21, (2, 4), 1)])
def test_group_normalization_scales_per_group_in_opset_18_and_per_channel_from_21(
    opset: int, shape: tuple[int, ...], groups: int
) -> None:
    per_group = opset < 21
    k = groups if per_group else shape[1]
    inputs = {"x": rand(*shape), "s": rand(k), "b": rand(k)}
    m = model(node("GroupNormalization", ["x", "s", "b"], num_groups=groups, epsilon=1e-3), inputs, opset=opset)
    (got,) = run(m, inputs)
    want = _group_norm(inputs["x"], groups, inputs["s"], inputs["b"], 1e-3, per_group)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("groups", "k", "message"), [(4, 4, "attribute 'num_groups' is 4; it must divide the 6"),
                                                      (3, 3, r"input #1 \(scale\) must have shape \(6,\)")])
def test_malformed_group_normalization_is_an_error(groups: int, k: int, message: str) -> None:
    inputs = {"x": rand(2, 6, 3), "s": rand(k), "b": rand(k)}
    m = model(node("GroupNormalization", ["x", "s", "b"], num_groups=groups), inputs, opset=21)
    with pytest.raises(OnnxImportError, match="GroupNormalization node 'n': " + message):
        relay.frontend.from_onnx(m)


@pytest.mark.parametrize("axes", [None, [1], [0, 1, 2, 3]])
def test_mean_variance_normalization_matches_onnxruntime(axes: list[int] | None) -> None:
    x = rand(2, 3, 4, 5)
    kw = {"axes": axes} if axes is not None else {}
    check_against_ort(model(node("MeanVarianceNormalization", ["x"], **kw), {"x": x}, opset=13), {"x": x},
                      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("shape", "size"), [((2, 7, 3, 3), 3), ((1, 5, 4, 2), 4), ((2, 3, 2, 2), 5),
                                             ((1, 6, 3, 3), 1)])
def test_lrn_matches_the_formula_of_the_onnx_spec(shape: tuple[int, ...], size: int) -> None:
    # (onnxruntime refuses an even size, where the window reaches one channel further after than before;
    # ONNX's reference evaluator sums the windows of the first N channels only)
    x = rand(*shape)
    m = model(node("LRN", ["x"], size=size, alpha=0.01, beta=0.6, bias=1.5), {"x": x}, opset=13)
    c = shape[1]
    square_sum = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c, ch + int(np.ceil((size - 1) / 2)) + 1)
        square_sum[:, ch] = np.sum(x[:, lo:hi] ** 2, axis=1)
    assert_close(run(m, {"x": x}), [x / (1.5 + 0.01 / size * square_sum) ** 0.6])


@pytest.mark.parametrize(("opset", "shape", "axis"), [(11, (2, 3, 4), 1), (11, (3, 4), 0), (13, (2, 3, 4), 1),
                                                      (13, (2, 3, 4), -1)])
def test_hardmax_matches_onnxruntime(opset: int, shape: tuple[int, ...], axis: int) -> None:
    x = rng.integers(0, 3, shape).astype(np.float32)  # ties: the first largest wins
    check_against_ort(model(node("Hardmax", ["x"], axis=axis), {"x": x}, opset=opset), {"x": x})


def test_rms_normalization_output_takes_the_scale_type() -> None:
    inputs = {"x": rand(3, 8, dtype=np.float64), "s": rand(8, dtype=np.float32)}
    # (onnxruntime's expansion of the function fails on mixed types: the formula, written out)
    m = model(node("RMSNormalization", ["x", "s"]), inputs, opset=23, out_dtype=np.float32)
    (got,) = run(m, inputs)
    x = inputs["x"]
    normalized = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, normalized.astype(np.float32) * inputs["s"], rtol=1e-6)


def test_rms_normalization_of_float64_is_not_narrowed_to_float32() -> None:
    x = 1 + rand(2, 16, dtype=np.float64) * 1e-9  # differences float32 cannot hold
    inputs = {"x": x, "s": np.ones(16, np.float64)}
    (got,) = run(model(node("RMSNormalization", ["x", "s"], epsilon=0.0), inputs, opset=23), inputs)
    np.testing.assert_allclose(got, x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True)), rtol=1e-14)


@pytest.mark.parametrize(("op", "formula"), [
    ("ReduceL1", lambda x: np.sum(np.abs(x), 1)),
    ("ReduceSumSquare", lambda x: np.sum(x * x, 1)),
    ("ReduceL2", lambda x: np.sqrt(np.sum(x * x, 1))),
    ("ReduceLogSum", lambda x: np.log(np.sum(x, 1))),
    ("ReduceLogSumExp", lambda x: np.log(np.sum(np.exp(x), 1))),
])
def test_integer_reductions_are_computed_in_float64_and_truncated(op: str, formula: Any) -> None:
    # opsets 18 to 27 allow integers; a square root or a log of them is truncated back to their type
    x = rng.integers(-8, 9, (3, 5)).astype(np.int64)
    x = np.abs(x) + 1 if op == "ReduceLogSum" else x
    m = model(node(op, ["x", "axes"], keepdims=0), {"x": x}, inits={"axes": np.array([1])}, opset=18)
    (got,) = run(m, {"x": x})
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, formula(x.astype(np.float64)).astype(np.int64))
