"""Neural-network ops (the `relay.nn` namespace): activations, dense/matmul, softmax, norms, pad.

Each op is registered in one chain: description, arguments, attrs, relation,
pattern, numpy reference; its Python constructor sits next to it. The
convolution and pooling ops live in `kiln.relay.op.conv` and are re-exported
here, so users write `relay.nn.conv2d(...)` as in TVM.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from kiln.ir.attrs import Attrs, FieldError, bool_value, float_value, int_range, one_of, optional
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, TupleType, Type, dim_add
from kiln.registry import OpPattern
from kiln.relay.expr import Call, Constant, Expr, Var, call, const
from kiln.relay.op._reg import register_nn_op, register_unary
from kiln.relay.op._rel import (
    RelationError,
    broadcast_dim,
    broadcast_shapes,
    float_dtype,
    normalize_axis,
    same_dtype,
    tensor_args,
)
from kiln.relay.op.conv import (  # the convolution family belongs to relay.nn as well, as in TVM
    avg_pool2d,
    conv2d,
    conv2d_transpose,
    differ,
    dtype_or_none,
    global_avg_pool2d,
    global_max_pool2d,
    max_pool2d,
    optional_dtype,
)
from kiln.relay.op.tensor import _numeric
from kiln.relay.op.transform import batch_flatten  # relay.nn.batch_flatten, as in TVM

Array = np.ndarray[Any, Any]


def _axis(axis: int, ndim: int) -> int:
    """normalize_axis, blaming the data argument."""
    try:
        return normalize_axis(axis, ndim)
    except RelationError as err:
        err.arg = 0
        raise


def _along(v: Array, axis: int, ndim: int) -> Array:
    """A 1-D array shaped to broadcast along `axis` of an ndim-D array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def _tuple_type(*fields: Type) -> TupleType:
    # typed as tuple[Type, ...]: mypy refuses a tuple of TensorTypes for TupleType's `converter=tuple`
    return TupleType(fields)


def _check_vector(t: TensorType, size: Dim, arg: int, what: str, data: TensorType, axis: int) -> None:
    """Checks that `t` is a vector of `size` (data's dim `axis`)."""
    if t.ndim != 1 or differ(t.shape[0], size):
        raise RelationError(f"expected {what} of shape ({size},) (dim {axis} of data {data}), found {t}", arg=arg)


# --- Activations: nn.relu, nn.leaky_relu, nn.gelu, nn.prelu ---------------------------------------


register_unary("nn.relu", "max(x, 0)", lambda attrs, x: np.maximum(x, 0).astype(x.dtype), _numeric)


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
               lambda attrs, x: np.where(x > 0, x, attrs.alpha * x).astype(x.dtype), float_dtype, LeakyReluAttrs)


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


register_unary("nn.gelu", "x * Phi(x), Phi the standard normal CDF (exact, or the tanh approximation)",
               _gelu_ref, float_dtype, GeluAttrs)


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
        axis = _axis(attrs.axis, data.ndim)
        _check_vector(vec, data.shape[axis], 1, what, data, axis)
        return TensorType(data.shape, same_dtype([data.dtype, vec.dtype], attrs))

    relation.__name__ = relation.__qualname__ = f"_{what}_rel"
    return relation


def _prelu_ref(attrs: AxisAttrs, x: Array, alpha: Array) -> Array:
    a = _along(alpha, attrs.axis % x.ndim, x.ndim)
    return np.where(x > 0, x, a * x).astype(x.dtype)


register_nn_op("nn.prelu", "x for x > 0, alpha[c] * x otherwise, alpha per channel",
               [("data", "the input"), ("alpha", "slopes, one per channel: (C,)")],
               _channel_vector_rel("alpha"), _prelu_ref, OpPattern.BROADCAST, attrs_type=AxisAttrs, level=3)


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
    return np.asarray(x + _along(bias, attrs.axis % x.ndim, x.ndim)).astype(x.dtype)


register_nn_op("nn.bias_add", "data + bias, the bias broadcast along the channel axis",
               [("data", "the input"), ("bias", "one value per channel: (C,)")],
               _channel_vector_rel("bias"), _bias_add_ref, OpPattern.BROADCAST, attrs_type=AxisAttrs, level=1)


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


# --- nn.dense, nn.matmul, nn.batch_matmul ---------------------------------------------------------


@attrs.frozen
class DenseAttrs(Attrs):
    """Attributes of nn.dense."""

    units: int | None = attrs.field(default=None, validator=optional(int_range(1)), metadata={"doc": "outputs (N)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: data's"}
    )


def _dense_rel(arg_types: list[Type], attrs: DenseAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, weight = tensors
    if data.ndim < 1:
        raise RelationError(f"expected data of rank >= 1, (..., K), found {data}", arg=0)
    if weight.ndim != 2:
        raise RelationError(f"expected a weight of rank 2, (units, K), found {weight}", arg=1)
    units, k = weight.shape
    if differ(data.shape[-1], k):
        raise RelationError(
            f"data {data} has K={data.shape[-1]} (its last dim) but weight {weight} has K={k} (its dim 1)", arg=1
        )
    if attrs.units is not None:
        if differ(units, attrs.units):
            raise RelationError(f"attribute units is {attrs.units} but weight {weight} has {units} rows", arg=1)
        units = attrs.units
    dtype = same_dtype([data.dtype, weight.dtype], attrs)
    return TensorType((*data.shape[:-1], units), attrs.out_dtype or dtype)


def _dense_ref(attrs: DenseAttrs, x: Array, w: Array) -> Array:
    dtype = attrs.out_dtype.numpy() if attrs.out_dtype else x.dtype
    return np.asarray(np.matmul(x.astype(dtype), w.astype(dtype).T))


register_nn_op("nn.dense", "data @ weight.T: (..., K) x (N, K) -> (..., N)",
               [("data", "the input, (..., K)"), ("weight", "the weight, (N, K)")],
               _dense_rel, _dense_ref, OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=DenseAttrs, level=1)


def dense(data: Expr, weight: Expr, units: int | None = None, out_dtype: Any = None) -> Call:
    """A fully connected layer without bias: data @ weight.T.

    Args:
        data: the input, (..., K).
        weight: the weight, (N, K).
        units: N, checked against the weight.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.dense.
    """
    return call("nn.dense", [data, weight], DenseAttrs.make("nn.dense", units=units, out_dtype=out_dtype))


@attrs.frozen
class MatmulAttrs(Attrs):
    """Attributes of nn.matmul."""

    transpose_a: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "a is (..., K, M)"})
    transpose_b: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "b is (..., N, K)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: a's"}
    )


@attrs.frozen
class BatchMatmulAttrs(Attrs):
    """Attributes of nn.batch_matmul; y is (B, N, K) by default, as in TVM."""

    transpose_a: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "x is (B, K, M)"})
    transpose_b: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "y is (B, N, K)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: x's"}
    )


def _mm_dims(a: TensorType, b: TensorType, attrs: MatmulAttrs | BatchMatmulAttrs) -> tuple[Dim, Dim]:
    """(M, N) of a matrix product over the last two dims; checks the K dims agree."""
    m, ka = (a.shape[-1], a.shape[-2]) if attrs.transpose_a else (a.shape[-2], a.shape[-1])
    n, kb = (b.shape[-2], b.shape[-1]) if attrs.transpose_b else (b.shape[-1], b.shape[-2])
    if differ(ka, kb):
        where_a = "dim -2" if attrs.transpose_a else "dim -1"
        where_b = "dim -1" if attrs.transpose_b else "dim -2"
        raise RelationError(
            f"the reduction dims differ: {a} has K={ka} ({where_a}, transpose_a={attrs.transpose_a}) "
            f"but {b} has K={kb} ({where_b}, transpose_b={attrs.transpose_b})",
            arg=1,
        )
    return m, n


def _matmul_rel(arg_types: list[Type], attrs: MatmulAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    a, b = tensors
    for i, t in enumerate(tensors):
        if t.ndim < 2:
            raise RelationError(f"expected a tensor of rank >= 2 (a matrix or a batch of them), found {t}", arg=i)
    m, n = _mm_dims(a, b, attrs)
    try:
        batch = broadcast_shapes([a.shape[:-2], b.shape[:-2]])
    except RelationError as err:
        raise RelationError(f"the batch dims of {a} and {b} do not broadcast: {err}", arg=1) from None
    dtype = same_dtype([a.dtype, b.dtype], attrs)
    return TensorType((*batch, m, n), attrs.out_dtype or dtype)


def _matmul_ref(attrs: MatmulAttrs | BatchMatmulAttrs, a: Array, b: Array) -> Array:
    dtype = attrs.out_dtype.numpy() if attrs.out_dtype else a.dtype
    a = np.swapaxes(a, -1, -2) if attrs.transpose_a else a
    b = np.swapaxes(b, -1, -2) if attrs.transpose_b else b
    return np.asarray(np.matmul(a.astype(dtype), b.astype(dtype)))


register_nn_op("nn.matmul", "matrix product of the last two dims, batch dims broadcast as numpy.matmul",
               [("tensor_a", "(..., M, K), or (..., K, M) with transpose_a"),
                ("tensor_b", "(..., K, N), or (..., N, K) with transpose_b")],
               _matmul_rel, _matmul_ref, OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=MatmulAttrs, level=1)


def matmul(
    tensor_a: Expr, tensor_b: Expr, transpose_a: bool = False, transpose_b: bool = False, out_dtype: Any = None
) -> Call:
    """Matrix product, numpy.matmul style, with optional transposes of the last two dims.

    Args:
        tensor_a: (..., M, K), or (..., K, M) with transpose_a.
        tensor_b: (..., K, N), or (..., N, K) with transpose_b.
        transpose_a: whether tensor_a is given transposed.
        transpose_b: whether tensor_b is given transposed.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.matmul.
    """
    return call("nn.matmul", [tensor_a, tensor_b], MatmulAttrs.make(
        "nn.matmul", transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype
    ))


def _batch_matmul_rel(arg_types: list[Type], attrs: BatchMatmulAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    x, y = tensors
    for i, t in enumerate(tensors):
        if t.ndim != 3:
            raise RelationError(f"expected a tensor of rank 3 (batch, rows, cols), found {t}", arg=i)
    m, n = _mm_dims(x, y, attrs)
    batch = broadcast_dim(x.shape[0], y.shape[0])
    if batch is None:
        raise RelationError(
            f"the batch dims differ: x {x} has {x.shape[0]}, y {y} has {y.shape[0]} (one may be 1)", arg=1
        )
    dtype = same_dtype([x.dtype, y.dtype], attrs)
    return TensorType((batch, m, n), attrs.out_dtype or dtype)


register_nn_op("nn.batch_matmul", "batched matrix product; y is (B, N, K) by default (transpose_b), as TVM",
               [("x", "(B, M, K), or (B, K, M) with transpose_a"), ("y", "(B, N, K), or (B, K, N) if not transpose_b")],
               _batch_matmul_rel, _matmul_ref, OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=BatchMatmulAttrs,
               level=10)


def batch_matmul(x: Expr, y: Expr, transpose_a: bool = False, transpose_b: bool = True, out_dtype: Any = None) -> Call:
    """Batched matrix product, TVM's convention (y transposed by default).

    Args:
        x: (B, M, K), or (B, K, M) with transpose_a.
        y: (B, N, K) with transpose_b (the default), or (B, K, N).
        transpose_a: whether x is given transposed.
        transpose_b: whether y is given transposed.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.batch_matmul: (B, M, N); a batch of 1 broadcasts.
    """
    return call("nn.batch_matmul", [x, y], BatchMatmulAttrs.make(
        "nn.batch_matmul", transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype
    ))


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
    _axis(attrs.axis, data.ndim)
    return TensorType(data.shape, float_dtype([data.dtype], attrs))


def _softmax_ref(attrs: SoftmaxAttrs, x: Array) -> Array:
    e = np.exp(x - np.max(x, axis=attrs.axis, keepdims=True))
    return np.asarray(e / np.sum(e, axis=attrs.axis, keepdims=True)).astype(x.dtype)


def _log_softmax_ref(attrs: SoftmaxAttrs, x: Array) -> Array:
    shifted = x - np.max(x, axis=attrs.axis, keepdims=True)
    return np.asarray(shifted - np.log(np.sum(np.exp(shifted), axis=attrs.axis, keepdims=True))).astype(x.dtype)


for _name, _doc, _ref in [
    ("nn.softmax", "exp(x) / sum(exp(x)) along axis", _softmax_ref),
    ("nn.log_softmax", "x - log(sum(exp(x))) along axis", _log_softmax_ref),
]:
    register_nn_op(_name, _doc,
                   [("data", "the input (floating point)")],
                   _softmax_rel, _ref, OpPattern.OPAQUE, attrs_type=SoftmaxAttrs, level=1)


def softmax(data: Expr, axis: int = -1) -> Call:
    """Softmax along an axis.

    Args:
        data: the input (floating point).
        axis: the axis to normalize over.

    Returns:
        The call of nn.softmax.
    """
    return call("nn.softmax", [data], SoftmaxAttrs.make("nn.softmax", axis=axis))


def log_softmax(data: Expr, axis: int = -1) -> Call:
    """The logarithm of softmax along an axis, computed stably.

    Args:
        data: the input (floating point).
        axis: the axis to normalize over.

    Returns:
        The call of nn.log_softmax.
    """
    return call("nn.log_softmax", [data], SoftmaxAttrs.make("nn.log_softmax", axis=axis))


# --- nn.batch_norm, nn.layer_norm -----------------------------------------------------------------


def _positive(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise FieldError(field.name, "a number > 0", value)


@attrs.frozen
class BatchNormAttrs(Attrs):
    """Attributes of nn.batch_norm."""

    axis: int = attrs.field(default=1, validator=int_range(), metadata={"doc": "the channel axis"})
    epsilon: float = attrs.field(default=1e-5, validator=_positive, metadata={"doc": "added to the variance"})
    center: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "add beta"})
    scale: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "multiply by gamma"})


@attrs.frozen
class LayerNormAttrs(Attrs):
    """Attributes of nn.layer_norm."""

    axis: int = attrs.field(default=-1, validator=int_range(), metadata={"doc": "the axis to normalize over"})
    epsilon: float = attrs.field(default=1e-5, validator=_positive, metadata={"doc": "added to the variance"})
    center: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "add beta"})
    scale: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "multiply by gamma"})


_BN_PARAMS = ("gamma", "beta", "moving_mean", "moving_var")


def _norm_params(tensors: list[TensorType], axis_attr: int, names: tuple[str, ...]) -> tuple[TensorType, Dim]:
    """Checks the parameter vectors against the data's dim `axis`; returns (data, that dim)."""
    data = tensors[0]
    if not data.dtype.is_float:
        raise RelationError(f"expected a floating-point tensor, found dtype {data.dtype}", arg=0)
    axis = _axis(axis_attr, data.ndim)
    for i, (name, t) in enumerate(zip(names, tensors[1:], strict=True), start=1):
        _check_vector(t, data.shape[axis], i, name, data, axis)
    same_dtype([t.dtype for t in tensors], None)
    return data, data.shape[axis]


def _batch_norm_rel(arg_types: list[Type], attrs: BatchNormAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, c = _norm_params(tensors, attrs.axis, _BN_PARAMS)
    vec = TensorType((c,), data.dtype)
    return _tuple_type(data, vec, vec)


def _batch_norm_ref(
    attrs: BatchNormAttrs, x: Array, gamma: Array, beta: Array, mean: Array, var: Array
) -> tuple[Array, Array, Array]:
    axis, nd = attrs.axis % x.ndim, x.ndim
    out = (x - _along(mean, axis, nd)) / np.sqrt(_along(var, axis, nd) + attrs.epsilon)
    if attrs.scale:
        out = out * _along(gamma, axis, nd)
    if attrs.center:
        out = out + _along(beta, axis, nd)
    return out.astype(x.dtype), mean.copy(), var.copy()


register_nn_op("nn.batch_norm", "(x - mean) / sqrt(var + eps) * gamma + beta per channel; returns (out, mean, var)",
               [("data", "the input"), ("gamma", "scale per channel: (C,)"), ("beta", "shift per channel: (C,)"),
                ("moving_mean", "running mean per channel: (C,)"),
                ("moving_var", "running variance per channel: (C,)")],
               _batch_norm_rel, _batch_norm_ref, OpPattern.OPAQUE, attrs_type=BatchNormAttrs, level=1)


def batch_norm(
    data: Expr, gamma: Expr, beta: Expr, moving_mean: Expr, moving_var: Expr,
    axis: int = 1, epsilon: float = 1e-5, center: bool = True, scale: bool = True,
) -> Call:
    """Batch normalization with the moving statistics (inference), as TVM.

    Args:
        data: the input.
        gamma: scale per channel, (C,).
        beta: shift per channel, (C,).
        moving_mean: mean per channel, (C,).
        moving_var: variance per channel, (C,).
        axis: the channel axis.
        epsilon: added to the variance.
        center: whether to add beta.
        scale: whether to multiply by gamma.

    Returns:
        The call of nn.batch_norm, a tuple (normalized, mean, var); take field 0 for the output.
    """
    return call("nn.batch_norm", [data, gamma, beta, moving_mean, moving_var], BatchNormAttrs.make(
        "nn.batch_norm", axis=axis, epsilon=epsilon, center=center, scale=scale
    ))


def _layer_norm_rel(arg_types: list[Type], attrs: LayerNormAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, _ = _norm_params(tensors, attrs.axis, ("gamma", "beta"))
    return data


def _layer_norm_ref(attrs: LayerNormAttrs, x: Array, gamma: Array, beta: Array) -> Array:
    axis, nd = attrs.axis % x.ndim, x.ndim
    mean = np.mean(x, axis=axis, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        out = out * _along(gamma, axis, nd)
    if attrs.center:
        out = out + _along(beta, axis, nd)
    return np.asarray(out).astype(x.dtype)


register_nn_op("nn.layer_norm", "(x - mean) / sqrt(var + epsilon) * gamma + beta, statistics taken along axis",
               [("data", "the input"), ("gamma", "scale, (data.shape[axis],)"), ("beta", "shift, (data.shape[axis],)")],
               _layer_norm_rel, _layer_norm_ref, OpPattern.OPAQUE, attrs_type=LayerNormAttrs, level=1)


def layer_norm(
    data: Expr, gamma: Expr, beta: Expr, axis: int = -1, epsilon: float = 1e-5, center: bool = True, scale: bool = True
) -> Call:
    """Layer normalization along one axis.

    Args:
        data: the input.
        gamma: scale, (data.shape[axis],).
        beta: shift, (data.shape[axis],).
        axis: the axis whose statistics normalize the data.
        epsilon: added to the variance.
        center: whether to add beta.
        scale: whether to multiply by gamma.

    Returns:
        The call of nn.layer_norm.
    """
    return call("nn.layer_norm", [data, gamma, beta], LayerNormAttrs.make(
        "nn.layer_norm", axis=axis, epsilon=epsilon, center=center, scale=scale
    ))


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
    return _tuple_type(data, data)


register_nn_op("nn.dropout", "identity at inference; returns (out, mask) as TVM",
               [("data", "the input")],
               _dropout_rel, lambda attrs, x: (x.copy(), np.ones_like(x)),
               OpPattern.OPAQUE, attrs_type=DropoutAttrs, level=1)


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
        default="constant", validator=one_of("constant", "edge", "reflect"), metadata={"doc": "how to fill"}
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
        if attrs.pad_mode == "reflect" and isinstance(d, int) and max(before, after) >= d:
            msg = f"reflect padding of axis {axis} by ({before}, {after}) needs each to be less than its size {d}"
            raise RelationError(msg, arg=0)
        if attrs.pad_mode == "edge" and d == 0 and before + after:
            raise RelationError(f"edge padding of axis {axis} needs a non-empty axis, found size 0", arg=0)
        shape.append(dim_add(d, before + after))
    return TensorType(tuple(shape), dtype)


def _pad_ref(attrs: PadAttrs, x: Array, pad_value: Array) -> Array:
    if attrs.pad_mode == "constant":
        return np.pad(x, attrs.pad_width, mode="constant", constant_values=pad_value.item())
    mode: Any = attrs.pad_mode  # "edge" or "reflect", numpy's names too
    return np.pad(x, attrs.pad_width, mode=mode)


register_nn_op("nn.pad", "pads each axis by (before, after) with a constant, the edge value or a reflection",
               [("data", "the input"), ("pad_value", "the fill value for constant mode, a scalar")],
               _pad_rel, _pad_ref, OpPattern.INJECTIVE, attrs_type=PadAttrs, level=2)


def pad(data: Expr, pad_width: Any, pad_value: Expr | float = 0.0, pad_mode: str = "constant") -> Call:
    """Pads a tensor.

    Args:
        data: the input.
        pad_width: one (before, after) pair per axis.
        pad_value: the fill for constant mode: a scalar expression, or a number made a constant of data's
            dtype when data has a type annotation (float32 otherwise).
        pad_mode: "constant", "edge" or "reflect".

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
    "log_softmax", "matmul", "max_pool2d", "pad", "prelu", "relu", "softmax",
]
