"""The ONNX converters of the tensor ops (kiln/relay/frontend/_onnx_tensor.py), beyond ONNX's backend cases.

One-node (or few-node) models are imported, compiled for the host CPU and run;
their outputs are compared with onnx's reference evaluator, or with numpy where
the evaluator does not cover an old opset. Shape arithmetic must fold to
constants, and a shape-giving input that is not constant must fail with an
error that names the node and the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.expr import Call, Constant  # noqa: E402
from kiln.relay.frontend import OnnxImportError  # noqa: E402
from kiln.relay.visitor import post_order  # noqa: E402

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)
INT_MAX = 2**63 - 1


def _elem(array: Array) -> int:
    return int(helper.np_dtype_to_tensor_dtype(array.dtype))


def model(
    nodes: Sequence[Any],
    inputs: dict[str, Array],
    outputs: Sequence[str],
    inits: dict[str, Array] | None = None,
    opset: int = 18,
) -> Any:
    """A model whose graph inputs are shaped like `inputs`, with `inits` as initializers."""
    graph = helper.make_graph(
        list(nodes),
        "g",
        [helper.make_tensor_value_info(n, _elem(v), v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(m: Any, inputs: dict[str, Array]) -> list[Array]:
    """`m` imported, compiled for llvm and run on `inputs`."""
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(**inputs)
    return [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]


def check(m: Any, inputs: dict[str, Array]) -> list[Array]:
    """kiln's outputs equal onnx's reference evaluator's, dtype and shape included."""
    got = run(m, inputs)
    want = ReferenceEvaluator(m).run(None, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return got


def ops_of(m: Any, **kw: Any) -> list[str]:
    mod, _ = relay.frontend.from_onnx(m, **kw)
    return [n.op.name for n in post_order(mod["main"].body) if isinstance(n, Call)]


# --- shape arithmetic folds ---------------------------------------------------------------------


def test_reshape_fed_by_shape_gather_concat_folds_to_a_constant_and_compiles() -> None:
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "minus_one"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["y"], name="flat"),
    ]
    inits = {"i0": np.array([0], np.int64), "minus_one": np.array([-1], np.int64)}
    m = model(nodes, {"x": x}, ["y"], inits)
    assert ops_of(m) == ["reshape"]  # Shape, Gather and Concat became the constant (2, -1)
    (y,) = check(m, {"x": x})
    assert y.shape == (2, 12)


def test_shape_of_symbolic_dims_is_shape_of_int64_and_static_dims_a_constant() -> None:
    x = np.zeros((2, 3, 4), np.float32)
    m = model([helper.make_node("Shape", ["x"], ["s"], start=1)], {"x": x}, ["s"])
    mod, _ = relay.frontend.from_onnx(m)
    body = mod["main"].body
    assert isinstance(body, Constant) and body.data.tolist() == [3, 4] and body.data.dtype == np.int64
    assert ops_of(m, shape={"x": ("n", 3, 4)}) == ["shape_of", "strided_slice"]
    mod, _ = relay.frontend.from_onnx(m, shape={"x": ("n", 3, 4)})
    assert str(mod["main"].checked_type.ret_type) == str(relay.TensorType((2,), "int64"))


# --- errors name the node -----------------------------------------------------------------------


def test_a_shape_from_a_graph_input_is_an_error_naming_the_node_and_inputs() -> None:
    x = np.zeros((2, 6), np.float32)
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="to_3d")],
              {"x": x, "shape": np.array([2, 3, 2], np.int64)}, ["y"])
    with pytest.raises(OnnxImportError, match=r"Reshape node 'to_3d': input #1 \(shape\) decides a shape and is "
                                              r"computed from the graph input\(s\) 'shape'"):
        relay.frontend.from_onnx(m)


@pytest.mark.parametrize(
    ("node", "inits", "match"),
    [
        (helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[0, 0, 1]), {},
         r"Transpose node 't': perm entry|Transpose node 't': .*twice"),
        (helper.make_node("Squeeze", ["x", "axes"], ["y"], name="sq"), {"axes": np.array([1], np.int64)},
         r"Squeeze node 'sq': cannot squeeze axis 1 of shape \(2, 3, 4\): its size is 3"),
        (helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="sl"),
         {n: np.array([v], np.int64) for n, v in [("s", 0), ("e", 2), ("a", 0), ("st", 0)]},
         r"Slice node 'sl': the step of axis 0 is 0"),
        (helper.make_node("Expand", ["x", "shape"], ["y"], name="ex"), {"shape": np.array([5, 4], np.int64)},
         r"Expand node 'ex': the input shape \(2, 3, 4\) does not broadcast with shape \[5, 4\]: dim 1 is 3"),
        (helper.make_node("Split", ["x", "split"], ["a", "b"], name="sp", axis=2),
         {"split": np.array([1, 2], np.int64)},
         r"Split node 'sp': split \[1, 2\] adds up to 3, but axis 2 has size 4"),
        (helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=-1), {"i": np.array([4], np.int64)},
         r"Gather node 'g': indices \[4\] are out of range for axis 2 of size 4"),
        (helper.make_node("Pad", ["x", "pads"], ["y"], name="p", mode="symmetric"),
         {"pads": np.zeros(6, np.int64)}, r"Pad node 'p': mode 'symmetric' is not one of"),
    ],
)
def test_bad_attributes_and_inputs_are_errors_naming_the_node(node: Any, inits: dict[str, Array], match: str) -> None:
    m = model([node], {"x": np.zeros((2, 3, 4), np.float32)}, list(node.output), inits)
    with pytest.raises(OnnxImportError, match=match):
        relay.frontend.from_onnx(m)


def test_squeeze_without_axes_of_symbolic_dims_asks_for_axes() -> None:
    m = model([helper.make_node("Squeeze", ["x"], ["y"], name="sq")], {"x": np.zeros((1, 3), np.float32)}, ["y"])
    with pytest.raises(OnnxImportError, match=r"Squeeze node 'sq': Squeeze without axes needs static dims"):
        relay.frontend.from_onnx(m, shape={"x": ("n", 3)})


# --- semantics against the reference evaluator ----------------------------------------------------


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [
        ([4, 6], [0, -INT_MAX], [0, 1], [-1, -2]),  # negative steps to the beginning
        ([-100, 2], [100, INT_MAX], [0, 1], [1, 1]),  # clamped starts, INT_MAX ends
        ([10], [-10], [1], [-3]),  # starts past the end with a negative step
        ([-1], [-100], [-1], [-1]),  # a negative axis, the whole axis reversed
        ([2], [1], [0], [1]),  # empty
    ],
)
def test_slice_clamps_bounds_as_onnx(starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> None:
    x = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    inits = {n: np.array(v, np.int64) for n, v in [("s", starts), ("e", ends), ("a", axes), ("st", steps)]}
    check(model([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": x}, ["y"], inits), {"x": x})


def test_slice_follows_the_spec_where_the_reference_evaluator_does_not() -> None:
    # a negative step clamps start to [0, dim - 1] (ONNX Slice-13, as onnxruntime): a start below -dim
    # reads index 0, where numpy's slicing (and so onnx's reference evaluator) reads nothing
    x = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    inits = {n: np.array(v, np.int64) for n, v in [("s", [-7]), ("e", [-100]), ("a", [0]), ("st", [-1])]}
    (y,) = run(model([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])], {"x": x}, ["y"], inits),
               {"x": x})
    np.testing.assert_array_equal(y, x[:1])


def test_gather_takes_negative_indices_at_run_time() -> None:
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    i = np.array([[-1, 0], [4, -5]], np.int64)
    check(model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"x": x, "i": i}, ["y"]), {"x": x, "i": i})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_with_negative_pads_crops(mode: str) -> None:
    x = np.arange(4 * 5, dtype=np.int32).reshape(4, 5)
    pads = np.array([1, -2, -1, 2], np.int64)  # axis 0: (1, -1), axis 1: (-2, 2)
    m = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], {"x": x}, ["y"], {"pads": pads})
    cropped = x[:-1, 2:]
    want = np.pad(cropped, ((1, 0), (0, 2)), mode=mode)  # type: ignore[call-overload]
    (y,) = run(m, {"x": x})
    np.testing.assert_array_equal(y, want)


def test_pad_with_axes_and_a_run_time_constant_value() -> None:
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    value = np.array(2.5, np.float32)
    m = model([helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"], mode="constant")],
              {"x": x, "value": value}, ["y"], {"pads": np.array([1, 0, 2, 3], np.int64),
                                                "axes": np.array([-1, 0], np.int64)})
    check(m, {"x": x, "value": value})


def test_wrap_pad_wider_than_the_axis() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")], {"x": x}, ["y"],
              {"pads": np.array([3, 4, 2, 7], np.int64)}, opset=19)
    check(m, {"x": x})


def test_expand_broadcasts_both_ways() -> None:
    x = rng.standard_normal((3, 1)).astype(np.float32)
    m = model([helper.make_node("Expand", ["x", "shape"], ["y"])], {"x": x}, ["y"],
              {"shape": np.array([2, 1, 6], np.int64)})
    (y,) = check(m, {"x": x})
    assert y.shape == (2, 3, 6)


@pytest.mark.parametrize(("dim", "count"), [(7, 3), (6, 4), (8, 4)])
def test_split_into_num_outputs_makes_the_last_chunk_smaller(dim: int, count: int) -> None:
    x = np.arange(dim, dtype=np.float32)
    outs = [f"y{k}" for k in range(count)]
    check(model([helper.make_node("Split", ["x"], outs, num_outputs=count)], {"x": x}, outs), {"x": x})


def test_split_with_empty_pieces() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = model([helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=-1)], {"x": x}, ["a", "b", "c"],
              {"split": np.array([0, 4, 0], np.int64)})
    check(m, {"x": x})


def test_unsqueeze_unsorted_negative_axes_and_flatten_at_rank() -> None:
    x = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]), helper.make_node("Flatten", ["u"], ["y"], axis=4)]
    m = model(nodes, {"x": x}, ["y"], {"axes": np.array([-1, 0], np.int64)})
    (y,) = check(m, {"x": x})
    assert y.shape == (12, 1)


def test_flatten_of_a_symbolic_batch_keeps_it() -> None:
    m = model([helper.make_node("Flatten", ["x"], ["y"])], {"x": np.zeros((2, 3, 4), np.float32)}, ["y"])
    mod, _ = relay.frontend.from_onnx(m, shape={"x": ("n", 3, 4)})
    assert "(n, 12)" in str(mod["main"].checked_type.ret_type)


def test_cast_to_bool_and_truncating_float_to_int() -> None:
    x = np.array([0.0, 0.5, -0.5, 2.7, -2.7], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["b"], to=TensorProto.BOOL),
             helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32)]
    b, i = check(model(nodes, {"x": x}, ["b", "i"]), {"x": x})
    assert b.tolist() == [False, True, True, True, True] and i.tolist() == [0, 0, 0, 2, -2]


def test_cast_to_a_dtype_kiln_lacks_names_it() -> None:
    m = model([helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.COMPLEX64)],
              {"x": np.zeros(2, np.float32)}, ["y"])
    with pytest.raises(OnnxImportError, match=r"attribute 'to' of Cast node 'c' has ONNX type COMPLEX64"):
        relay.frontend.from_onnx(m)


# --- constants ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "value", "want"),
    [
        ("value_float", 1.5, np.array(1.5, np.float32)),
        ("value_floats", [1.0, 2.0], np.array([1.0, 2.0], np.float32)),
        ("value_int", 7, np.array(7, np.int64)),
        ("value_ints", [3, -1], np.array([3, -1], np.int64)),
        ("sparse_value",
         helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0, 6.0], np.float32)),
                                   numpy_helper.from_array(np.array([1, 4], np.int64)), [2, 3]),
         np.array([[0, 5, 0], [0, 6, 0]], np.float32)),
    ],
)
def test_constant_attributes(attr: str, value: Any, want: Array) -> None:
    m = model([helper.make_node("Constant", [], ["y"], **{attr: value})], {}, ["y"])
    mod, _ = relay.frontend.from_onnx(m)
    body = mod["main"].body
    assert isinstance(body, Constant) and body.data.dtype == want.dtype
    np.testing.assert_array_equal(body.data, want)


def test_constant_of_shape_and_range_fold_to_constants() -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["c"], value=numpy_helper.from_array(np.array([3], np.int32))),
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
    ]
    inits = {"shape": np.array([2, 3], np.int64), "start": np.array(10, np.int64),
             "limit": np.array(3, np.int64), "delta": np.array(-3, np.int64)}
    m = model(nodes, {}, ["c", "r"], inits)
    assert ops_of(m) == []
    mod, _ = relay.frontend.from_onnx(m)
    c, r = (f.data for f in mod["main"].body.fields)
    assert c.tolist() == [[3, 3, 3], [3, 3, 3]] and c.dtype == np.int32
    assert r.tolist() == [10, 7, 4] and r.dtype == np.int64


# --- opsets before inputs replaced attributes ----------------------------------------------------


def test_old_opsets_read_attributes() -> None:
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    nodes = [
        helper.make_node("Slice", ["x"], ["s"], starts=[1, -3], ends=[INT_MAX, -1], axes=[1, 2]),
        helper.make_node("Unsqueeze", ["s"], ["u"], axes=[0]),
        helper.make_node("Squeeze", ["u"], ["q"], axes=[0]),
        helper.make_node("Split", ["q"], ["a", "b"], axis=1, split=[1, 1]),
        helper.make_node("Pad", ["a"], ["p"], pads=[0, 1, 0, 0, 0, 0], value=9.0),
    ]
    m = model(nodes, {"x": x}, ["p", "b"], opset=9)
    p, b = run(m, {"x": x})
    s = x[:, 1:, -3:-1]
    np.testing.assert_array_equal(b, s[:, 1:2])
    np.testing.assert_array_equal(p, np.pad(s[:, 0:1], ((0, 0), (1, 0), (0, 0)), constant_values=9.0))


def test_integer_shape_arithmetic_of_a_channel_split_folds_to_constants() -> None:
    # ShuffleNetV2's TorchScript export of x[:, : channels // 2]: Shape → Gather → Add → Div → Mul → Slice
    x = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
        helper.make_node("Add", ["c", "zero"], ["c0"]),
        helper.make_node("Div", ["c0", "two"], ["half"]),
        helper.make_node("Mul", ["half", "one"], ["end"]),
        helper.make_node("Slice", ["x", "zeros", "end", "axes"], ["y"]),
    ]
    inits = {"one": np.array([1], np.int64), "zero": np.array([0], np.int64), "two": np.array([2], np.int64),
             "zeros": np.array([0], np.int64), "axes": np.array([1], np.int64)}
    mod, params = relay.frontend.from_onnx(model(nodes, {"x": x}, ["y"], inits))
    assert "divide" not in str(mod) and "floor_divide" not in str(mod)  # folded, not computed at run time
    np.testing.assert_array_equal(relay.build(mod, params=params).create_executor()(x=x), x[:, :3])
