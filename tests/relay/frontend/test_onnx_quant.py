"""The ONNX converters of kiln/relay/frontend/_onnx_quant.py, beyond ONNX's backend cases.

Models of one node are built with onnx.helper, imported, compiled for the host CPU and run with every
input fed at run time; their outputs must equal onnx's reference evaluator's (the ground truth of each
op), dtypes and shapes included. The cases cover the granularities (per tensor, per axis, blocked with a
ragged last block), the opsets and attributes the backend cases leave out, rounding ties and saturation,
1-D and batched products, 1-D / 3-D / grouped / strided / padded convolutions, and the errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.frontend import OnnxImportError  # noqa: E402

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)


def model(op_type: str, inputs: dict[str, Array | None], opset: int, outputs: int = 1, **attrs: Any) -> Any:
    """A model of one `op_type` node named "n"; a None input is left out (named "")."""
    node = helper.make_node(op_type, [k if v is not None else "" for k, v in inputs.items()],
                            [f"y{i}" for i in range(outputs)], name="n", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items() if v is not None],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(outputs)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run(m: Any, feeds: dict[str, Array]) -> list[Array]:
    mod, params = relay.frontend.from_onnx(m)
    out = relay.build(mod, target="llvm", params=params).create_executor()(**feeds)
    return [np.asarray(o) for o in (out if isinstance(out, tuple | list) else [out])]


def check(op_type: str, inputs: dict[str, Array | None], opset: int, outputs: int = 1, **attrs: Any) -> list[Array]:
    """kiln's outputs equal onnx's reference evaluator's exactly (floats to 1 ulp-ish); returns kiln's."""
    m = model(op_type, inputs, opset, outputs, **attrs)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    got = run(m, feeds)
    wants = [np.asarray(w) for w in ReferenceEvaluator(m).run(None, feeds)]
    assert len(got) == len(wants)
    for g, w in zip(got, wants, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-6 if g.dtype != np.float16 else 1e-3)
        else:
            np.testing.assert_array_equal(g, w)
    return got


def ints(dtype: str, *shape: int) -> Array:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


# --- QuantizeLinear -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
def test_quantize_rounds_half_to_even_and_saturates(dtype: str) -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 1e6, -1e6, 254.0, 126.6, 0.0], np.float32)
    got = check("QuantizeLinear", {"x": x, "s": np.array(0.5, np.float32), "z": np.array(3, dtype)}, 21)[0]
    info = np.iinfo(dtype)
    assert got[7] == info.max and got[8] == info.min
    assert got[0] == 4 and got[1] == 6  # 1 + 3 (tie to even), 3 + 3


def test_quantize_per_axis_with_a_negative_axis() -> None:
    x = (rng.standard_normal((2, 3, 4)) * 50).astype(np.float32)
    s = np.array([0.25, 1.0, 3.0], np.float32)
    check("QuantizeLinear", {"x": x, "s": s, "z": np.array([0, 100, 255], np.uint8)}, 13, axis=-2)


def test_quantize_blocked_with_a_ragged_last_block() -> None:
    x = (rng.standard_normal((3, 7)) * 40).astype(np.float32)
    s = rng.uniform(0.1, 2.0, (3, 3)).astype(np.float32)
    z = ints("int8", 3, 3)
    check("QuantizeLinear", {"x": x, "s": s, "z": z}, 21, axis=1, block_size=3)
    check("QuantizeLinear", {"x": x.T.copy(), "s": s.T.copy(), "z": z.T.copy()}, 21, axis=0, block_size=3)


def test_quantize_without_a_zero_point_takes_output_dtype_or_uint8() -> None:
    x = (rng.standard_normal((4, 5)) * 300).astype(np.float32)
    s = np.array(2.0, np.float32)
    assert check("QuantizeLinear", {"x": x, "s": s}, 10)[0].dtype == np.uint8
    got = check("QuantizeLinear", {"x": x, "s": s}, 21, output_dtype=TensorProto.INT16)[0]
    assert got.dtype == np.int16 and got.min() < 0


def test_quantize_float16_and_int32_inputs() -> None:
    x16 = (rng.standard_normal(33) * 30).astype(np.float16)
    check("QuantizeLinear", {"x": x16, "s": np.array(0.75, np.float16), "z": np.array(-5, np.int8)}, 19)
    check("QuantizeLinear", {"x": x16, "s": np.array(0.3, np.float32), "z": np.array(7, np.uint8)}, 23)
    x32 = rng.integers(-100000, 100000, 40).astype(np.int32)
    check("QuantizeLinear", {"x": x32, "s": np.array(3.0, np.float32), "z": np.array(-9, np.int16)}, 23)


def test_quantize_with_precision() -> None:
    x = (rng.standard_normal(20) * 10).astype(np.float32)
    check("QuantizeLinear", {"x": x, "s": np.array(0.1, np.float32), "z": np.array(0, np.int8)}, 23,
          precision=TensorProto.DOUBLE)


def test_quantize_errors_name_the_node() -> None:
    x = np.zeros((2, 6), np.float32)
    with pytest.raises(OnnxImportError, match="opset 10 takes a scalar scale"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones(6, np.float32)}, 10))
    with pytest.raises(OnnxImportError, match=r"n.*output_dtype is int16 but the zero point is int8"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones((), np.float32),
                                                          "z": np.zeros((), np.int8)}, 21,
                                       output_dtype=TensorProto.INT16))
    with pytest.raises(OnnxImportError, match=r"n.*blocked quantization .*needs a scale of shape \(2, 2\)"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones((2, 3), np.float32),
                                                          "z": np.zeros((2, 3), np.int8)}, 21, block_size=4))
    with pytest.raises(OnnxImportError, match="1-D of length 6"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones(5, np.float32)}, 13))
    with pytest.raises(OnnxImportError, match="attribute 'axis' is 2"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones(6, np.float32)}, 13, axis=2))
    with pytest.raises(OnnxImportError, match="block_size"):
        relay.frontend.from_onnx(model("QuantizeLinear", {"x": x, "s": np.ones((2, 3), np.float32)}, 21,
                                       block_size=-1))


# --- DequantizeLinear -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
def test_dequantize_per_axis(dtype: str) -> None:
    x = ints(dtype, 2, 3, 5)
    check("DequantizeLinear", {"x": x, "s": rng.uniform(0.01, 2, 5).astype(np.float32), "z": ints(dtype, 5)}, 21,
          axis=2)


def test_dequantize_int32_without_a_zero_point_and_blocked() -> None:
    check("DequantizeLinear", {"x": ints("int32", 9), "s": np.array(1e-3, np.float32)}, 19)
    x = ints("uint8", 5, 4)
    check("DequantizeLinear", {"x": x, "s": rng.uniform(0.1, 1, (2, 4)).astype(np.float32),
                               "z": ints("uint8", 2, 4)}, 21, axis=0, block_size=3)


def test_dequantize_to_another_float_dtype() -> None:
    x = ints("int8", 3, 4)
    got = check("DequantizeLinear", {"x": x, "s": np.array(0.37, np.float32), "z": np.array(2, np.int8)}, 23,
                output_dtype=TensorProto.FLOAT16)[0]
    assert got.dtype == np.float16
    check("DequantizeLinear", {"x": x, "s": np.array(0.37, np.float16), "z": np.array(2, np.int8)}, 19)


def test_dequantize_zero_point_of_another_dtype_is_an_error() -> None:
    m = model("DequantizeLinear", {"x": np.zeros(3, np.int8), "s": np.ones((), np.float32),
                                   "z": np.zeros((), np.uint8)}, 13)
    with pytest.raises(OnnxImportError):
        relay.frontend.from_onnx(m)


# --- DynamicQuantizeLinear ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize(case: str) -> None:
    x = {"mixed": rng.standard_normal((3, 5)) * 4, "positive": rng.uniform(1, 9, (3, 5)),
         "negative": -rng.uniform(1, 9, (3, 5)), "zeros": np.zeros((3, 5))}[case].astype(np.float32)
    _, scale, zp = check("DynamicQuantizeLinear", {"x": x}, 11, outputs=3)
    assert scale.shape == () and zp.shape == () and zp.dtype == np.uint8


# --- MatMulInteger, QLinearMatMul -----------------------------------------------------------------


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 5), (5, 4)), ((5,), (5, 4)), ((3, 5), (5,)),
                                                  ((2, 1, 3, 5), (4, 5, 2)), ((7,), (7,))])
def test_matmul_integer_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    check("MatMulInteger", {"a": ints("uint8", *a_shape), "b": ints("int8", *b_shape),
                            "za": np.array(128, np.uint8), "zb": np.array(-3, np.int8)}, 10)


def test_matmul_integer_per_row_and_column_zero_points_and_extremes() -> None:
    a = np.full((3, 300), 255, np.uint8)  # 300 * 255 * 255 needs int32 accumulation
    b = np.full((300, 4), 255, np.uint8)
    check("MatMulInteger", {"a": a, "b": b}, 10)
    # onnx's reference cannot broadcast a per-row zero point: against numpy (and onnxruntime, which agrees)
    a, b, za, zb = ints("int8", 3, 6), ints("int8", 6, 4), ints("int8", 3), ints("int8", 4)
    (got,) = run(model("MatMulInteger", {"a": a, "b": b, "za": za, "zb": zb}, 10), {"a": a, "b": b, "za": za, "zb": zb})
    want = (a.astype(np.int32) - za.astype(np.int32)[:, None]) @ (b.astype(np.int32) - zb.astype(np.int32))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qlinear_matmul(dtype: str, opset: int) -> None:
    a, b = ints(dtype, 2, 4, 6), ints(dtype, 6, 3)
    f = np.float32
    check("QLinearMatMul", {"a": a, "sa": np.array([0.02], f), "za": ints(dtype, 1), "b": b,
                            "sb": np.array([0.05], f), "zb": ints(dtype, 1), "sy": np.array([0.3], f),
                            "zy": ints(dtype, 1)}, opset)


def test_qlinear_matmul_float16_scales_round_each_step_as_the_reference() -> None:
    h = np.float16
    for _ in range(3):
        sa, sb, sy = (rng.uniform(lo, 10 * lo, 1).astype(h) for lo in (0.01, 0.01, 0.1))
        check("QLinearMatMul", {"a": ints("int8", 16, 9), "sa": sa, "za": ints("int8", 1), "b": ints("int8", 9, 32),
                                "sb": sb, "zb": ints("int8", 1), "sy": sy, "zy": ints("int8", 1)}, 21)


def test_qlinear_matmul_mixed_operand_dtypes_and_scalar_params() -> None:
    f = np.float32
    check("QLinearMatMul", {"a": ints("uint8", 3, 5), "sa": np.array(0.1, f), "za": np.array(9, np.uint8),
                            "b": ints("int8", 5, 2), "sb": np.array(0.01, f), "zb": np.array(0, np.int8),
                            "sy": np.array(0.05, f), "zy": np.array(-4, np.int8)}, 10)


# --- ConvInteger, QLinearConv ---------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]},
    {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"group": 2, "pads": [1, 1, 1, 1]},
])
def test_conv_integer_2d(attrs: dict[str, Any]) -> None:
    x, w = ints("uint8", 2, 4, 6, 7), ints("uint8", 6, 4 // attrs.get("group", 1), 3, 2)
    check("ConvInteger", {"x": x, "w": w, "zx": np.array(11, np.uint8), "zw": ints("uint8", 6)}, 10, **attrs)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), [
    ((1, 3, 9), (4, 3, 3), {"pads": [2, 1], "strides": [2]}),
    ((2, 2, 4, 5, 3), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "dilations": [2, 1, 1]}),
])
def test_conv_integer_1d_and_3d(x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    check("ConvInteger", {"x": ints("int8", *x_shape), "w": ints("int8", *w_shape), "zx": np.array(-7, np.int8),
                          "zw": np.array(5, np.int8)}, 10, **attrs)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qlinear_conv_with_bias_and_per_channel_weight_scales(dtype: str) -> None:
    f = np.float32
    x, w = ints(dtype, 1, 3, 5, 6), ints(dtype, 4, 3, 3, 3)
    inputs = {"x": x, "sx": np.array(0.05, f), "zx": ints(dtype, 1).reshape(()), "w": w,
              "sw": rng.uniform(0.005, 0.02, 4).astype(f), "zw": ints(dtype, 4) // 8, "sy": np.array(0.4, f),
              "zy": ints(dtype, 1).reshape(()), "b": rng.integers(-5000, 5000, 4).astype(np.int32)}
    check("QLinearConv", inputs, 10, pads=[1, 1, 1, 1], strides=[1, 2])


def test_qlinear_scale_errors_name_the_node() -> None:
    f, i8 = np.float32, np.int8
    inputs = {"a": np.zeros((2, 3), i8), "sa": np.ones(1, f), "za": np.zeros(1, i8), "b": np.zeros((3, 4), i8),
              "sb": np.ones(5, f), "zb": np.zeros(1, i8), "sy": np.ones(1, f), "zy": np.zeros(1, i8)}
    with pytest.raises(OnnxImportError, match=r"n.*b_scale must hold one element or 4"):
        relay.frontend.from_onnx(model("QLinearMatMul", inputs, 21))
    inputs["sb"], inputs["sy"] = np.ones(1, f), np.ones(2, f)
    with pytest.raises(OnnxImportError, match=r"n.*y_scale must hold one element"):
        relay.frontend.from_onnx(model("QLinearMatMul", inputs, 21))
    conv = {"x": np.zeros((1, 2, 4, 4), np.uint8), "w": np.zeros((3, 2, 2, 2), np.uint8),
            "zx": np.zeros((), np.uint8), "zw": np.zeros(2, np.uint8)}
    with pytest.raises(OnnxImportError, match="one per output channel"):
        relay.frontend.from_onnx(model("ConvInteger", conv, 10))


def test_conv_errors_name_the_node() -> None:
    x, w = np.zeros((1, 2, 4, 4), np.uint8), np.zeros((3, 2, 2, 2), np.uint8)
    with pytest.raises(OnnxImportError, match="'pads' is"):
        relay.frontend.from_onnx(model("ConvInteger", {"x": x, "w": w}, 10, pads=[1, 1]))
    with pytest.raises(OnnxImportError, match="kernel_shape"):
        relay.frontend.from_onnx(model("ConvInteger", {"x": x, "w": w}, 10, kernel_shape=[3, 3]))
    with pytest.raises(OnnxImportError, match="groups"):
        relay.frontend.from_onnx(model("ConvInteger", {"x": x, "w": np.zeros((3, 1, 2, 2), np.uint8)}, 10,
                                       group=2))


# --- BitCast --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), [("int8", "uint8"), ("uint8", "int8"), ("int16", "uint16"),
                                          ("uint32", "int32"), ("int64", "uint64"), ("bool", "uint8")])
def test_bitcast_between_integers_keeps_the_bits(src: str, dst: str) -> None:
    x = rng.integers(0, 2, 7).astype(bool) if src == "bool" else ints(src, 7)
    got = check("BitCast", {"x": x}, 26, to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))[0]
    np.testing.assert_array_equal(got, x.view(dst))


def test_bitcast_errors() -> None:
    with pytest.raises(OnnxImportError, match=r"n.*the widths must be equal"):
        relay.frontend.from_onnx(model("BitCast", {"x": np.zeros(3, np.int8)}, 26, to=TensorProto.INT32))
    with pytest.raises(OnnxImportError, match=r"BitCast from float16 to bfloat16 is not supported"):
        relay.frontend.from_onnx(model("BitCast", {"x": np.zeros(3, np.float16)}, 26, to=TensorProto.BFLOAT16))
