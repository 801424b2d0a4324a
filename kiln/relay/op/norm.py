"""Normalization ops of the `relay.nn` namespace: nn.batch_norm and nn.layer_norm.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, compute; layer_norm also its llvm "rows"
implementation, built on `kiln.relay.op._rows`, and its cuda "rows" one, scheduled
by `kiln.relay.op.cuda_reduce`) after the functions it names; its
Python constructor follows, checked against it (`@constructor`). The
constructors are re-exported by `kiln.relay.op.nn`, so users write
`relay.nn.batch_norm(...)` as in TVM.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, bool_value, int_range
from kiln.ir.types import Dim, TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import (
    FLOAT_DTYPES,
    Array,
    accumulator,
    along,
    check_vector,
    data_axis,
    insert,
    shape_dims,
    static_shape,
    tuple_type,
    wide,
    without,
)
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, same_dtype, tensor_args
from kiln.relay.op._rows import ROWS, add, flat, row_count, row_reduce, schedule_rows, unflat
from kiln.relay.op._schedule import KEEP, vector_lanes
from kiln.relay.op.cuda_reduce import ROW_REDUCE, schedule_rows_cuda
from kiln.relay.op.nn_grad import batch_norm_grad, layer_norm_grad
from kiln.tir.expr import PrimExpr

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
    axis = data_axis(axis_attr, data.ndim)
    for i, (name, t) in enumerate(zip(names, tensors[1:], strict=True), start=1):
        check_vector(t, data.shape[axis], i, name, data, axis)
    same_dtype([t.dtype for t in tensors], None)
    return data, data.shape[axis]


def _batch_norm_rel(arg_types: list[Type], attrs: BatchNormAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, c = _norm_params(tensors, attrs.axis, _BN_PARAMS)
    vec = TensorType((c,), data.dtype)
    return tuple_type(data, vec, vec)


def _batch_norm_ref(
    attrs: BatchNormAttrs, x: Array, gamma: Array, beta: Array, mean: Array, var: Array
) -> tuple[Array, Array, Array]:
    axis, nd = attrs.axis % x.ndim, x.ndim
    out = (x - along(mean, axis, nd)) / np.sqrt(along(var, axis, nd) + attrs.epsilon)
    if attrs.scale:
        out = out * along(gamma, axis, nd)
    if attrs.center:
        out = out + along(beta, axis, nd)
    return out.astype(x.dtype), mean.copy(), var.copy()


def _scale_shift(out: PrimExpr, c: PrimExpr, gamma: te.Tensor, beta: te.Tensor,
                 attrs: BatchNormAttrs | LayerNormAttrs) -> PrimExpr:
    """out * gamma[c] + beta[c], each part as the scale and center attrs ask."""
    if attrs.scale:
        out = out * gamma[c]
    if attrs.center:
        out = out + beta[c]
    return out


def _batch_norm_compute(attrs: BatchNormAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, gamma, beta, mean, var = inputs
    axis = attrs.axis % x.ndim
    eps = te.const(attrs.epsilon, x.dtype)

    def normalize(*i: PrimExpr) -> PrimExpr:
        c = i[axis]
        return _scale_shift((x[i] - mean[c]) / te.sqrt(var[c] + eps), c, gamma, beta, attrs)

    return [
        te.compute(x.shape, normalize, name="batch_norm"),
        te.compute(mean.shape, lambda c: mean[c], name="batch_norm_mean"),
        te.compute(var.shape, lambda c: var[c], name="batch_norm_var"),
    ]


(register_op("nn.batch_norm")
    .describe("(x - mean) / sqrt(var + eps) * gamma + beta per channel; returns (out, mean, var)")
    .add_argument("data", "Tensor", "the input")
    .add_argument("gamma", "Tensor", "scale per channel: (C,)")
    .add_argument("beta", "Tensor", "shift per channel: (C,)")
    .add_argument("moving_mean", "Tensor", "running mean per channel: (C,)")
    .add_argument("moving_var", "Tensor", "running variance per channel: (C,)")
    .set_attrs_type(BatchNormAttrs)
    .add_type_rel("BatchNorm", _batch_norm_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _batch_norm_ref)
    .set_attr(attr.FCompute, _batch_norm_compute)
    .set_attr(attr.FPrimalGradient, batch_norm_grad))


@constructor("nn.batch_norm")
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
    axis, nd, dtype = attrs.axis % x.ndim, x.ndim, x.dtype
    x, gamma, beta = wide(x), wide(gamma), wide(beta)
    mean = np.mean(x, axis=axis, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axis, keepdims=True)
    out = (x - mean) / np.sqrt(var + attrs.epsilon)
    if attrs.scale:
        out = out * along(gamma, axis, nd)
    if attrs.center:
        out = out + along(beta, axis, nd)
    return np.asarray(out).astype(dtype)


def _layer_norm_compute(attrs: LayerNormAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Two reductions along the axis (the sum, then the sum of squared deviations), then the normalization."""
    x, gamma, beta = inputs
    shape = shape_dims(out_type)  # symbolic dims too, the normalized axis included
    axis = attrs.axis % len(shape)
    rows = without(shape, axis)
    size = shape[axis]
    n = te.const(size, x.dtype) if isinstance(size, int) else te.cast(te.as_index(size), x.dtype)
    eps = te.const(attrs.epsilon, x.dtype)
    k = te.reduce_axis((0, te.as_index(shape[axis])), name="k")
    total = te.compute(rows, lambda *j: te.sum(x[insert(j, axis, k)], axis=k), name="layer_norm_sum")
    k2 = te.reduce_axis((0, te.as_index(shape[axis])), name="k2")

    def squares(*j: PrimExpr) -> PrimExpr:
        d = x[insert(j, axis, k2)] - total[j] / n
        return te.sum(d * d, axis=k2)

    sq = te.compute(rows, squares, name="layer_norm_sq")

    def normalize(*i: PrimExpr) -> PrimExpr:
        j = without(i, axis)
        out = (x[i] - total[j] / n) / te.sqrt(sq[j] / n + eps)
        return _scale_shift(out, i[axis], gamma, beta, attrs)

    return [te.compute(shape, normalize, name="layer_norm")]


def _layer_norm_rows_compute(attrs: LayerNormAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Layer norm along the last axis, built for `schedule_rows` (one row at a time, rows on the cores).

    Per row: the sum (the mean), then the sum of squared deviations from that mean (two passes, as the
    reference: E[x^2] - E[x]^2 would cancel for rows far from zero), both vectorized with partial
    results per lane (`row_reduce`); then 1 / sqrt(var + eps) once; then (x - mean) * that * gamma +
    beta, vectorized. The row is read three times, from the cache after the first. float16 computes in
    float32 and rounds once at the end. Symbolic leading dims (a batch, a sequence) make a symbolic number
    of rows. Another axis, an empty tensor or a symbolic row length gets the generic compute.
    """
    x, gamma, beta = inputs
    shape = shape_dims(out_type)
    *dims, n = shape
    if attrs.axis % len(shape) != len(shape) - 1 or 0 in shape or not isinstance(n, int):
        return _layer_norm_compute(attrs, inputs, out_type)
    rows = (row_count(dims),)
    acc, dtype = accumulator(x.dtype), x.dtype
    lanes = vector_lanes(acc)
    count = te.const(n, acc)

    def at(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
        index = (*unflat(j[0], dims), k)
        return te.cast(x[index], acc)

    def squared_deviation(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
        d = at(j, k) - mean[j]
        return d * d

    total = row_reduce(add, 0.0, rows, n, lanes, at, "layer_norm_sum")
    mean = te.compute(rows, lambda r: total[r] / count, name="layer_norm_mean", attrs={KEEP: True})
    squares = row_reduce(add, 0.0, rows, n, lanes, squared_deviation, "layer_norm_sq")
    # one division a row; the product below is within an ulp or two of the reference's quotient
    inv_std = te.compute(rows, lambda r: te.const(1, acc) / te.sqrt(squares[r] / count + te.const(attrs.epsilon, acc)),
                         name="layer_norm_inv_std", attrs={KEEP: True})

    def normalize(*i: PrimExpr) -> PrimExpr:
        r = flat(i[:-1], dims)
        out = (te.cast(x[i], acc) - mean[r]) * inv_std[r]
        if attrs.scale:
            out = out * te.cast(gamma[i[-1]], acc)
        if attrs.center:
            out = out + te.cast(beta[i[-1]], acc)
        return te.cast(out, dtype)

    return [te.compute(shape, normalize, name="layer_norm", attrs={ROWS: lanes})]


def _layer_norm_cuda_compute(attrs: LayerNormAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Layer norm along the last axis for `cuda_reduce.schedule_rows_cuda`, which spreads each row over a
    warp (or a block) and computes all of it in one kernel: per row the sum, then the sum of squared
    deviations from the mean (two passes, as the reference), each accumulated per thread and combined
    across the row's threads; then (x - mean) * (1 / sqrt(var + eps)) * gamma + beta, written by the same
    threads. The llvm rows compute's arithmetic: float16 in float32, one division and square root a row
    (the same for every element: the compiler computes them once a thread). Another axis, or an empty
    tensor, gets the generic compute.
    """
    x, gamma, beta = inputs
    shape = static_shape(out_type)
    if attrs.axis % len(shape) != len(shape) - 1 or 0 in shape:
        return _layer_norm_compute(attrs, inputs, out_type)
    *dims, n = shape
    acc, dtype = accumulator(x.dtype), x.dtype
    count = te.const(n, acc)
    k, k2 = te.reduce_axis((0, n), name="k"), te.reduce_axis((0, n), name="k2")

    def at(j: tuple[PrimExpr, ...], k: PrimExpr) -> PrimExpr:
        index = (*j, k)
        return te.cast(x[index], acc)

    total = te.compute(dims, lambda *j: te.sum(at(j, k), axis=k), name="layer_norm_sum")

    def squares(*j: PrimExpr) -> PrimExpr:
        d = at(j, k2) - total[j] / count
        return te.sum(d * d, axis=k2)

    sq = te.compute(dims, squares, name="layer_norm_sq")

    def normalize(*i: PrimExpr) -> PrimExpr:
        j = i[:-1]
        inv_std = te.const(1, acc) / te.sqrt(sq[j] / count + te.const(attrs.epsilon, acc))
        out = (te.cast(x[i], acc) - total[j] / count) * inv_std
        if attrs.scale:
            out = out * te.cast(gamma[i[-1]], acc)
        if attrs.center:
            out = out + te.cast(beta[i[-1]], acc)
        return te.cast(out, dtype)

    return [te.compute(shape, normalize, name="layer_norm", attrs={ROW_REDUCE: True})]


# COMM_REDUCE, not OPAQUE: FuseOps then fuses an elementwise producer that only the layer norm reads
# (the residual add x + attn where no dense epilogue took it) into its kernel, inlined into the reads
# of x. A reduction never fuses with its consumers, so nothing after it is recomputed per pass.
(register_op("nn.layer_norm")
    .describe("(x - mean) / sqrt(var + epsilon) * gamma + beta, statistics taken along axis")
    .add_argument("data", "Tensor", "the input")
    .add_argument("gamma", "Tensor", "scale, (data.shape[axis],)")
    .add_argument("beta", "Tensor", "shift, (data.shape[axis],)")
    .set_attrs_type(LayerNormAttrs)
    .add_type_rel("LayerNorm", _layer_norm_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.COMM_REDUCE)
    .set_attr(attr.FReference, _layer_norm_ref)
    .set_attr(attr.FCompute, _layer_norm_compute)
    .set_attr(attr.FPrimalGradient, layer_norm_grad)
    .add_implementation("rows", _layer_norm_rows_compute, schedule_rows, target="llvm",
                        dtypes=FLOAT_DTYPES, priority=10)
    .add_implementation("rows", _layer_norm_cuda_compute, schedule_rows_cuda, target="cuda",
                        dtypes=FLOAT_DTYPES, priority=10))


@constructor("nn.layer_norm")
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
