"""The ONNX converters of GridSample, AffineGrid, RoiAlign, DeformConv (_onnx_image.py), LpPool, MaxPool's
Indices and CausalConvWithState (_onnx_nn.py).

Models are built with onnx.helper, imported, compiled for the host CPU and run;
their outputs must match onnxruntime's (ONNX's reference where onnxruntime
lacks the op or differs from the reference). The cases cover what ONNX's backend
cases leave out: GridSample at opset 16 (bilinear / bicubic), odd shapes and
float64, LpPool with p other than 2 and 3 and with ceil_mode off, AffineGrid of
a non-square size, MaxPool's Indices of a 1-D pool, and the errors for what
kiln cannot convert.
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

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(5)


def model(op_type: str, inputs: dict[str, Array], outputs: Sequence[tuple[str, int]], opset: int,
          inits: dict[str, Array] | None = None, **attrs: Any) -> Any:
    """A one-node model named "n": `inputs` are graph inputs, then `inits` as initializers, in order."""
    names = [*inputs, *(inits or {})]
    node = helper.make_node(op_type, names, [o for o, _ in outputs], name="n", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run(m: Any, inputs: dict[str, Array]) -> list[Array]:
    """kiln's compiled outputs of `m`."""
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(**inputs)
    return [np.asarray(g) for g in (got if isinstance(got, tuple) else [got])]


def check(m: Any, inputs: dict[str, Array], rtol: float = 1e-5, atol: float = 1e-5, reference: bool = False) -> None:
    """kiln's compiled outputs of `m` equal onnxruntime's (with `reference`, ONNX's reference implementation's)."""
    if reference:
        want = ReferenceEvaluator(m).run(None, inputs)
    else:
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    got = run(m, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def float_out(dtype: Any = np.float32) -> list[tuple[str, int]]:
    return [("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))]


# --- GridSample -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_grid_sample_opset16_names_match_onnxruntime(mode: str, padding: str) -> None:
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    g = (rng.standard_normal((2, 4, 3, 2)) * 1.3).astype(np.float32)
    # bicubic off the input: onnxruntime (as PyTorch) clamps or mirrors each tap, ONNX's reference the position
    # first, then each tap; kiln follows the reference
    m = model("GridSample", {"x": x, "g": g}, float_out(), 16, mode=mode, padding_mode=padding, align_corners=1)
    if mode == "bicubic" and padding != "zeros":  # ONNX's reference knows only opset 20's names
        want = ReferenceEvaluator(model("GridSample", {"x": x, "g": g}, float_out(), 20, mode="cubic",
                                        padding_mode=padding, align_corners=1)).run(None, {"x": x, "g": g})[0]
        np.testing.assert_allclose(run(m, {"x": x, "g": g})[0], want, rtol=1e-5, atol=1e-5)
    else:
        check(m, {"x": x, "g": g})


def test_volumetric_grid_sample_of_float64_matches_onnxruntime() -> None:
    x = rng.standard_normal((1, 2, 3, 4, 5))
    g = rng.standard_normal((1, 2, 3, 4, 3)) * 1.2
    check(model("GridSample", {"x": x, "g": g}, float_out(np.float64), 20, mode="linear", padding_mode="border"),
          {"x": x, "g": g}, rtol=1e-6, atol=1e-6)  # positions in float32, as ONNX's reference (ORT: float64)


@pytest.mark.parametrize(("opset", "attrs", "shape", "message"), [
    (16, {"mode": "linear"}, (1, 1, 3, 3), r"attribute mode is 'linear': expected bilinear, nearest or bicubic"),
    (20, {"mode": "bilinear"}, (1, 1, 3, 3), r"attribute mode is 'bilinear': expected linear, nearest or cubic"),
    (20, {"padding_mode": "wrap"}, (1, 1, 3, 3), r"padding_mode is 'wrap': expected zeros, border or reflection"),
    (16, {}, (1, 1, 3, 3, 3), r"opset 16 samples 4-D inputs \(N, C, H, W\) only"),
])
def test_grid_sample_errors_name_the_node(opset: int, attrs: dict[str, Any], shape: tuple[int, ...],
                                          message: str) -> None:
    x = np.zeros(shape, np.float32)
    g = np.zeros((1, *[2] * (len(shape) - 2), len(shape) - 2), np.float32)
    with pytest.raises(OnnxImportError, match=r"GridSample node 'n'.*" + message):
        relay.frontend.from_onnx(model("GridSample", {"x": x, "g": g}, float_out(), opset, **attrs))


def test_grid_of_the_wrong_batch_is_a_type_error_naming_the_node() -> None:
    x, g = np.zeros((2, 1, 3, 3), np.float32), np.zeros((3, 2, 2, 2), np.float32)
    with pytest.raises(Exception, match=r"(?s)'n'.*expected a grid \(N, out spatial..., 2\)"):
        relay.frontend.from_onnx(model("GridSample", {"x": x, "g": g}, float_out(), 20))


# --- AffineGrid -----------------------------------------------------------------------------------


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 7), (2, 1, 3, 1, 5), (1, 1, 1, 2)])
def test_affine_grid_matches_onnxruntime(align: int, size: tuple[int, ...]) -> None:
    nd = len(size) - 2
    theta = rng.standard_normal((size[0], nd, nd + 1)).astype(np.float32)
    m = model("AffineGrid", {"theta": theta}, float_out(), 20, inits={"size": np.array(size, np.int64)},
              align_corners=align)
    check(m, {"theta": theta}, reference=True)
    if not (align and 1 in size[2:]):  # onnxruntime puts an axis of 1 at 1 with align_corners, the reference at -1
        check(m, {"theta": theta})


def test_affine_grid_feeds_grid_sample() -> None:
    # the identity transform samples the input back (align_corners: pixel centres land on pixels)
    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    x = rng.standard_normal((1, 2, 4, 5)).astype(np.float32)
    grid = helper.make_node("AffineGrid", ["theta", "size"], ["g"], align_corners=1)
    sample = helper.make_node("GridSample", ["x", "g"], ["y"], align_corners=1)
    graph = helper.make_graph(
        [grid, sample], "g",
        [helper.make_tensor_value_info("theta", 1, theta.shape), helper.make_tensor_value_info("x", 1, x.shape)],
        [helper.make_tensor_value_info("y", 1, None)], [numpy_helper.from_array(np.array(x.shape, np.int64), "size")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=8)
    mod, params = relay.frontend.from_onnx(m)
    y = relay.build(mod, target="llvm", params=params).create_executor()(theta=theta, x=x)
    np.testing.assert_allclose(np.asarray(y), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("theta_shape", "size", "message"), [
    ((2, 2, 3), (2, 3, 4), r"input size is \[2, 3, 4\]: expected \(N, C, H, W\) or \(N, C, D, H, W\)"),
    ((2, 2, 3), (2, 3, 0, 4), r"N and the spatial sizes must be at least 1"),
    ((2, 3, 4), (2, 3, 4, 4), r"theta has shape \(2, 3, 4\): expected \(2, 2, 3\) for size \[2, 3, 4, 4\]"),
    ((1, 2, 3), (2, 3, 4, 4), r"theta has shape \(1, 2, 3\): expected \(2, 2, 3\)"),
])
def test_affine_grid_errors_name_the_node(theta_shape: tuple[int, ...], size: tuple[int, ...], message: str) -> None:
    theta = np.zeros(theta_shape, np.float32)
    m = model("AffineGrid", {"theta": theta}, float_out(), 20, inits={"size": np.array(size, np.int64)})
    with pytest.raises(OnnxImportError, match=r"AffineGrid node 'n'.*" + message):
        relay.frontend.from_onnx(m)


# --- LpPool ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "attrs"), [
    ((1, 2, 9, 7), {"kernel_shape": [3, 2], "p": 1, "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((2, 3, 8, 8), {"kernel_shape": [2, 2], "p": 5, "auto_pad": "SAME_UPPER", "strides": [3, 3]}),
    ((1, 2, 11), {"kernel_shape": [4], "p": 3, "dilations": [2]}),
    ((1, 1, 4, 5, 6), {"kernel_shape": [2, 3, 2], "p": 2, "pads": [1, 0, 1, 0, 1, 1]}),
])
def test_lp_pool_matches_onnxruntime(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    check(model("LpPool", {"x": x}, float_out(), 18, **attrs), {"x": x}, rtol=1e-4)


def test_lp_pool_with_a_negative_p_is_refused() -> None:
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(OnnxImportError, match=r"LpPool node 'n'.*attribute p is -2.0: expected a value > 0"):
        relay.frontend.from_onnx(model("LpPool", {"x": x}, float_out(), 18, kernel_shape=[2, 2], p=-2))


# --- MaxPool's Indices ----------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "attrs"), [
    ((2, 3, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 0]}),
    ((1, 2, 6, 5), {"kernel_shape": [2, 3], "storage_order": 1, "ceil_mode": 1, "strides": [2, 2]}),
    ((2, 2, 9), {"kernel_shape": [3], "strides": [2], "dilations": [2], "pads": [2, 1]}),
    ((1, 2, 5, 5), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
])
def test_max_pool_indices_match_onnxruntime(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    check(model("MaxPool", {"x": x}, [("y", 1), ("i", 7)], 12, **attrs), {"x": x}, rtol=0, atol=0)


def test_max_pool_indices_of_a_3d_pool_are_refused() -> None:
    x = np.zeros((1, 1, 3, 3, 3), np.float32)
    with pytest.raises(OnnxImportError, match=r"MaxPool node 'n'.*the Indices output of a 3-D MaxPool is not "
                                              r"supported \(1-D and 2-D are\)"):
        relay.frontend.from_onnx(model("MaxPool", {"x": x}, [("y", 1), ("i", 7)], 12, kernel_shape=[2, 2, 2]))


# --- RoiAlign -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("opset", "attrs"), [
    (10, {"output_height": 3, "output_width": 2, "sampling_ratio": 2, "spatial_scale": 0.5}),
    (16, {"output_height": 2, "output_width": 4, "sampling_ratio": 1, "mode": "max"}),
    (16, {"output_height": 4, "output_width": 3, "sampling_ratio": 3,
          "coordinate_transformation_mode": "output_half_pixel"}),
])
def test_roi_align_matches_onnxruntime(opset: int, attrs: dict[str, Any]) -> None:
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.array([[0.0, 0.0, 10.0, 8.0], [1.5, 2.2, 6.3, 7.7], [-2.0, 4.0, 13.0, 12.0]], np.float32)
    batch = np.array([1, 0, 1], np.int64)
    inputs = {"x": x, "rois": rois, "b": batch}
    check(model("RoiAlign", inputs, float_out(), opset, **attrs), inputs, rtol=1e-4)


def test_roi_align_with_an_adaptive_sampling_ratio_is_refused() -> None:
    inputs = {"x": np.zeros((1, 1, 4, 4), np.float32), "rois": np.zeros((1, 4), np.float32),
              "b": np.zeros(1, np.int64)}
    with pytest.raises(OnnxImportError, match=r"RoiAlign node 'n'.*attribute sampling_ratio is 0: kiln needs a fixed "
                                              r"number of samples per bin"):
        relay.frontend.from_onnx(model("RoiAlign", inputs, float_out(), 16))


# --- DeformConv -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("c", "oc", "attrs", "masked"), [
    (2, 3, {"kernel_shape": [2, 3]}, False),
    (4, 4, {"group": 2, "offset_group": 2, "strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}, True),
    (4, 2, {"offset_group": 4, "pads": [1, 1, 1, 1]}, True),
])
def test_deform_conv_matches_onnx(c: int, oc: int, attrs: dict[str, Any], masked: bool) -> None:
    x = rng.standard_normal((2, c, 5, 6)).astype(np.float32)
    w = rng.standard_normal((oc, c // attrs.get("group", 1), 2, 3)).astype(np.float32)
    (sh, sw), (dh, dw) = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
    oh, ow = (5 + pt + pb - dh - 1) // sh + 1, (6 + pl + pr - 2 * dw - 1) // sw + 1
    groups = attrs.get("offset_group", 1)
    offset = (rng.standard_normal((2, groups * 6 * 2, oh, ow)) * 1.5).astype(np.float32)
    inputs = {"x": x, "w": w, "offset": offset, "b": rng.standard_normal(oc).astype(np.float32)}
    if masked:
        inputs["mask"] = rng.uniform(0, 1, (2, groups * 6, oh, ow)).astype(np.float32)
    check(model("DeformConv", inputs, float_out(), 19, **attrs), inputs, rtol=1e-4, atol=1e-4, reference=True)


@pytest.mark.parametrize(("offset_shape", "attrs", "message"), [
    ((1, 8, 3, 3), {}, r"offset has shape \(1, 8, 3, 3\): expected \(1, 8, 2, 2\)"),
    ((1, 8, 2, 2), {"group": 3}, r"X \(1, 2, 3, 3\) and W \(1, 2, 2, 2\) do not fit group 3 and offset_group 1"),
    ((1, 8, 2, 2), {"kernel_shape": [3, 3]}, r"attribute kernel_shape \[3, 3\] does not match"),
])
def test_deform_conv_errors_name_the_node(offset_shape: tuple[int, ...], attrs: dict[str, Any], message: str) -> None:
    inputs = {"x": np.zeros((1, 2, 3, 3), np.float32), "w": np.zeros((1, 2, 2, 2), np.float32),
              "offset": np.zeros(offset_shape, np.float32)}
    with pytest.raises(OnnxImportError, match=r"DeformConv node 'n'.*" + message):
        relay.frontend.from_onnx(model("DeformConv", inputs, float_out(), 19, **attrs))


# --- CausalConvWithState (a converter of _onnx_nn.py, tested here with the other new converters) ---------


@pytest.mark.parametrize(("k", "past", "bias", "activation"), [
    (3, True, True, "silu"), (5, False, False, "none"), (1, False, True, "swish"), (2, True, False, "none"),
])
def test_causal_conv_with_state_matches_onnx(k: int, past: bool, bias: bool, activation: str) -> None:
    inputs = {"x": rng.standard_normal((3, 5, 7)).astype(np.float32),
              "w": rng.standard_normal((5, 1, k)).astype(np.float32)}
    names = ["x", "w", "b" if bias else "", "past" if past else ""]
    if bias:
        inputs["b"] = rng.standard_normal(5).astype(np.float32)
    if past:
        inputs["past"] = rng.standard_normal((3, 5, k - 1)).astype(np.float32)
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], name="n", activation=activation)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, 1, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info("y", 1, None), helper.make_tensor_value_info("state", 1, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    check(m, inputs, reference=True)


def test_causal_conv_with_state_errors_name_the_node() -> None:
    x, w = np.zeros((1, 2, 4), np.float32), np.zeros((2, 2, 3), np.float32)
    node = helper.make_node("CausalConvWithState", ["x", "w"], ["y", "s"], name="n")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape),
                                            helper.make_tensor_value_info("w", 1, w.shape)],
                              [helper.make_tensor_value_info(o, 1, None) for o in ("y", "s")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    with pytest.raises(OnnxImportError, match=r"CausalConvWithState node 'n'.*the weight has shape \(2, 2, 3\): "
                                              r"expected \(2, 1, k\), one kernel per channel"):
        relay.frontend.from_onnx(m)
