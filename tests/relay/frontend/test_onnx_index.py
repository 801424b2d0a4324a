"""The ONNX converters of the indexing and layout ops (kiln/relay/frontend/_onnx_index.py).

One-node models, their data and indices fed at run time, are imported, compiled
for the host CPU and run; their outputs are compared with onnx's reference
evaluator (dtype and shape included). Inputs that decide a shape (TopK's K,
OneHot's depth, Trilu's k, ...) are initializers. Bad attributes and shapes fail
with errors that name the node.
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
from kiln.relay.frontend import OnnxImportError  # noqa: E402

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(3)


def model(op: str, inputs: dict[str, Array], outputs: Sequence[str] = ("y",), inits: dict[str, Array] | None = None,
          opset: int = 18, **attrs: Any) -> Any:
    """A one-node model: `op` on `inputs` (graph inputs) then `inits` (initializers), in that order."""
    inits = inits or {}
    names = [*inputs, *inits]
    node = helper.make_node(op, names, list(outputs), name="n0", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(m: Any, inputs: dict[str, Array]) -> list[Array]:
    """kiln's outputs (compiled for llvm, every graph input fed at run time) equal the reference evaluator's."""
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(**inputs)
    got = [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]
    want = ReferenceEvaluator(m).run(None, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return got


def fails(m: Any, match: str) -> None:
    with pytest.raises(OnnxImportError, match=match):
        relay.frontend.from_onnx(m)


def data(*shape: int, dtype: str = "float32") -> Array:
    return (rng.permutation(int(np.prod(shape))).reshape(shape) - 3).astype(dtype)


# --- GatherElements, GatherND ------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_gather_elements_with_negative_indices(axis: int) -> None:
    x = data(3, 4)
    idx = rng.integers(-x.shape[axis], x.shape[axis], (3, 5) if axis == 1 else (2, 4)).astype(np.int64)
    check(model("GatherElements", {"x": x, "i": idx}, axis=axis), {"x": x, "i": idx})


def test_gather_nd_with_batch_dims() -> None:
    x, idx = data(2, 3, 4), np.array([[[1, -1], [0, 2]], [[2, 0], [-3, 3]]], np.int64)
    check(model("GatherND", {"x": x, "i": idx}, batch_dims=1), {"x": x, "i": idx})
    idx0 = np.array([[1], [0]], np.int64)
    check(model("GatherND", {"x": x, "i": idx0}), {"x": x, "i": idx0})


def test_gather_elements_axis_out_of_range_names_the_node() -> None:
    fails(model("GatherElements", {"x": data(2, 2), "i": np.zeros((2, 2), np.int64)}, axis=2),
          "n0.*'axis' is 2, out of range")


# --- ScatterElements, Scatter, ScatterND ----------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reductions_with_duplicates(reduction: str) -> None:
    x, idx, upd = data(3, 4), np.array([[0, -1, 1, 0], [2, 2, 2, 1]], np.int64), data(2, 4)
    check(model("ScatterElements", {"x": x, "i": idx, "u": upd}, axis=0, reduction=reduction),
          {"x": x, "i": idx, "u": upd})


def test_deprecated_scatter_is_scatter_elements() -> None:
    x, idx, upd = data(3, 5), np.array([[4, 0], [-1, 2], [1, 3]], np.int64), data(3, 2)
    feeds = {"x": x, "i": idx, "u": upd}
    mod, params = relay.frontend.from_onnx(model("Scatter", feeds, opset=10, axis=1))
    got = relay.build(mod, target="llvm", params=params).create_executor()(**feeds)
    want = ReferenceEvaluator(model("ScatterElements", feeds, axis=1)).run(None, feeds)[0]
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_nd(reduction: str) -> None:
    x, idx, upd = data(4, 3, 2), np.array([[0], [-2]], np.int64), data(2, 3, 2)
    check(model("ScatterND", {"x": x, "i": idx, "u": upd}, reduction=reduction), {"x": x, "i": idx, "u": upd})


def test_scatter_with_an_unknown_reduction_fails() -> None:
    m = model("ScatterElements", {"x": data(2), "i": np.zeros(1, np.int64), "u": data(1)}, reduction="sum")
    fails(m, "n0.*'reduction' is 'sum'")


# --- Trilu, EyeLike, OneHot, Size ---------------------------------------------------------------------------


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2, 7, -9])
def test_trilu(upper: int, k: int | None) -> None:
    x = data(2, 3, 5)
    inits = {} if k is None else {"k": np.array(k, np.int64)}
    check(model("Trilu", {"x": x}, inits=inits, upper=upper), {"x": x})


def test_trilu_rank_one_fails() -> None:
    fails(model("Trilu", {"x": data(4)}), "n0.*rank 2 or more")


@pytest.mark.parametrize(("shape", "k", "dtype"), [((3, 4), 0, None), ((4, 2), -1, TensorProto.INT32),
                                                   ((3, 3), 2, TensorProto.DOUBLE)])
def test_eye_like(shape: tuple[int, int], k: int, dtype: int | None) -> None:
    x = data(*shape)
    kw = {} if dtype is None else {"dtype": dtype}
    check(model("EyeLike", {"x": x}, k=k, **kw), {"x": x})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot_with_negative_and_out_of_range_indices(axis: int) -> None:
    idx = np.array([[0, -1, 3], [5, -4, 2]], np.int64)
    values = np.array([-2.0, 7.0], np.float32)
    check(_one_hot(idx, values, np.array(4.0, np.float32), axis), {"i": idx, "v": values})


def _one_hot(idx: Array, values: Array, depth: Array, axis: int) -> Any:
    node = helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="n0", axis=axis)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, values.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(depth, "d")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def test_one_hot_values_must_be_two() -> None:
    fails(_one_hot(np.zeros(2, np.int64), np.zeros(3, np.float32), np.array(3, np.int64), -1),
          "n0.*values.*shape \\(2,\\)")


def test_size() -> None:
    x = data(2, 3, 5)
    check(model("Size", {"x": x}), {"x": x})


# --- DepthToSpace, SpaceToDepth, CenterCropPad ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode: str) -> None:
    x = data(2, 8, 2, 3)
    check(model("DepthToSpace", {"x": x}, blocksize=2, mode=mode), {"x": x})
    y = data(1, 3, 4, 6)
    check(model("SpaceToDepth", {"x": y}, blocksize=2, opset=13), {"x": y})


def test_depth_to_space_channels_must_divide() -> None:
    fails(model("DepthToSpace", {"x": data(1, 6, 2, 2)}, blocksize=2), "n0.*6 channels")


@pytest.mark.parametrize(("shape", "axes"), [([3, 7], None), ([5, 2], [1, 2]), ([1, 9], [-1, 0])])
def test_center_crop_pad(shape: list[int], axes: list[int] | None) -> None:
    x = data(4, 4, 3) if axes == [1, 2] else data(4, 6)
    if axes == [-1, 0]:
        x = data(4, 6)
    kw = {} if axes is None else {"axes": axes}
    check(model("CenterCropPad", {"x": x}, inits={"s": np.array(shape, np.int64)}, **kw), {"x": x})


# --- TopK, ReverseSequence ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "axis", "largest"), [(2, -1, 1), (3, 0, 0), (5, 1, 1)])
def test_topk_ties_go_to_the_lower_index(k: int, axis: int, largest: int) -> None:
    x = rng.integers(0, 3, (4, 5)).astype(np.float32)
    m = model("TopK", {"x": x}, ("v", "i"), inits={"k": np.array([k], np.int64)}, axis=axis, largest=largest)
    _, index = check(m, {"x": x})
    assert index.dtype == np.int64


def test_topk_v1_reads_k_from_its_attribute() -> None:
    x = data(3, 6)
    check(model("TopK", {"x": x}, ("v", "i"), opset=9, k=4), {"x": x})


def test_topk_k_larger_than_the_axis_fails() -> None:
    fails(model("TopK", {"x": data(3, 4)}, ("v", "i"), inits={"k": np.array([5], np.int64)}), "n0.*k is 5")


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    x = data(4, 4, 2)
    lens = np.array([4, 1, 0, 3], np.int64)
    m = model("ReverseSequence", {"x": x, "l": lens}, batch_axis=batch_axis, time_axis=time_axis)
    check(m, {"x": x, "l": lens})


def test_reverse_sequence_bad_axes_fail() -> None:
    m = model("ReverseSequence", {"x": data(2, 2), "l": np.ones(2, np.int64)}, batch_axis=1, time_axis=1)
    fails(m, "n0.*batch_axis 1 and time_axis 1")


# --- MaxUnpool, Col2Im ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "pool", "output_shape"), [
    ((1, 2, 4, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
    ((1, 2, 4, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, [1, 2, 6, 7]),
    ((2, 1, 5, 5), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, None),  # overlapping windows
])
def test_max_unpool_of_max_pool(shape: tuple[int, ...], pool: dict[str, Any], output_shape: list[int] | None) -> None:
    x = data(*shape)
    pooled, index = ReferenceEvaluator(model("MaxPool", {"x": x}, ("p", "i"), **pool)).run(None, {"x": x})
    inits = {} if output_shape is None else {"s": np.array(output_shape, np.int64)}
    m = model("MaxUnpool", {"p": pooled, "i": index}, inits=inits, **pool)
    check(m, {"p": pooled, "i": index})


@pytest.mark.parametrize(("image", "block", "attrs"), [
    ([5, 5], [2, 3], {}), ([6, 5], [2, 2], {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
])
def test_col2im(image: list[int], block: list[int], attrs: dict[str, Any]) -> None:
    strides, pads, dil = attrs.get("strides", [1, 1]), attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    counts = [(image[i] + pads[i] + pads[i + 2] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(2)]
    x = data(2, 3 * block[0] * block[1], counts[0] * counts[1])
    inits = {"s": np.array(image, np.int64), "b": np.array(block, np.int64)}
    check(model("Col2Im", {"x": x}, inits=inits, **attrs), {"x": x})


def test_col2im_with_the_wrong_block_count_fails() -> None:
    inits = {"s": np.array([4, 4], np.int64), "b": np.array([2, 2], np.int64)}
    fails(model("Col2Im", {"x": data(1, 4, 10)}, inits=inits), "n0.*does not hold the \\[3, 3\\] blocks")


# --- TensorScatter --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "axis", "write"), [("linear", -2, [0, 2]), ("circular", 1, [3, 4]),
                                                     ("linear", 2, None)])
def test_tensor_scatter(mode: str, axis: int, write: list[int] | None) -> None:
    cache = data(2, 5, 3)
    upd = data(2, 2, 3) if axis != 2 else data(2, 5, 2)
    feeds = {"c": cache, "u": upd} | ({} if write is None else {"w": np.array(write, np.int64)})
    check(model("TensorScatter", feeds, opset=24, mode=mode, axis=axis), feeds)


def test_max_unpool_1d_puts_each_maximum_back_in_its_plane() -> None:
    # onnx's reference MaxPool leaves the plane offset out of 1-D indices, so these are built here
    x = data(2, 2, 6)
    windows = x.reshape(2, 2, 3, 2)
    local = windows.argmax(-1) + 2 * np.arange(3)
    index = (local + 6 * np.arange(4).reshape(2, 2, 1)).astype(np.int64)
    pooled = windows.max(-1)
    want = np.zeros_like(x).reshape(-1)
    want[index.reshape(-1)] = pooled.reshape(-1)
    m = model("MaxUnpool", {"p": pooled, "i": index}, kernel_shape=[2], strides=[2])
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(p=pooled, i=index)
    np.testing.assert_array_equal(np.asarray(got), want.reshape(x.shape))
