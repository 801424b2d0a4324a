"""ONNX converters of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv, and BitCast.

QuantizeLinear and DequantizeLinear go to qnn.quantize / qnn.dequantize (one
elementwise compute each); a missing zero point is a constant 0 of the output's
dtype (QuantizeLinear: `output_dtype`, else uint8). The integer products are
qnn.matmul_integer and qnn.conv_integer, which accumulate in int32. QLinearMatMul
and QLinearConv requantize that int32 result as onnx's reference does, in
float64: ``rint(acc * (a_scale * b_scale / y_scale) + y_zero_point)`` saturated
to y_zero_point's dtype, a chain of elementwise ops that fuses into the
product's epilogue. DynamicQuantizeLinear is composed of reductions and
qnn.quantize. BitCast between integer dtypes of one width is a cast (which keeps
the bits there); to or from a float dtype it is `reinterpret` (numpy's `.view`),
except for bool and bfloat16, whose bits kiln does not reinterpret.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import relay
from kiln.ir.dtype import DataType
from kiln.relay.expr import Expr
from kiln.relay.frontend._onnx_nn import _kernel, _window
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype
from kiln.relay.op import quantize as qnn
from kiln.relay.op.tensor import reinterpret

# --- QuantizeLinear, DequantizeLinear ------------------------------------------------------------


def _output_dtype(node: OnnxNode, name: str = "output_dtype") -> DataType | None:
    code = node.int_attr(name, 0)
    return onnx_dtype(code, f"attribute {name!r} of {node}") if code else None


def _granularity(node: OnnxNode) -> tuple[int, int]:
    """(axis, block_size) of a (De)QuantizeLinear node; before opset 13 the scale is per tensor."""
    axis, block_size = node.int_attr("axis", 1), node.int_attr("block_size", 0)
    if block_size < 0:
        raise node.error(f"attribute 'block_size' is {block_size}: expected 0 (not blocked) or more")
    scale = node.shape(1)
    if node.opset < 13 and any(d != 1 for d in scale):
        raise node.error(f"opset {node.opset} takes a scalar scale, found shape {scale}")
    if any(d != 1 for d in scale) and not -node.ndim(0) <= axis < node.ndim(0):
        raise node.error(f"attribute 'axis' is {axis}: out of range for an input of rank {node.ndim(0)}")
    return axis, block_size


def _zero_point(node: OnnxNode, index: int, dtype: DataType) -> Expr:
    """Input `index`, or zeros of `dtype` shaped like the scale (input 1) when the node leaves it out."""
    zero = node.optional_input(index)
    if zero is not None:
        return zero
    return relay.const(np.zeros(node.static_shape(1, "the scale"), dtype.numpy()))


@onnx_converter("QuantizeLinear", since=10)
def _quantize_linear(node: OnnxNode) -> Expr:
    axis, block_size = _granularity(node)
    declared = _output_dtype(node)
    zero = node.optional_input(2)
    if zero is not None and declared is not None and node.dtype(zero) != declared:
        raise node.error(f"attribute output_dtype is {declared} but the zero point is {node.dtype(zero)}: "
                         "they must agree")
    out = node.dtype(zero) if zero is not None else declared or DataType.of("uint8")
    if str(out) not in qnn.QUANT_DTYPES:
        raise node.error(f"quantizing to {out} is not supported: kiln quantizes to {', '.join(qnn.QUANT_DTYPES)}")
    precision = _output_dtype(node, "precision")
    return qnn.quantize(node.input(0), node.input(1), _zero_point(node, 2, out), axis=axis, block_size=block_size,
                        out_dtype=precision)


@onnx_converter("DequantizeLinear", since=10)
def _dequantize_linear(node: OnnxNode) -> Expr:
    axis, block_size = _granularity(node)
    return qnn.dequantize(node.input(0), node.input(1), _zero_point(node, 2, node.dtype(0)), axis=axis,
                          block_size=block_size, out_dtype=_output_dtype(node))


@onnx_converter("DynamicQuantizeLinear", since=11)
def _dynamic_quantize_linear(node: OnnxNode) -> list[Expr]:
    x = node.input(0)
    zero, one = relay.const(0.0, "float32"), relay.const(1.0, "float32")
    hi = relay.maximum(relay.max(x), zero)  # the range always holds 0, so that 0 quantizes exactly
    lo = relay.minimum(relay.min(x), zero)
    span = relay.where(relay.equal(hi, lo), one, relay.subtract(hi, lo))
    scale = relay.divide(span, relay.const(255.0, "float32"))
    zp = relay.cast(relay.clip(relay.round(relay.divide(relay.negative(lo), scale)), 0.0, 255.0), "uint8")
    return [qnn.quantize(x, scale, zp), scale, zp]


# --- MatMulInteger, QLinearMatMul ------------------------------------------------------------------


def _scalar_zero(node: OnnxNode, index: int, operand: int) -> Expr:
    """Zero point input `index`, or a 0 of operand `operand`'s dtype."""
    zero = node.optional_input(index)
    return zero if zero is not None else relay.const(np.zeros((), node.dtype(operand).numpy()))


def _integer_matmul(node: OnnxNode, a: Expr, b: Expr, za: Expr, zb: Expr) -> tuple[Expr, int, int]:
    """(the int32 product with numpy.matmul's treatment of 1-D operands, a's rank, b's rank)."""
    ra, rb = node.ndim(a), node.ndim(b)
    if ra == 0 or rb == 0:
        raise node.error("the operands must have rank 1 or more")
    if ra == 1:
        a = relay.expand_dims(a, 0)
    if rb == 1:
        b = relay.expand_dims(b, 1)
    out: Expr = qnn.matmul_integer(a, b, za, zb)
    squeeze = ([-2] if ra == 1 else []) + ([-1] if rb == 1 else [])
    if squeeze:
        out = relay.squeeze(out, [node.ndim(out) + s for s in squeeze])
    return out, ra, rb


@onnx_converter("MatMulInteger", since=10)
def _matmul_integer(node: OnnxNode) -> Expr:
    out, _, _ = _integer_matmul(node, node.input(0), node.input(1), _scalar_zero(node, 2, 0), _scalar_zero(node, 3, 1))
    return out


def _requantize(node: OnnxNode, acc: Expr, multiplier: Expr, y_zero: Expr) -> Expr:
    """rint(acc * multiplier + y_zero) saturated to y_zero's dtype, in float64 as onnx's reference."""
    dtype = node.dtype(y_zero)
    if str(dtype) not in ("int8", "uint8"):
        raise node.error(f"the output zero point must be int8 or uint8, found {dtype}")
    info = np.iinfo(dtype.numpy())
    wide = relay.multiply(relay.cast(acc, "float64"), relay.cast(multiplier, "float64"))
    wide = relay.add(wide, relay.cast(y_zero, "float64"))
    return relay.cast(relay.clip(relay.round(wide), float(info.min), float(info.max)), dtype)


def _multiplier(node: OnnxNode, a_scale: Expr, b_scale: Expr, y_scale: Expr) -> Expr:
    """a_scale * b_scale / y_scale in the scales' dtype, each step rounded to it.

    A float16 step is computed in float32 and cast back: inside a kernel float16 values are held in float32
    registers, unrounded between operations, while the reference rounds each product to float16.
    """
    if str(node.dtype(a_scale)) != "float16":
        return relay.divide(relay.multiply(a_scale, b_scale), y_scale)

    def step(fn: Callable[[Expr, Expr], Expr], x: Expr, y: Expr) -> Expr:
        return relay.cast(fn(relay.cast(x, "float32"), relay.cast(y, "float32")), "float16")

    return step(relay.divide, step(relay.multiply, a_scale, b_scale), y_scale)


def _single(node: OnnxNode, index: int, what: str) -> Expr:
    """Input `index` as a scalar; an error unless it holds one element."""
    shape = node.static_shape(index, what)
    if int(np.prod(shape)) != 1:
        raise node.error(f"{what} must hold one element (per-tensor quantization), found shape {shape}")
    return relay.reshape(node.input(index), ())


def _vector(node: OnnxNode, index: int, length: int, what: str, trailing: int) -> Expr:
    """Input `index` (one element, or `length` of them) shaped to broadcast along the dim `trailing` dims before
    the last of the result."""
    shape = node.static_shape(index, what)
    size = int(np.prod(shape))
    if size == 1:
        return relay.reshape(node.input(index), ())
    if size != length or len(shape) != 1:
        raise node.error(f"{what} must hold one element or {length}, found shape {shape}")
    return relay.reshape(node.input(index), (length,) + (1,) * trailing)


@onnx_converter("QLinearMatMul", since=10)
def _qlinear_matmul(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(3)
    acc, ra, rb = _integer_matmul(node, a, b, node.input(2), node.input(5))
    m = node.shape(a)[-2] if ra > 1 else 1
    n = node.shape(b)[-1] if rb > 1 else 1
    if not isinstance(m, int) or not isinstance(n, int):
        raise node.error("QLinearMatMul needs static M and N")
    a_scale = _vector(node, 1, m, "a_scale", 1 if rb > 1 else 0)  # one per row of a
    b_scale = _vector(node, 4, n, "b_scale", 0)  # one per column of b
    multiplier = _multiplier(node, a_scale, b_scale, _single(node, 6, "y_scale"))
    return _requantize(node, acc, multiplier, relay.reshape(node.input(7), ()))


# --- ConvInteger, QLinearConv ----------------------------------------------------------------------


def _integer_conv(node: OnnxNode, x: Expr, w: Expr, zx: Expr, zw: Expr) -> Expr:
    nd = node.ndim(x) - 2
    if nd not in (1, 2, 3):
        raise node.error(f"{nd}-D convolution (input of rank {nd + 2}) is not supported: kiln supports 1-D to 3-D")
    weight = node.static_shape(w, "the weight")
    if len(weight) != nd + 2:
        raise node.error(f"the weight has shape {weight}; expected rank {nd + 2} like the input")
    win = _window(node, node.shape(x)[2:], _kernel(node, weight[2:]))
    if int(np.prod(node.static_shape(zx, "x_zero_point"))) != 1:
        raise node.error(f"x_zero_point must be a scalar, found shape {node.shape(zx)}")
    zw_shape = node.static_shape(zw, "w_zero_point")
    zw = relay.reshape(zw, () if int(np.prod(zw_shape)) == 1 else (-1,))
    return qnn.conv_integer(x, w, relay.reshape(zx, ()), zw, strides=win.strides, padding=[*win.begin, *win.end],
                            dilation=win.dilations, groups=node.int_attr("group", 1))


@onnx_converter("ConvInteger", since=10)
def _conv_integer(node: OnnxNode) -> Expr:
    return _integer_conv(node, node.input(0), node.input(1), _scalar_zero(node, 2, 0), _scalar_zero(node, 3, 1))


@onnx_converter("QLinearConv", since=10)
def _qlinear_conv(node: OnnxNode) -> Expr:
    x, w = node.input(0), node.input(3)
    acc = _integer_conv(node, x, w, node.input(2), node.input(5))
    bias = node.optional_input(8)
    if bias is not None:
        acc = relay.nn.bias_add(acc, bias, axis=1)
    nd = node.ndim(x) - 2
    out_channels = node.static_shape(w, "the weight")[0]
    w_scale = _vector(node, 4, out_channels, "w_scale", nd)
    multiplier = _multiplier(node, _single(node, 1, "x_scale"), w_scale, _single(node, 6, "y_scale"))
    return _requantize(node, acc, multiplier, relay.reshape(node.input(7), ()))


# --- BitCast ---------------------------------------------------------------------------------------


def _same_bits(a: DataType, b: DataType) -> bool:
    return a.bytes == b.bytes


@onnx_converter("BitCast", since=26)
def _bitcast(node: OnnxNode) -> Expr:
    x = node.input(0)
    src, dst = node.dtype(x), onnx_dtype(node.int_attr("to"), f"attribute 'to' of {node}")
    if not _same_bits(src, dst):
        raise node.error(f"BitCast from {src} ({src.bytes * 8} bits) to {dst} ({dst.bytes * 8} bits): "
                         "the widths must be equal")
    if src == dst:
        return x
    if src.is_float or dst.is_float:
        if "bool" in (src.name, dst.name) or "bfloat16" in (src.name, dst.name):
            raise node.error(f"BitCast from {src} to {dst} is not supported: kiln reinterprets the bits of "
                             "integer, float16, float32 and float64 tensors only")
        return reinterpret(x, dst)
    # two's complement integers of one width: the cast keeps every bit; bool is one byte of 0 or 1
    return relay.cast(x, dst)
