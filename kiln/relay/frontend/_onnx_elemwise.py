"""ONNX converters: remainders, reciprocals, bitwise ops, float classes, activations, trigonometry.

Mod, the bitwise ops, IsNaN/IsInf and the trigonometric and hyperbolic functions map onto Relay ops of
their own (`fmod`, `bitwise_and`, `isnan`, `atan`, ...: `relay/op/tensor.py`); Reciprocal and the
activations (Elu, Selu, Celu, Mish, Swish, Softsign, Shrink, ThresholdedRelu) are compositions of
elementwise ops, which fuse into one kernel. Attribute defaults are ONNX's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter
from kiln.relay.op import tensor


def _const(node: OnnxNode, like: Expr, value: float) -> Expr:
    """`value` as a scalar constant of `like`'s dtype."""
    return relay.const(np.asarray(value, node.dtype(like).numpy()))


# --- remainders and reciprocals -------------------------------------------------------------------


@onnx_converter("Mod", since=10)
def _mod(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    fmod = node.int_attr("fmod", 0)
    if fmod not in (0, 1):
        raise node.error(f"attribute 'fmod' is {fmod}: expected 0 or 1")
    # fmod=0 floors (the sign of B), for floats as opset 28 defines it (earlier opsets left it undefined)
    return tensor.fmod(a, b) if fmod else relay.floor_mod(a, b)


@onnx_converter("Reciprocal", since=1)
def _reciprocal(node: OnnxNode) -> Expr:
    x = node.input(0)
    return relay.divide(_const(node, x, 1.0), x)


# --- bitwise --------------------------------------------------------------------------------------


def _binary(op_type: str, fn: Callable[[Expr, Expr], Expr], since: int) -> None:
    onnx_converter(op_type, since=since)(lambda node: fn(node.input(0), node.input(1)))


def _unary(op_type: str, fn: Callable[[Expr], Expr], since: int) -> None:
    onnx_converter(op_type, since=since)(lambda node: fn(node.input(0)))


_binary("BitwiseAnd", tensor.bitwise_and, 18)
_binary("BitwiseOr", tensor.bitwise_or, 18)
_binary("BitwiseXor", tensor.bitwise_xor, 18)
_unary("BitwiseNot", tensor.bitwise_not, 18)


@onnx_converter("BitShift", since=11)
def _bit_shift(node: OnnxNode) -> Expr:
    direction = node.attr("direction")
    shift = {"LEFT": tensor.left_shift, "RIGHT": tensor.right_shift}.get(direction)
    if shift is None:
        raise node.error(f"attribute 'direction' is {direction!r}: expected 'LEFT' or 'RIGHT'")
    return shift(node.input(0), node.input(1))


# --- float classes --------------------------------------------------------------------------------


_unary("IsNaN", tensor.isnan, 9)


@onnx_converter("IsInf", since=10)
def _is_inf(node: OnnxNode) -> Expr:
    x = node.input(0)
    positive, negative = node.bool_attr("detect_positive", True), node.bool_attr("detect_negative", True)
    if not (positive or negative):  # neither sign asked for: nothing is reported
        return relay.zeros_like(relay.cast(x, "bool"))
    inf = tensor.isinf(x)
    if positive and negative:
        return inf
    zero = _const(node, x, 0.0)
    return relay.logical_and(inf, relay.greater(x, zero) if positive else relay.less(x, zero))


# --- activations ----------------------------------------------------------------------------------


def _expm1(node: OnnxNode, x: Expr) -> Expr:
    return relay.subtract(relay.exp(x), _const(node, x, 1.0))


@onnx_converter("Elu", since=1)
def _elu(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = _const(node, x, node.float_attr("alpha", 1.0))
    return relay.where(relay.less(x, _const(node, x, 0.0)), relay.multiply(alpha, _expm1(node, x)), x)


@onnx_converter("Selu", since=1)
def _selu(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = _const(node, x, node.float_attr("alpha", 1.67326319217681884765625))
    gamma = _const(node, x, node.float_attr("gamma", 1.05070102214813232421875))
    negative = relay.multiply(alpha, _expm1(node, x))
    return relay.multiply(gamma, relay.where(relay.greater(x, _const(node, x, 0.0)), x, negative))


@onnx_converter("Celu", since=12)
def _celu(node: OnnxNode) -> Expr:
    x = node.input(0)
    value = node.float_attr("alpha", 1.0)
    if value == 0.0:
        raise node.error("attribute 'alpha' must not be 0 (Celu divides by it)")
    alpha = _const(node, x, value)
    zero = _const(node, x, 0.0)
    negative = relay.multiply(alpha, _expm1(node, relay.divide(x, alpha)))
    return relay.add(relay.maximum(x, zero), relay.minimum(negative, zero))


@onnx_converter("Mish", since=18)
def _mish(node: OnnxNode) -> Expr:
    x = node.input(0)
    softplus = relay.log(relay.add(relay.exp(x), _const(node, x, 1.0)))  # inf for a large x: tanh(inf) is 1
    return relay.multiply(x, relay.tanh(softplus))


@onnx_converter("Swish", since=24)
def _swish(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = node.float_attr("alpha", 1.0)
    gate = x if alpha == 1.0 else relay.multiply(x, _const(node, x, alpha))
    return relay.multiply(x, relay.sigmoid(gate))


@onnx_converter("Softsign", since=1)
def _softsign(node: OnnxNode) -> Expr:
    x = node.input(0)
    return relay.divide(x, relay.add(relay.abs(x), _const(node, x, 1.0)))


@onnx_converter("ThresholdedRelu", since=10)
def _thresholded_relu(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha = _const(node, x, node.float_attr("alpha", 1.0))
    return relay.where(relay.greater(x, alpha), x, _const(node, x, 0.0))


@onnx_converter("Shrink", since=9)
def _shrink(node: OnnxNode) -> Expr:
    x = node.input(0)
    dtype = node.dtype(x)
    lambd, bias = node.float_attr("lambd", 0.5), node.float_attr("bias", 0.0)
    # integers are compared with the float bounds and shifted by the float bias in float64, then cast back,
    # as ONNX's reference does (a bias of 0.5 truncates toward zero)
    y = x if dtype.is_float else relay.cast(x, "float64")
    low = relay.add(y, _const(node, y, bias))
    high = relay.subtract(y, _const(node, y, bias))
    zero = _const(node, y, 0.0)
    out = relay.where(relay.less(y, _const(node, y, -lambd)), low,
                      relay.where(relay.greater(y, _const(node, y, lambd)), high, zero))
    return out if dtype.is_float else relay.cast(out, dtype)


# --- trigonometric and hyperbolic -----------------------------------------------------------------


for _op_type, _fn1, _since in [
    ("Tan", tensor.tan, 7), ("Asin", tensor.asin, 7), ("Acos", tensor.acos, 7), ("Atan", tensor.atan, 7),
    ("Sinh", tensor.sinh, 9), ("Cosh", tensor.cosh, 9), ("Asinh", tensor.asinh, 9), ("Acosh", tensor.acosh, 9),
    ("Atanh", tensor.atanh, 9),
]:
    _unary(_op_type, _fn1, _since)
