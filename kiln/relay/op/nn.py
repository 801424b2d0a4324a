"""Neural-network ops (the `relay.nn` namespace): activations, bias_add, softmax, dropout, pad.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, compute) after the functions it names; its
Python constructor follows, checked against it (`@constructor`). The other
members of the family live in their own modules and are re-exported here, so
users write `relay.nn.conv2d(...)` as in TVM: `kiln.relay.op.matmul` (dense,
matmul, batch_matmul), `kiln.relay.op.norm` (batch_norm, layer_norm),
`kiln.relay.op.conv` (convolutions) and `kiln.relay.op.pool` (pooling).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, float_value, int_range, one_of
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, Type, dim_add
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay.expr import Call, Constant, Expr, Var, call, const
from kiln.relay.op._nn_util import (
    FLOAT_DTYPES,
    Array,
    accumulator,
    along,
    check_vector,
    clamp,
    data_axis,
    insert,
    shape_dims,
    static_shape,
    te_dims,
    tuple_type,
    without,
)
from kiln.relay.op._reg import constructor, register_unary
from kiln.relay.op._rel import RelationError, float_dtype, same_dtype, tensor_args
from kiln.relay.op._rows import (
    ACROSS,
    AHEAD,
    ALONG,
    BLOCKS,
    ROWS,
    add,
    flat,
    row_count,
    row_reduce,
    schedule_rows,
    streams,
    unflat,
)
from kiln.relay.op._schedule import KEEP, vector_lanes
from kiln.relay.op.conv import Conv2DAttrs as Conv2DAttrs
from kiln.relay.op.conv import Conv2DTransposeAttrs as Conv2DTransposeAttrs
from kiln.relay.op.conv import conv2d, conv2d_transpose  # the convolution family belongs to relay.nn, as in TVM
from kiln.relay.op.cuda_reduce import ROW_REDUCE, schedule_rows_cuda
from kiln.relay.op.loss import LossAttrs as LossAttrs
from kiln.relay.op.loss import nll_loss, softmax_cross_entropy  # relay.nn.<loss>, as ONNX's losses
from kiln.relay.op.matmul import BatchMatmulAttrs as BatchMatmulAttrs
from kiln.relay.op.matmul import DenseAttrs as DenseAttrs
from kiln.relay.op.matmul import MatmulAttrs as MatmulAttrs
from kiln.relay.op.matmul import batch_matmul, dense, matmul
from kiln.relay.op.nn_grad import (
    bias_add_grad,
    dropout_grad,
    gelu_grad,
    leaky_relu_grad,
    log_softmax_grad,
    pad_grad,
    prelu_grad,
    relu_grad,
    softmax_grad,
)
from kiln.relay.op.norm import BatchNormAttrs as BatchNormAttrs
from kiln.relay.op.norm import LayerNormAttrs as LayerNormAttrs
from kiln.relay.op.norm import batch_norm, layer_norm
from kiln.relay.op.pool import AvgPool2DAttrs as AvgPool2DAttrs
from kiln.relay.op.pool import GlobalPool2DAttrs as GlobalPool2DAttrs
from kiln.relay.op.pool import MaxPool2DAttrs as MaxPool2DAttrs
from kiln.relay.op.pool import avg_pool2d, global_avg_pool2d, global_max_pool2d, max_pool2d, max_pool2d_argmax
from kiln.relay.op.shape import batch_flatten  # relay.nn.batch_flatten, as in TVM
from kiln.relay.op.tensor import _numeric
from kiln.relay.op.vision import roi_align
from kiln.runtime.module import STACK_LIMIT
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

# --- Activations: nn.relu, nn.leaky_relu, nn.gelu, nn.prelu ---------------------------------------


def _elementwise(name: str, f: Callable[[Any, PrimExpr], PrimExpr]) -> Callable[..., list[te.Tensor]]:
    """The compute of a one-input elementwise op whose output element is f(attrs, input element)."""

    def compute(attrs: Any, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        (x,) = inputs
        return [te.compute(x.shape, lambda *i: f(attrs, x[i]), name=name)]

    return compute


register_unary("nn.relu", "max(x, 0)", lambda attrs, x: np.maximum(x, 0).astype(x.dtype), _numeric,
               compute=_elementwise("relu", lambda attrs, v: te.max(v, te.const(0, v.dtype))))
Op.get("nn.relu").set_attr(attr.FPrimalGradient, relu_grad)


@constructor("nn.relu")
def relu(data: Expr) -> Call:
    """Rectified linear unit, max(x, 0).

    Args:
        data: the input.

    Returns:
        The call of nn.relu.
    """
    return call("nn.relu", [data])


@attrs.frozen
class LeakyReluAttrs(Attrs):
    """Attributes of nn.leaky_relu."""

    alpha: float = attrs.field(default=0.01, validator=float_value, metadata={"doc": "slope for x < 0"})


register_unary("nn.leaky_relu", "x for x > 0, alpha * x otherwise",
               lambda attrs, x: np.where(x > 0, x, attrs.alpha * x).astype(x.dtype), float_dtype, LeakyReluAttrs,
               compute=_elementwise("leaky_relu",
                                    lambda attrs, v: te.if_then_else(v > 0, v, te.const(attrs.alpha, v.dtype) * v)))
Op.get("nn.leaky_relu").set_attr(attr.FPrimalGradient, leaky_relu_grad)


@constructor("nn.leaky_relu")
def leaky_relu(data: Expr, alpha: float = 0.01) -> Call:
    """Leaky ReLU: x for x > 0, alpha * x otherwise.

    Args:
        data: the input.
        alpha: the slope for negative inputs.

    Returns:
        The call of nn.leaky_relu.
    """
    return call("nn.leaky_relu", [data], LeakyReluAttrs.make("nn.leaky_relu", alpha=alpha))


@attrs.frozen
class GeluAttrs(Attrs):
    """Attributes of nn.gelu."""

    approximate: str = attrs.field(default="none", validator=one_of("none", "tanh"), metadata={"doc": "erf or tanh"})


def _gelu_ref(attrs: GeluAttrs, x: Array) -> Array:
    if attrs.approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return np.asarray(0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return np.asarray(0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def _gelu(approximate: str, v: PrimExpr) -> PrimExpr:
    """The formula of the reference, evaluated in the input's dtype."""
    half = te.const(0.5, v.dtype)
    one = te.const(1.0, v.dtype)
    if approximate == "tanh":
        inner = te.const(math.sqrt(2.0 / math.pi), v.dtype) * (v + te.const(0.044715, v.dtype) * v * v * v)
        return half * v * (one + te.tanh(inner))
    return half * v * (one + te.erf(v * te.const(1.0 / math.sqrt(2.0), v.dtype)))


register_unary("nn.gelu", "x * Phi(x), Phi the standard normal CDF (exact, or the tanh approximation)",
               _gelu_ref, float_dtype, GeluAttrs,
               compute=_elementwise("gelu", lambda attrs, v: _gelu(attrs.approximate, v)))
Op.get("nn.gelu").set_attr(attr.FPrimalGradient, gelu_grad)


@constructor("nn.gelu")
def gelu(data: Expr, approximate: str = "none") -> Call:
    """Gaussian error linear unit.

    Args:
        data: the input (floating point).
        approximate: "none" for 0.5 x (1 + erf(x / sqrt 2)), "tanh" for the tanh approximation.

    Returns:
        The call of nn.gelu.
    """
    return call("nn.gelu", [data], GeluAttrs.make("nn.gelu", approximate=approximate))


@attrs.frozen
class AxisAttrs(Attrs):
    """An `axis` attribute (the channel axis of bias_add and prelu)."""

    axis: int = attrs.field(default=1, validator=int_range(), metadata={"doc": "the channel axis"})


def _channel_vector_rel(what: str) -> Callable[[list[Type], AxisAttrs], Type | None]:
    def relation(arg_types: list[Type], attrs: AxisAttrs) -> Type | None:
        tensors = tensor_args(arg_types)
        if tensors is None:
            return None
        data, vec = tensors
        axis = data_axis(attrs.axis, data.ndim)
        check_vector(vec, data.shape[axis], 1, what, data, axis)
        return TensorType(data.shape, same_dtype([data.dtype, vec.dtype], attrs))

    relation.__name__ = relation.__qualname__ = f"_{what}_rel"
    return relation


def _prelu_ref(attrs: AxisAttrs, x: Array, alpha: Array) -> Array:
    a = along(alpha, attrs.axis % x.ndim, x.ndim)
    return np.where(x > 0, x, a * x).astype(x.dtype)


def _prelu_compute(attrs: AxisAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, alpha = inputs
    axis = attrs.axis % x.ndim
    return [te.compute(x.shape, lambda *i: te.if_then_else(x[i] > 0, x[i], alpha[i[axis]] * x[i]), name="prelu")]


(register_op("nn.prelu").describe("x for x > 0, alpha[c] * x otherwise, alpha per channel")
    .add_argument("data", "Tensor", "the input")
    .add_argument("alpha", "Tensor", "slopes, one per channel: (C,)")
    .set_attrs_type(AxisAttrs)
    .add_type_rel("Prelu", _channel_vector_rel("alpha"))
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, _prelu_ref)
    .set_attr(attr.FCompute, _prelu_compute)
    .set_attr(attr.FPrimalGradient, prelu_grad))


@constructor("nn.prelu")
def prelu(data: Expr, alpha: Expr, axis: int = 1) -> Call:
    """Parametric ReLU with one slope per channel.

    Args:
        data: the input.
        alpha: the slopes, shape (C,) with C = data.shape[axis].
        axis: the channel axis.

    Returns:
        The call of nn.prelu.
    """
    return call("nn.prelu", [data, alpha], AxisAttrs.make("nn.prelu", axis=axis))


# --- nn.bias_add ----------------------------------------------------------------------------------


def _bias_add_ref(attrs: AxisAttrs, x: Array, bias: Array) -> Array:
    return np.asarray(x + along(bias, attrs.axis % x.ndim, x.ndim)).astype(x.dtype)


def _bias_add_compute(attrs: AxisAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, bias = inputs
    axis = attrs.axis % x.ndim
    return [te.compute(x.shape, lambda *i: x[i] + bias[i[axis]], name="bias_add")]


(register_op("nn.bias_add").describe("data + bias, the bias broadcast along the channel axis")
    .add_argument("data", "Tensor", "the input")
    .add_argument("bias", "Tensor", "one value per channel: (C,)")
    .set_attrs_type(AxisAttrs)
    .add_type_rel("BiasAdd", _channel_vector_rel("bias"))
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, _bias_add_ref)
    .set_attr(attr.FCompute, _bias_add_compute)
    .set_attr(attr.FPrimalGradient, bias_add_grad))


@constructor("nn.bias_add")
def bias_add(data: Expr, bias: Expr, axis: int = 1) -> Call:
    """Adds a per-channel bias.

    Args:
        data: the input.
        bias: shape (C,) with C = data.shape[axis].
        axis: the channel axis.

    Returns:
        The call of nn.bias_add.
    """
    return call("nn.bias_add", [data, bias], AxisAttrs.make("nn.bias_add", axis=axis))


# --- nn.softmax, nn.log_softmax -------------------------------------------------------------------


@attrs.frozen
class SoftmaxAttrs(Attrs):
    """Attributes of nn.softmax and nn.log_softmax."""

    axis: int = attrs.field(default=-1, validator=int_range(), metadata={"doc": "the axis to normalize over"})


def _softmax_rel(arg_types: list[Type], attrs: SoftmaxAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    data_axis(attrs.axis, data.ndim)
    return TensorType(data.shape, float_dtype([data.dtype], attrs))


def _softmax_ref(attrs: SoftmaxAttrs, x: Array) -> Array:
    if x.size == 0:  # numpy's max of an empty axis raises; the softmax of nothing is empty
        return np.array(x, copy=True)
    e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True))
    return np.asarray(e / np.sum(e, axis=attrs.axis, keepdims=True)).astype(x.dtype)


def _log_softmax_ref(attrs: SoftmaxAttrs, x: Array) -> Array:
    if x.size == 0:
        return np.array(x, copy=True)
    shifted = x - np.max(x, axis=attrs.axis, keepdims=True)
    return np.asarray(shifted - np.log(np.sum(np.exp(shifted), axis=attrs.axis, keepdims=True))).astype(x.dtype)


def _softmax_compute(log: bool) -> Callable[[SoftmaxAttrs, list[te.Tensor], Type], list[te.Tensor]]:
    """Four stages along the axis: the maximum, exp(x - max) (inlined), their sum, then the quotient (or log)."""

    def compute(attrs: SoftmaxAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        (x,) = inputs
        shape = shape_dims(out_type)  # symbolic dims too, the normalized axis included
        axis = attrs.axis % len(shape)
        rows = without(shape, axis)
        k = te.reduce_axis((0, te.as_index(shape[axis])), name="k")
        acc, dtype = accumulator(x.dtype), x.dtype  # float16 sums in float32
        peak = te.compute(rows, lambda *j: te.max(x[insert(j, axis, k)], axis=k), name="softmax_max")
        shifted = te.compute(shape, lambda *i: te.cast(x[i] - peak[without(i, axis)], acc), name="softmax_shifted")
        k2 = te.reduce_axis((0, te.as_index(shape[axis])), name="k2")
        total = te.compute(rows, lambda *j: te.sum(te.exp(shifted[insert(j, axis, k2)]), axis=k2), name="softmax_sum")
        if log:
            return [te.compute(shape, lambda *i: te.cast(shifted[i] - te.log(total[without(i, axis)]), dtype),
                               name="log_softmax")]
        return [te.compute(shape, lambda *i: te.cast(te.exp(shifted[i]) / total[without(i, axis)], dtype),
                           name="softmax")]

    return compute


def _larger(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """max(a, b) as one vmaxps: b when either is NaN, and either zero for -0 and 0. te.max is IEEE
    maximum (NaN wins, -0 < 0): six instructions a vector, a long chain in a scalar reduction. A
    softmax needs neither: a NaN in a row reaches every output through the sum anyway, and
    x - max is 0 for both zeros."""
    return te.if_then_else(a > b, a, b)


def _softmax_rows_compute(log: bool) -> Callable[[SoftmaxAttrs, list[te.Tensor], Type], list[te.Tensor]]:
    """Softmax along the last axis, built for a schedule that takes one row (or a block of short rows)
    at a time (`_rows.schedule_rows`).

    Per row: the maximum; exp(x - max) into a row buffer (when the row fits the kernel's stack) and its
    sum; then that times 1 / sum. log_softmax: the maximum, the sum of exp(x - max), the log of the
    sum, then x - max - log(sum). Every loop along the row is vectorized, its reductions with partial
    results per lane (`_rows.row_reduce`); the row is read from memory once, then from the cache. The
    statistics of a row are numbered by the row's place in the rows flattened, so that a block of
    consecutive rows is one range. Symbolic leading dims (a batch, a sequence) make a symbolic number
    of rows. Another axis, an empty tensor or a symbolic row length gets the generic compute.

    A tensor that comes from L3 or memory (`_rows.streams`) has the next row prefetched by the pass
    that computes exp: the row buffer's (`AHEAD`), or the sum's where there is no buffer (log_softmax,
    and rows too long for the stack). On this host's two cores softmax of 4096x4096 then took 4.6 ms
    rather than 5.7 (a plain copy of as many bytes: 3.2 ms). Most of the rest waits on the output's
    stores, each of which first reads its line from memory: written over the input (its lines cached)
    it took 3.1 ms. Computing exp twice instead, in the sum and in the output, so that those stores
    overlap arithmetic, measured no faster: twice the arithmetic for the same waits.
    """
    generic = _softmax_compute(log)

    def compute(attrs: SoftmaxAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        (x,) = inputs
        shape = shape_dims(out_type)
        *dims, n = shape
        if attrs.axis % len(shape) != len(shape) - 1 or 0 in shape or not isinstance(n, int):
            return generic(attrs, inputs, out_type)  # also a symbolic row length: its loops' splits need it
        rows = (row_count(dims),)  # symbolic leading dims (batch, sequence): a symbolic number of rows
        acc, dtype = accumulator(x.dtype), x.dtype  # float16 sums in float32
        lanes = vector_lanes(acc)
        stream = streams(shape, dtype)

        def at(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
            index = (*unflat(j[0], dims), k)
            return te.cast(x[index], acc)

        def shifted(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
            return at(j, k) - peak[j]

        peak = row_reduce(_larger, -math.inf, rows, n, lanes, at, "softmax_max")
        if log:  # its output needs no exp: the sum takes them as they come
            total = row_reduce(add, 0.0, rows, n, lanes, lambda j, k: te.exp(shifted(j, k)), "softmax_sum", stream)
            scale = te.compute(rows, lambda r: te.log(total[r]), name="softmax_log_sum",
                               attrs={KEEP: True, ACROSS: True})
            return [te.compute(shape, lambda *i: te.cast(
                te.cast(x[i], acc) - peak[flat(i[:-1], dims)] - scale[flat(i[:-1], dims)], dtype),
                name="log_softmax", attrs={ROWS: lanes, BLOCKS: True})]
        buffered = n * DataType.of(acc).bytes <= STACK_LIMIT
        if buffered:  # exp once per element, kept in a row buffer in L1
            e = te.compute((*rows, n), lambda r, k: te.exp(shifted((r,), k)), name="softmax_exp",
                           attrs={KEEP: True, ALONG: True, AHEAD: stream})

            def exp(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
                return e[j[0], k]
        else:  # a row too long for the stack: exp twice rather than a heap buffer per row
            def exp(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
                return te.exp(shifted(j, k))

        total = row_reduce(add, 0.0, rows, n, lanes, exp, "softmax_sum", stream and not buffered)
        # one division per row; the product is within an ulp of numpy's quotient
        scale = te.compute(rows, lambda r: te.const(1, acc) / total[r], name="softmax_inverse", attrs={KEEP: True})
        return [te.compute(shape, lambda *i: te.cast(exp((flat(i[:-1], dims),), i[-1]) * scale[flat(i[:-1], dims)],
                                                     dtype), name="softmax", attrs={ROWS: lanes})]

    return compute


def _softmax_cuda_compute(log: bool) -> Callable[[SoftmaxAttrs, list[te.Tensor], Type], list[te.Tensor]]:
    """Softmax along the last axis for `cuda_reduce.schedule_rows_cuda`, which spreads each row over a warp
    (or a block) and computes all of it in one kernel: per row the maximum, then the sum of exp(x - max),
    each accumulated per thread and combined across the row's threads; then exp(x - max) * (1 / sum), or
    x - max - log(sum), written by the same threads. The llvm rows compute's arithmetic: float16 in
    float32, one division a row (its reciprocal is the same for every element, and the compiler computes
    it once a thread). The maximum is te.max, NaN-propagating, so that every thread of a row combines to
    the same value whatever the order. Another axis, or an empty tensor, gets the generic compute.
    """
    generic = _softmax_compute(log)

    def compute(attrs: SoftmaxAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        (x,) = inputs
        shape = static_shape(out_type)
        if attrs.axis % len(shape) != len(shape) - 1 or 0 in shape:
            return generic(attrs, inputs, out_type)
        *dims, n = shape
        acc, dtype = accumulator(x.dtype), x.dtype  # float16 in float32
        k, k2 = te.reduce_axis((0, n), name="k"), te.reduce_axis((0, n), name="k2")

        def at(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
            index = (*j, k)
            return te.cast(x[index], acc)

        peak = te.compute(dims, lambda *j: te.max(at(j, k), axis=k), name="softmax_max")
        total = te.compute(dims, lambda *j: te.sum(te.exp(at(j, k2) - peak[j]), axis=k2), name="softmax_sum")

        def element(*i: PrimExpr) -> PrimExpr:
            j = i[:-1]
            shifted = te.cast(x[i], acc) - peak[j]
            out = shifted - te.log(total[j]) if log else te.exp(shifted) * (te.const(1, acc) / total[j])
            return te.cast(out, dtype)

        return [te.compute(shape, element, name="log_softmax" if log else "softmax", attrs={ROW_REDUCE: True})]

    return compute


for _name, _doc, _ref, _log, _grad in [
    ("nn.softmax", "exp(x) / sum(exp(x)) along axis", _softmax_ref, False, softmax_grad),
    ("nn.log_softmax", "x - log(sum(exp(x))) along axis", _log_softmax_ref, True, log_softmax_grad),
]:
    (register_op(_name).describe(_doc)
        .add_argument("data", "Tensor", "the input (floating point)")
        .set_attrs_type(SoftmaxAttrs)
        .add_type_rel("Softmax", _softmax_rel)
        .set_support_level(1)
        .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
        .set_attr(attr.FReference, _ref)
        .set_attr(attr.FCompute, _softmax_compute(_log))
        .set_attr(attr.FPrimalGradient, _grad)
        .add_implementation("rows", _softmax_rows_compute(_log), schedule_rows, target="llvm",
                            dtypes=FLOAT_DTYPES, priority=10)
        .add_implementation("rows", _softmax_cuda_compute(_log), schedule_rows_cuda, target="cuda",
                            dtypes=FLOAT_DTYPES, priority=10))


@constructor("nn.softmax")
def softmax(data: Expr, axis: int = -1) -> Call:
    """Softmax along an axis.

    Args:
        data: the input (floating point).
        axis: the axis to normalize over.

    Returns:
        The call of nn.softmax.
    """
    return call("nn.softmax", [data], SoftmaxAttrs.make("nn.softmax", axis=axis))


@constructor("nn.log_softmax")
def log_softmax(data: Expr, axis: int = -1) -> Call:
    """The logarithm of softmax along an axis, computed stably.

    Args:
        data: the input (floating point).
        axis: the axis to normalize over.

    Returns:
        The call of nn.log_softmax.
    """
    return call("nn.log_softmax", [data], SoftmaxAttrs.make("nn.log_softmax", axis=axis))


# --- nn.dropout -----------------------------------------------------------------------------------


def _rate(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise FieldError(field.name, "a number in [0, 1)", value)


@attrs.frozen
class DropoutAttrs(Attrs):
    """Attributes of nn.dropout."""

    rate: float = attrs.field(default=0.5, validator=_rate, metadata={"doc": "fraction dropped in training"})


def _dropout_rel(arg_types: list[Type], attrs: DropoutAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    float_dtype([data.dtype], attrs)
    return tuple_type(data, data)


def _dropout_compute(attrs: DropoutAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    (x,) = inputs
    return [te.compute(x.shape, lambda *i: x[i], name="dropout"),
            te.compute(x.shape, lambda *i: te.const(1, x.dtype), name="dropout_mask")]


(register_op("nn.dropout").describe("identity at inference; returns (out, mask) as TVM")
    .add_argument("data", "Tensor", "the input")
    .set_attrs_type(DropoutAttrs)
    .add_type_rel("Dropout", _dropout_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, lambda attrs, x: (x.copy(), np.ones_like(x)))
    .set_attr(attr.FCompute, _dropout_compute)
    .set_attr(attr.FPrimalGradient, dropout_grad))


@constructor("nn.dropout")
def dropout(data: Expr, rate: float = 0.5) -> Call:
    """Dropout, the identity at inference.

    Args:
        data: the input.
        rate: the fraction dropped in training.

    Returns:
        The call of nn.dropout, a tuple (out, mask); take field 0 for the output.
    """
    return call("nn.dropout", [data], DropoutAttrs.make("nn.dropout", rate=rate))


# --- nn.pad ---------------------------------------------------------------------------------------


def _to_pairs(value: Any) -> Any:
    """Converter: a sequence of (before, after) sequences becomes a tuple of int pairs."""
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) for p in value):
        return tuple(tuple(int(v) if isinstance(v, np.integer) else v for v in p) for p in value)
    return value


def _pairs(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    def natural(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not (isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 and all(map(natural, p))
                                             for p in value)):
        raise FieldError(field.name, "a list of (before, after) pairs of ints >= 0, one per axis", value)


@attrs.frozen
class PadAttrs(Attrs):
    """Attributes of nn.pad."""

    pad_width: tuple[tuple[int, int], ...] = attrs.field(
        converter=_to_pairs, validator=_pairs, metadata={"doc": "(before, after) per axis"}
    )
    pad_mode: str = attrs.field(
        default="constant", validator=one_of("constant", "edge", "reflect", "wrap"),
        metadata={"doc": "how to fill: a constant, the edge value, a reflection, or the other end (wrap)"},
    )


def _pad_rel(arg_types: list[Type], attrs: PadAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, pad_value = tensors
    if len(attrs.pad_width) != data.ndim:
        msg = f"attribute pad_width has {len(attrs.pad_width)} pairs but data {data} has rank {data.ndim}"
        raise RelationError(msg, arg=0)
    if pad_value.ndim != 0:
        raise RelationError(f"expected a scalar (rank 0) pad_value, found {pad_value}", arg=1)
    dtype = same_dtype([data.dtype, pad_value.dtype], attrs)
    shape: list[Dim] = []
    for axis, (d, (before, after)) in enumerate(zip(data.shape, attrs.pad_width, strict=True)):
        if attrs.pad_mode == "reflect" and isinstance(d, int) and max(before, after) >= d and before + after:
            msg = f"reflect padding of axis {axis} by ({before}, {after}) needs each to be less than its size {d}"
            raise RelationError(msg, arg=0)
        if attrs.pad_mode in ("edge", "wrap") and d == 0 and before + after:
            msg = f"{attrs.pad_mode} padding of axis {axis} needs a non-empty axis, found size 0"
            raise RelationError(msg, arg=0)
        shape.append(dim_add(d, before + after))
    return TensorType(tuple(shape), dtype)


def _pad_ref(attrs: PadAttrs, x: Array, pad_value: Array) -> Array:
    if attrs.pad_mode == "constant":
        return np.pad(x, attrs.pad_width, mode="constant", constant_values=pad_value.item())
    mode: Any = attrs.pad_mode  # "edge", "reflect" or "wrap", numpy's names too
    return np.pad(x, attrs.pad_width, mode=mode)


def _pad_source(mode: str, i: PrimExpr, before: int, size: int | PrimExpr) -> PrimExpr:
    """The input index that padded index i reads in `mode` (constant mode: clamped, the caller guards it).
    `size` is the axis's size: an int, or a size variable's expression (a symbolic axis)."""
    j = i - before
    if mode == "reflect":  # one reflection suffices: the relation keeps each pad below the size
        j = (size - 1) - te.abs((size - 1) - te.abs(j))
    elif mode == "wrap":  # the floor modulo: pads may exceed the size, as numpy's wrap allows
        j = j % size
    # clamped, for reflect too: it lets the bounds check see the index stays in the input
    return clamp(j, size) if isinstance(size, int) else tx.max_(tx.min_(j, size - 1), 0)


def _pad_compute(attrs: PadAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Each padded axis reads its source index; in constant mode a select outside the input takes pad_value.
    Any axis may be symbolic (the relation types a padded symbolic axis `?` today, which relay.build
    refuses, so in practice the unpadded ones: a batch)."""
    x, pad_value = inputs
    sizes = te_dims(x)
    if 0 in sizes:  # an empty input (constant mode, or the output is empty too): only pad_value
        return [te.compute(shape_dims(out_type), lambda *i: pad_value[()], name="pad")]
    widths = zip(attrs.pad_width, sizes, strict=True)
    padded = [(axis, before, size) for axis, ((before, after), size) in enumerate(widths) if before or after]

    def fill(*i: PrimExpr) -> PrimExpr:
        index = list(i)
        for axis, before, size in padded:
            index[axis] = _pad_source(attrs.pad_mode, i[axis], before, size)
        value = x[tuple(index)]
        if attrs.pad_mode != "constant" or not padded:
            return value
        inside = tx.all_of(*[c for axis, before, size in padded for c in (i[axis] >= before, i[axis] < before + size)])
        return te.if_then_else(inside, value, pad_value[()])

    return [te.compute(shape_dims(out_type), fill, name="pad")]


(register_op("nn.pad").describe("pads each axis by (before, after) with a constant, the edge value, a reflection "
                                "or the values from the other end (wrap)")
    .add_argument("data", "Tensor", "the input")
    .add_argument("pad_value", "Tensor", "the fill value for constant mode, a scalar")
    .set_attrs_type(PadAttrs)
    .add_type_rel("Pad", _pad_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _pad_ref)
    .set_attr(attr.FCompute, _pad_compute)
    .set_attr(attr.FPrimalGradient, pad_grad))


@constructor("nn.pad")
def pad(data: Expr, pad_width: Any, pad_value: Expr | float = 0.0, pad_mode: str = "constant") -> Call:
    """Pads a tensor.

    Args:
        data: the input.
        pad_width: one (before, after) pair per axis.
        pad_value: the fill for constant mode: a scalar expression, or a number made a constant of data's
            dtype when data has a type annotation (float32 otherwise).
        pad_mode: "constant", "edge", "reflect" or "wrap" (the values from the other end, as numpy's wrap).

    Returns:
        The call of nn.pad.
    """
    if not isinstance(pad_value, Expr):
        known: Type | None = data.checked_type if data.has_type else None
        if isinstance(data, Var):
            known = data.type_annotation
        elif isinstance(data, Constant):
            known = data.type
        pad_value = const(pad_value, dtype=known.dtype if isinstance(known, TensorType) else "float32")
    return call("nn.pad", [data, pad_value], PadAttrs.make("nn.pad", pad_width=pad_width, pad_mode=pad_mode))


__all__ = [  # the constructors: relay.nn.<name>
    "avg_pool2d", "batch_flatten", "batch_matmul", "batch_norm", "bias_add", "conv2d", "conv2d_transpose",
    "dense", "dropout", "gelu", "global_avg_pool2d", "global_max_pool2d", "layer_norm", "leaky_relu",
    "log_softmax", "matmul", "max_pool2d", "max_pool2d_argmax", "nll_loss", "pad", "prelu", "relu", "roi_align",
    "softmax", "softmax_cross_entropy",
]
