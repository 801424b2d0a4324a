"""The ONNX converters of the nn ops (kiln/relay/frontend/_onnx_nn.py), beyond ONNX's backend cases.

Models are built with onnx.helper, imported, compiled for the host CPU and run;
their outputs must match onnxruntime's within 1e-4. The cases cover what the
backend cases leave out: 1-D and 3-D windows (lifted to 2-D, or decomposed),
auto_pad with strides, grouped and dilated windows, ConvTranspose's
output_shape, LayerNormalization's statistics outputs, Resize with constant
sizes and an aspect-ratio policy, and the errors for what kiln cannot convert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.expr import Call  # noqa: E402
from kiln.relay.frontend import OnnxImportError, OnnxValueNeededError  # noqa: E402
from kiln.relay.visitor import post_order  # noqa: E402

# onnxruntime before 1.25 (1.23 is the newest for Python 3.10) lacks kernels of newer opsets and gets cases wrong
OLD_ORT = tuple(int(p) for p in ort.__version__.split(".")[:2]) < (1, 25)

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)


def rand(*shape: int) -> Array:
    return rng.standard_normal(shape).astype(np.float32)


def model(nodes: Sequence[Any], inputs: dict[str, Array], outputs: Sequence[str],
          inits: dict[str, Array] | None = None, opset: int = 19) -> Any:
    """A float32 model (ir_version 8) whose graph inputs are shaped like `inputs`, with `inits` as initializers."""
    graph = helper.make_graph(
        list(nodes), "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, n) for n, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def one_node(op_type: str, x: Array, inits: dict[str, Array] | None = None, outputs: Sequence[str] = ("y",),
             opset: int = 19, **attrs: Any) -> Any:
    """A model of one `op_type` node named "n" reading x, then the initializers in order."""
    node = helper.make_node(op_type, ["x", *(inits or {})], list(outputs), name="n", **attrs)
    return model([node], {"x": x}, [o for o in outputs if o], inits, opset)


def run(m: Any, inputs: dict[str, Array]) -> list[Array]:
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(**inputs)
    return [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]


def check(m: Any, inputs: dict[str, Array]) -> None:
    """kiln's outputs match onnxruntime's within 1e-4, shapes and dtypes included."""
    got = run(m, inputs)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def ops_of(m: Any) -> list[str]:
    mod, _ = relay.frontend.from_onnx(m)
    return [n.op.name for n in post_order(mod["main"].body) if isinstance(n, Call)]


# --- a small CNN ------------------------------------------------------------------------------------


def test_conv_batchnorm_relu_maxpool_matches_onnxruntime() -> None:
    c = 8
    inits = {
        "w": rand(c, 3, 3, 3), "b": rand(c), "scale": rand(c), "bias": rand(c), "mean": rand(c),
        "var": np.abs(rand(c)) + 0.5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="bn",
                         epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1),
    ]
    x = rand(2, 3, 15, 14)
    check(model(nodes, {"x": x}, ["y"], inits, opset=13), {"x": x})


# --- Conv and ConvTranspose: every rank, auto_pad, groups, dilations --------------------------------


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), [
    ((2, 4, 11), (6, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [2], "group": 2}),
    ((1, 4, 9, 8), (4, 1, 3, 2), {"pads": [2, 0, 1, 1], "dilations": [2, 1], "group": 4}),
    ((1, 3, 9, 8), (5, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [3, 2]}),
    ((2, 4, 5, 6, 7), (6, 2, 3, 2, 3), {"pads": [1, 0, 1, 0, 1, 2], "strides": [2, 1, 2], "group": 2}),
    ((1, 2, 6, 5, 5), (3, 2, 2, 3, 1), {"auto_pad": "VALID", "dilations": [2, 1, 1]}),
])
def test_conv_matches_onnxruntime(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rand(*x_shape)
    check(one_node("Conv", x, {"w": rand(*w_shape), "b": rand(w_shape[0])}, **attrs), {"x": x})


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), [
    ((2, 4, 5), (4, 3, 3), {"strides": [2], "output_padding": [1], "pads": [1, 0]}),
    ((1, 4, 4, 5), (4, 3, 3, 2), {"strides": [2, 3], "group": 2, "output_shape": [8, 14]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER", "dilations": [1, 2]}),
    ((2, 4, 3, 4, 3), (4, 3, 2, 3, 3), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 0],
                                        "output_padding": [1, 0, 1], "group": 2}),
])
def test_conv_transpose_matches_onnxruntime(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                            attrs: dict[str, Any]) -> None:
    x = rand(*x_shape)
    check(one_node("ConvTranspose", x, {"w": rand(*w_shape), "b": rand(w_shape[1] * attrs.get("group", 1))},
                   **attrs), {"x": x})


def test_conv_of_a_rank_6_input_is_an_error_naming_the_node() -> None:
    x = rand(1, 1, 2, 2, 2, 2)
    with pytest.raises(OnnxImportError, match=r"Conv node 'n'.*4-D convolution .*rank 6.*1-D, 2-D and 3-D"):
        relay.frontend.from_onnx(one_node("Conv", x, {"w": rand(1, 1, 1, 1, 1, 1)}))


def test_conv_kernel_shape_must_match_the_weight() -> None:
    x = rand(1, 1, 5, 5)
    with pytest.raises(OnnxImportError, match=r"Conv node 'n'.*kernel_shape \[2, 2\].*\[3, 3\]"):
        relay.frontend.from_onnx(one_node("Conv", x, {"w": rand(1, 1, 3, 3)}, kernel_shape=[2, 2]))


# --- pools ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("op_type", "x_shape", "attrs"), [
    ("AveragePool", (2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
    ("MaxPool", (2, 3, 10), {"kernel_shape": [2], "auto_pad": "SAME_UPPER", "strides": [3]}),
    ("MaxPool", (1, 2, 7, 8, 9), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "dilations": [2, 1, 2],
                                  "ceil_mode": 1}),
    pytest.param("AveragePool", (1, 2, 7, 6, 5), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2],
                                                  "pads": [1, 0, 1, 1, 1, 0], "count_include_pad": 1},
                 marks=pytest.mark.skipif(OLD_ORT, reason="onnxruntime < 1.25 averages this padded 3-d pool wrong")),
    ("AveragePool", (1, 2, 7, 6, 5), {"kernel_shape": [3, 3, 2], "auto_pad": "SAME_LOWER", "strides": [2, 2, 2]}),
    ("GlobalAveragePool", (2, 3, 4, 5, 6), {}),
    ("GlobalMaxPool", (2, 3, 7), {}),
])
def test_pool_matches_onnxruntime(op_type: str, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = rand(*x_shape)
    check(one_node(op_type, x, **attrs), {"x": x})


def test_max_pool_indices_of_a_3d_pool_are_an_error_naming_the_node() -> None:
    x = rand(1, 1, 4, 4, 4)
    with pytest.raises(OnnxImportError, match=r"MaxPool node 'n'"):
        relay.frontend.from_onnx(one_node("MaxPool", x, outputs=("y", "i"), kernel_shape=[2, 2, 2]))


# --- normalizations -------------------------------------------------------------------------------


@pytest.mark.skipif(OLD_ORT, reason="onnxruntime < 1.25 refuses a bias shaped unlike the scale")
@pytest.mark.parametrize("outputs", [("y",), ("y", "mean", "inv_std"), ("y", "", "inv_std")])
@pytest.mark.parametrize("axis", [1, -1])
def test_layer_normalization_matches_onnxruntime(outputs: tuple[str, ...], axis: int) -> None:
    x = rand(2, 3, 4, 5)
    inner = x.shape[axis:]
    m = one_node("LayerNormalization", x, {"scale": rand(*inner), "bias": rand(*inner[1:])}, outputs=outputs,
                 axis=axis, epsilon=1e-3, opset=17)
    check(m, {"x": x})


def test_layer_normalization_of_y_alone_is_one_layer_norm() -> None:
    x = rand(2, 3, 4)
    m = one_node("LayerNormalization", x, {"scale": rand(3, 4)}, axis=1, opset=17)
    assert ops_of(m).count("nn.layer_norm") == 1


@pytest.mark.parametrize("x_shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_instance_normalization_matches_onnxruntime(x_shape: tuple[int, ...]) -> None:
    x = rand(*x_shape)
    c = x_shape[1]
    check(one_node("InstanceNormalization", x, {"scale": rand(c), "b": rand(c)}, epsilon=1e-4), {"x": x})


def test_batch_normalization_training_outputs_before_opset_14_are_an_error() -> None:
    x = rand(2, 3, 4)
    inits = {k: np.abs(rand(3)) for k in ("s", "b", "m", "v")}
    m = one_node("BatchNormalization", x, inits, outputs=("y", "mean", "var"), opset=9)
    with pytest.raises(OnnxImportError, match=r"BatchNormalization node 'n'.*training mode"):
        relay.frontend.from_onnx(m)


# --- Resize, Upsample -----------------------------------------------------------------------------


def _resize(x: Array, inputs: dict[str, Array], opset: int = 19, **attrs: Any) -> Any:
    names = ["x", *(k if v is not None else "" for k, v in inputs.items())]
    node = helper.make_node("Resize", names, ["y"], name="n", **attrs)
    inits = {k: v for k, v in inputs.items() if v is not None}
    return model([node], {"x": x}, ["y"], inits, opset)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_sizes_with_an_aspect_ratio_policy_match_onnxruntime(policy: str) -> None:
    x = rand(1, 2, 4, 6)
    sizes = np.array([9, 7], np.int64)
    m = _resize(x, {"roi": None, "scales": None, "sizes": sizes}, mode="linear", axes=[3, 2],
                keep_aspect_ratio_policy=policy)
    check(m, {"x": x})


@pytest.mark.parametrize(("opset", "attrs"), [
    (10, {"mode": "nearest"}),
    (10, {"mode": "linear"}),
    (11, {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}),
    (11, {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "floor"}),
    (13, {"mode": "cubic"}),
])
def test_resize_scales_match_onnxruntime(opset: int, attrs: dict[str, Any]) -> None:
    x = rand(1, 2, 4, 5)
    scales = np.array([1, 1, 1.75, 0.6], np.float32)
    roi = np.zeros(0, np.float32) if opset == 11 else None  # required before opset 13, empty when unused
    inputs = {"scales": scales} if opset == 10 else {"roi": roi, "scales": scales}
    check(_resize(x, inputs, opset=opset, **attrs), {"x": x})


def test_upsample_scales_attribute_matches_onnxruntime() -> None:
    x = rand(1, 2, 3, 3)
    check(one_node("Upsample", x, opset=7, mode="nearest", scales=[1.0, 1.0, 2.0, 3.0]), {"x": x})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("coordinates", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
@pytest.mark.parametrize("exclude_outside", [0, 1])
def test_resize_antialias_matches_the_onnx_reference(mode: str, coordinates: str, exclude_outside: int) -> None:
    from onnx.reference import ReferenceEvaluator

    x = rand(1, 2, 9, 11)
    scales = np.array([1, 1, 0.4, 0.7], np.float32)  # downsampling: the filter widens
    m = _resize(x, {"roi": None, "scales": scales}, mode=mode, antialias=1,
                coordinate_transformation_mode=coordinates, exclude_outside=exclude_outside)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (got,) = run(m, {"x": x})
    assert got.shape == want.shape == (1, 2, 3, 7)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resize_antialias_with_nearest_or_crop_is_an_error_naming_the_node() -> None:
    x = rand(1, 1, 4, 4)
    scales = np.array([1, 1, 0.5, 0.5], np.float32)
    for attrs in ({"mode": "nearest"}, {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}):
        m = _resize(x, {"roi": np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32), "scales": scales}, antialias=1,
                    **attrs)
        with pytest.raises(OnnxImportError, match=r"Resize node 'n'.*antialias is supported for float data"):
            relay.frontend.from_onnx(m)


def test_resize_scales_that_are_a_graph_input_are_values_the_import_names() -> None:
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="n", mode="nearest")
    m = model([node], {"x": rand(1, 1, 2, 2), "scales": np.ones(4, np.float32)}, ["y"])
    with pytest.raises(OnnxValueNeededError, match=r"Resize node 'n'.*input #2 \(scales\) decides a shape.*'scales'"):
        relay.frontend.from_onnx(m)
