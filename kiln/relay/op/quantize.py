"""Quantized ops, `qnn.*`: quantize, dequantize and the integer products.

Each op is declared in one `register_op` chain (description, arguments, attrs, relation, pattern, numpy
reference and te compute) after the functions it names; its constructor follows (`@constructor`).

A scale and its zero point have one shape, which decides the granularity (ONNX's rules): a scalar or a single
element quantizes the whole tensor, a 1-D tensor one slice per index of `axis`, and a tensor of the data's
rank blocks of `block_size` along `axis`. Quantize and dequantize are elementwise computes (they fuse with
their neighbours); scale and zero point are read at the index that granularity gives, never materialized.

qnn.matmul_integer and qnn.conv_integer accumulate `(x - x_zero_point) * (w - w_zero_point)` in int32,
the operands widened inside the reduction (the conv's input first copied, less its zero point, into a
padded int16 tensor); on llvm, register tiles of int32 sums vectorized along the output's last axis
(`_schedule_integer_product`). On llvm with AVX-512 VNNI, uint8 x int8 matmul_integer becomes
qnn.matmul_vnni: b in vpdpbusd's words (packed at build time when constant), 64 byte products per
instruction (`codegen.llvm_x86`), the zero points subtracted after through row and column sums.
None of them has a gradient (`NO_GRADIENT`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, int_range, int_tuple, to_int_tuple
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Constant, Expr, call
from kiln.relay.op import reduce
from kiln.relay.op._nn_util import Array, clamp, differ, dtype_of, static_shape, tensor_shape
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, broadcast_shapes, normalize_axis, tensor_args
from kiln.relay.op._schedule import (
    KEEP,
    divisor_at_most,
    op_attr,
    reduce_extent,
    schedule_injective_stage,
    split_epilogue,
    static_size,
    vector_lanes,
    worth_parallel,
)
from kiln.relay.op.conv import dtype_or_none, optional_dtype
from kiln.relay.op.nn import pad as nn_pad
from kiln.relay.op.shape import reshape, transpose
from kiln.relay.op.tensor import cast, multiply, reinterpret
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

QUANT_DTYPES = ("int8", "uint8", "int16", "uint16")  # what quantize produces (saturating to the dtype's range)
INTEGER_DTYPES = (*QUANT_DTYPES, "int32")  # what dequantize reads
PRODUCT_DTYPES = ("int8", "uint8")  # the operands of the integer products
NO_GRADIENT = "quantized integers carry no gradient: train in float, then quantize (or fake-quantize in float)"


# --- the granularity of a scale / zero point ------------------------------------------------------


def _single(shape: Sequence[Dim]) -> bool:
    return all(d == 1 for d in shape)


def check_granularity(data: TensorType, param: TensorType, axis: int, block_size: int, arg: int,
                      what: str = "scale") -> None:
    """RelationError (blaming `arg`) unless `param` is a per-tensor, per-axis or blocked scale of `data`."""
    if _single(param.shape):
        return
    ax = normalize_axis(axis, data.ndim) if data.ndim else axis
    if data.ndim == 0:
        raise RelationError(f"a scalar input takes a scalar {what}, found {param}", arg=arg)
    if block_size == 0:
        if param.ndim != 1 or differ(param.shape[0], data.shape[ax]):
            raise RelationError(
                f"the {what} {param} must be a scalar, or 1-D of length {data.shape[ax]} (dim {ax} of {data}, "
                "the quantization axis) for per-axis quantization, or of rank "
                f"{data.ndim} with block_size > 0", arg=arg)
        return
    if param.ndim != data.ndim:
        raise RelationError(f"blocked quantization (block_size {block_size}) needs a {what} of rank {data.ndim} "
                            f"like the input {data}, found {param}", arg=arg)
    want: list[Dim] = [-(-d // block_size) if isinstance(d, int) and j == ax else d for j, d in enumerate(data.shape)]
    if any(differ(p, d) for p, d in zip(param.shape, want, strict=True)):
        shown = ", ".join(map(str, want))
        raise RelationError(f"blocked quantization (axis {ax}, block_size {block_size}) of {data} needs a {what} "
                            f"of shape ({shown}), found {param}", arg=arg)


def param_index(param: te.Tensor, index: Sequence[PrimExpr], axis: int, block_size: int) -> tuple[PrimExpr, ...]:
    """The element of scale / zero point `param` that output element `index` reads."""
    shape = tensor_shape(param)
    if math.prod(shape) == 1:
        return tuple(te.const(0) for _ in shape)
    ax = axis % len(index)
    if block_size == 0:
        return (index[ax],)
    return tuple(i // block_size if j == ax else i for j, i in enumerate(index))


def expand_param(value: Array, shape: Sequence[int], axis: int, block_size: int) -> Array:
    """`value` (a scale or zero point) broadcast against data of `shape`, for the numpy references."""
    if value.size == 1:
        return value.reshape(())
    ax = axis % len(shape)
    if block_size == 0:
        dims = [1] * len(shape)
        dims[ax] = value.size
        return value.reshape(dims)
    return np.repeat(value, block_size, axis=ax).take(range(shape[ax]), axis=ax)


# --- qnn.quantize -----------------------------------------------------------------------------------


@attrs.frozen
class QuantizeAttrs(Attrs):
    """Attributes of qnn.quantize and qnn.dequantize."""

    axis: int = attrs.field(default=1, validator=int_range(), metadata={"doc": "the quantization axis"})
    block_size: int = attrs.field(default=0, validator=int_range(0), metadata={
        "doc": "elements per block along axis (blocked quantization); 0: per-tensor or per-axis"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={
            "doc": "quantize: the dtype of x / scale (None: numpy's promotion of data and scale); "
                   "dequantize: the output dtype (None: scale's)"})


def _quant_types(arg_types: list[Type], attrs: QuantizeAttrs, data_dtypes: Sequence[str]) -> list[TensorType] | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, scale, zero = tensors
    if str(data.dtype) not in data_dtypes:
        raise RelationError(f"expected data of dtype {', '.join(data_dtypes)}, found {data.dtype}", arg=0)
    if not scale.dtype.is_float:
        raise RelationError(f"expected a floating-point scale, found dtype {scale.dtype}", arg=1)
    if str(zero.dtype) not in INTEGER_DTYPES:
        raise RelationError(f"expected a zero point of dtype {', '.join(INTEGER_DTYPES)}, found {zero.dtype}", arg=2)
    if zero.ndim != scale.ndim or any(differ(a, b) for a, b in zip(zero.shape, scale.shape, strict=True)):
        raise RelationError(f"the zero point {zero} must have the shape of the scale {scale}", arg=2)
    check_granularity(data, scale, attrs.axis, attrs.block_size, 1)
    return tensors


def _quantize_rel(arg_types: list[Type], attrs: QuantizeAttrs) -> Type | None:
    tensors = _quant_types(arg_types, attrs, ("float16", "float32", "float64", "int32"))
    if tensors is None:
        return None
    data, _, zero = tensors
    if str(zero.dtype) not in QUANT_DTYPES:
        raise RelationError(f"the zero point decides the output dtype, one of {', '.join(QUANT_DTYPES)}; "
                            f"found {zero.dtype}", arg=2)
    if attrs.out_dtype is not None and not attrs.out_dtype.is_float:
        raise RelationError(f"attribute out_dtype (the dtype of x / scale) must be a float dtype, "
                            f"found {attrs.out_dtype}")
    return TensorType(data.shape, zero.dtype)


def _division_dtype(attrs: QuantizeAttrs, data: str, scale: str) -> str:
    if attrs.out_dtype is not None:
        return str(attrs.out_dtype)
    return str(np.result_type(np.dtype(data), np.dtype(scale)).name)


def _quantize_ref(attrs: QuantizeAttrs, x: Array, scale: Array, zero: Array) -> Array:
    dt = _division_dtype(attrs, x.dtype.name, scale.dtype.name)
    s = expand_param(scale, x.shape, attrs.axis, attrs.block_size).astype(dt)
    z = expand_param(zero, x.shape, attrs.axis, attrs.block_size).astype(np.float64)
    info = np.iinfo(zero.dtype)
    with np.errstate(all="ignore"):
        y = np.rint(x.astype(dt) / s).astype(np.float64) + z
    return np.asarray(np.clip(np.nan_to_num(y, nan=0.0), info.min, info.max).astype(zero.dtype))


def _quantize_compute(attrs: QuantizeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, scale, zero = inputs
    out = dtype_of(out_type)
    dt = _division_dtype(attrs, data.dtype, scale.dtype)
    # the rounded quotient plus the zero point in float64: exact (|zp| < 2**16), and the clamp below is
    # the saturation, so no intermediate integer can overflow
    info = np.iinfo(out)

    def element(*i: PrimExpr) -> PrimExpr:
        s = scale[param_index(scale, i, attrs.axis, attrs.block_size)]
        if dt == "float16":
            # float16 arithmetic runs in float32 registers, unrounded: the quotient is rounded to float16
            # by the cast, as numpy's float16 division rounds it (float32 holds it exactly enough to round once)
            q = te.round(te.cast(te.cast(data[i], "float32") / te.cast(s, "float32"), "float16"))
        else:
            q = te.round(te.cast(data[i], dt) / te.cast(s, dt))
        y = te.cast(q, "float64") + te.cast(zero[param_index(zero, i, attrs.axis, attrs.block_size)], "float64")
        y = tx.min_(tx.max_(y, tx.const(float(info.min), "float64")), tx.const(float(info.max), "float64"))
        return te.cast(y, out)  # the cast saturates and maps NaN to 0, as the reference

    return [te.compute(static_shape(out_type), element, name="T_quantize")]


(register_op("qnn.quantize")
    .describe("saturate(round_half_even(data / scale) + zero_point), in zero_point's dtype")
    .add_argument("data", "Tensor", "the values to quantize (float, or int32)")
    .add_argument("scale", "Tensor", "the scale: scalar, per-axis (1-D) or blocked (data's rank)")
    .add_argument("zero_point", "Tensor", "the zero point, the shape of scale; its dtype is the output's")
    .set_attrs_type(QuantizeAttrs)
    .add_type_rel("Quantize", _quantize_rel)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, _quantize_ref)
    .set_attr(attr.FCompute, _quantize_compute)
    .set_attr(attr.TNonDifferentiable, NO_GRADIENT))


@constructor("qnn.quantize")
def quantize(data: Expr, scale: Expr, zero_point: Expr, axis: int = 1, block_size: int = 0,
             out_dtype: Any = None) -> Call:
    """data quantized to zero_point's dtype: saturate(round(data / scale) + zero_point).

    Args:
        data: the values (float, or int32).
        scale: a scalar, a 1-D tensor along `axis`, or blocks of `block_size` along `axis`.
        zero_point: the shape of `scale`; int8, uint8, int16 or uint16.
        axis: the quantization axis of a per-axis or blocked scale.
        block_size: the block length of a blocked scale (0: not blocked).
        out_dtype: the float dtype of the division (None: numpy's promotion of data's and scale's).

    Returns:
        The call, of data's shape and zero_point's dtype.
    """
    return call("qnn.quantize", [data, scale, zero_point],
                QuantizeAttrs.make("qnn.quantize", axis=axis, block_size=block_size, out_dtype=out_dtype))


# --- qnn.dequantize ---------------------------------------------------------------------------------


def _dequantize_rel(arg_types: list[Type], attrs: QuantizeAttrs) -> Type | None:
    tensors = _quant_types(arg_types, attrs, INTEGER_DTYPES)
    if tensors is None:
        return None
    data, scale, zero = tensors
    if zero.dtype != data.dtype:
        raise RelationError(f"expected a zero point of dtype {data.dtype} (data's), found {zero.dtype}", arg=2)
    out = attrs.out_dtype or scale.dtype
    if not out.is_float:
        raise RelationError(f"attribute out_dtype must be a float dtype, found {out}")
    return TensorType(data.shape, out)


def _product_dtype(scale: str) -> str:
    """(x - zero_point) * scale is computed in float32, or float64 for a float64 scale (as the reference)."""
    return str(np.result_type(np.float32, np.dtype(scale)).name)


def _dequantize_ref(attrs: QuantizeAttrs, x: Array, scale: Array, zero: Array) -> Array:
    dt = _product_dtype(scale.dtype.name)
    s = expand_param(scale, x.shape, attrs.axis, attrs.block_size).astype(dt)
    z = expand_param(zero, x.shape, attrs.axis, attrs.block_size).astype(dt)
    out = attrs.out_dtype.numpy() if attrs.out_dtype else scale.dtype
    return np.asarray(((x.astype(dt) - z) * s).astype(out))


def _dequantize_compute(attrs: QuantizeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, scale, zero = inputs
    dt = _product_dtype(scale.dtype)

    def element(*i: PrimExpr) -> PrimExpr:
        z = te.cast(zero[param_index(zero, i, attrs.axis, attrs.block_size)], dt)
        s = te.cast(scale[param_index(scale, i, attrs.axis, attrs.block_size)], dt)
        return te.cast((te.cast(data[i], dt) - z) * s, dtype_of(out_type))

    return [te.compute(static_shape(out_type), element, name="T_dequantize")]


(register_op("qnn.dequantize")
    .describe("(data - zero_point) * scale, in scale's dtype or out_dtype")
    .add_argument("data", "Tensor", "the quantized values (int8, uint8, int16, uint16, int32)")
    .add_argument("scale", "Tensor", "the scale: scalar, per-axis (1-D) or blocked (data's rank)")
    .add_argument("zero_point", "Tensor", "the zero point, the shape of scale and data's dtype")
    .set_attrs_type(QuantizeAttrs)
    .add_type_rel("Dequantize", _dequantize_rel)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, _dequantize_ref)
    .set_attr(attr.FCompute, _dequantize_compute)
    .set_attr(attr.TNonDifferentiable, NO_GRADIENT))


@constructor("qnn.dequantize")
def dequantize(data: Expr, scale: Expr, zero_point: Expr, axis: int = 1, block_size: int = 0,
               out_dtype: Any = None) -> Call:
    """(data - zero_point) * scale.

    Args:
        data: the quantized values.
        scale: a scalar, a 1-D tensor along `axis`, or blocks of `block_size` along `axis`.
        zero_point: the shape of `scale`, data's dtype.
        axis: the quantization axis of a per-axis or blocked scale.
        block_size: the block length of a blocked scale (0: not blocked).
        out_dtype: the output's float dtype (None: scale's).

    Returns:
        The call, of data's shape.
    """
    return call("qnn.dequantize", [data, scale, zero_point],
                QuantizeAttrs.make("qnn.dequantize", axis=axis, block_size=block_size, out_dtype=out_dtype))


# --- qnn.matmul_integer -----------------------------------------------------------------------------


def _product_operand(t: TensorType, arg: int) -> None:
    if str(t.dtype) not in PRODUCT_DTYPES:
        raise RelationError(f"expected int8 or uint8, found dtype {t.dtype}", arg=arg)


def _vector_zero_point(zero: TensorType, data: TensorType, length: Dim, what: str, arg: int) -> None:
    if zero.dtype != data.dtype:
        raise RelationError(f"expected a zero point of dtype {data.dtype} (its operand's), found {zero.dtype}",
                            arg=arg)
    if not _single(zero.shape) and (zero.ndim != 1 or differ(zero.shape[0], length)):
        raise RelationError(f"the zero point {zero} must be a scalar or 1-D of length {length} ({what})", arg=arg)


def _matmul_integer_rel(arg_types: list[Type], attrs: Any) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    a, b, za, zb = tensors
    for i, t in enumerate((a, b)):
        _product_operand(t, i)
        if t.ndim < 2:
            raise RelationError(f"expected a tensor of rank >= 2 (a matrix or a batch of them), found {t}", arg=i)
    if differ(a.shape[-1], b.shape[-2]):
        raise RelationError(f"the reduction dims differ: {a} has K={a.shape[-1]} (dim -1) but {b} has "
                            f"K={b.shape[-2]} (dim -2)", arg=1)
    _vector_zero_point(za, a, a.shape[-2], "one per row of a", 2)
    _vector_zero_point(zb, b, b.shape[-1], "one per column of b", 3)
    try:
        batch = broadcast_shapes([a.shape[:-2], b.shape[:-2]])
    except RelationError as err:
        raise RelationError(f"the batch dims of {a} and {b} do not broadcast: {err}", arg=1) from None
    return TensorType((*batch, a.shape[-2], b.shape[-1]), "int32")


def _matmul_integer_ref(attrs: Any, a: Array, b: Array, za: Array, zb: Array) -> Array:
    za32 = za.astype(np.int32).reshape(-1, 1) if za.size > 1 else za.astype(np.int32).reshape(())
    zb32 = zb.astype(np.int32).reshape(-1) if zb.size > 1 else zb.astype(np.int32).reshape(())
    return np.asarray(np.matmul(a.astype(np.int32) - za32, b.astype(np.int32) - zb32).astype(np.int32))


def _batch_index(batch: Sequence[PrimExpr], shape: Sequence[int]) -> tuple[PrimExpr, ...]:
    own = batch[len(batch) - len(shape):]
    return tuple(te.const(0) if d == 1 else i for i, d in zip(own, shape, strict=True))


def _vector_at(zero: te.Tensor, i: PrimExpr) -> PrimExpr:
    shape = tensor_shape(zero)
    index = tuple(te.const(0) for _ in shape) if math.prod(shape) == 1 else (i,)
    return te.cast(zero[index], "int32")


def _matmul_integer_compute(attrs: Any, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """out[..., m, n] = sum over k of (a[..., m, k] - za[m]) * (b[..., k, n] - zb[n]), in int32."""
    a, b, za, zb = inputs
    a_shape, b_shape = tensor_shape(a), tensor_shape(b)
    shape = static_shape(out_type)
    k = te.reduce_axis((0, a_shape[-1]), name="k")
    nb = len(shape) - 2

    def product(*i: PrimExpr) -> PrimExpr:
        batch, m, n = i[:nb], i[nb], i[nb + 1]
        ai = (*_batch_index(batch, a_shape[:-2]), m, k)
        bi = (*_batch_index(batch, b_shape[:-2]), k, n)
        x = te.cast(a[ai], "int32") - _vector_at(za, m)
        y = te.cast(b[bi], "int32") - _vector_at(zb, n)
        return te.sum(x * y, axis=k)

    return [te.compute(shape, product, name="matmul_integer")]


def _schedule_integer_product(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                               target: Any) -> None:
    """Register tiles of int32 sums: `rows` along the output axis the op names, vectors along the last axis.

    Each tile (up to 4 rows by 32 columns, sizes that divide the axes: no tails) is accumulated
    in a local tile with the reduction outermost, its rows unrolled and its columns vectorized:
    per reduction step a row loads one scalar (a's element, or a weight), the columns one vector
    (b's row, or the input's row), which every row of the tile reuses. matmul_integer's rows are
    M; conv_integer's are the output channels (its columns the output's last spatial dim).
    """
    (c,) = anchor_outs
    for pad in op_attr(c, "pads") or ():
        stage = sch[pad]
        *rows, col = stage.op.axis
        row = stage.fuse(*rows)
        if worth_parallel(static_size(pad)):
            stage.parallel(row)
        stage.vectorize(col)
    shape = tensor_shape(c)
    row_axis = len(shape) - 2 if op_attr(c, "rows") is None else int(op_attr(c, "rows"))
    bm = divisor_at_most(shape[row_axis], 4)
    bn = divisor_at_most(shape[-1], 2 * vector_lanes("int32"))
    tiled, comp = split_epilogue(sch, c, outs, cache=True)
    stage = sch[tiled]
    axes = list(stage.op.axis)
    ro, ri = stage.split(axes[row_axis], factor=bm)
    co, ci = stage.split(axes[-1], factor=bn)
    outer = [*axes[:row_axis], ro, *axes[row_axis + 1:-1], co]
    stage.reorder(*outer, ri, ci)
    if worth_parallel(math.prod(shape) * reduce_extent(c)):
        stage.parallel(stage.fuse(*outer[:-1]) if len(outer) > 2 else outer[0])
    if bn >= 4:
        stage.vectorize(ci)
    inner = sch[comp]
    inner.compute_at(stage, co)
    tile = list(inner.op.axis)
    inner.reorder(*inner.op.reduce_axis, tile[row_axis], tile[-1])
    inner.unroll(tile[row_axis])
    if bn >= 4:
        inner.vectorize(tile[-1])


def _matmul_integer_alter_llvm(attrs: Any, args: list[Expr], arg_types: list[Type], target: Any) -> Expr | None:
    """On llvm with AVX-512 VNNI, static uint8 a times a static int8 matrix b is qnn.matmul_vnni (below) of b
    packed (`vnni_packed`, computed at build time when b is a constant): 64 products per vpdpbusd."""
    a, b = arg_types[:2]
    mattr = target.get("mattr") or ()
    if not ("+avx512f" in mattr and "+avx512vnni" in mattr and isinstance(a, TensorType)
            and isinstance(b, TensorType) and str(a.dtype) == "uint8" and str(b.dtype) == "int8" and b.ndim == 2
            and all(isinstance(d, int) for d in (*a.shape, *b.shape))):
        return None
    k, n = b.concrete_shape
    return matmul_vnni(args[0], vnni_packed(args[1], k, n), args[2], args[3], units=n)


(register_op("qnn.matmul_integer")
    .describe("(a - a_zero_point) @ (b - b_zero_point) accumulated in int32; batch dims broadcast")
    .add_argument("a", "Tensor", "int8 / uint8, (..., M, K)")
    .add_argument("b", "Tensor", "int8 / uint8, (..., K, N)")
    .add_argument("a_zero_point", "Tensor", "a's dtype: a scalar, or (M,) one per row")
    .add_argument("b_zero_point", "Tensor", "b's dtype: a scalar, or (N,) one per column")
    .add_type_rel("MatmulInteger", _matmul_integer_rel)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _matmul_integer_ref)
    .set_attr(attr.FCompute, _matmul_integer_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_integer_product)
    .set_attr(attr.FAlterOpLayout["llvm"], _matmul_integer_alter_llvm)
    .set_attr(attr.TNonDifferentiable, NO_GRADIENT))


@constructor("qnn.matmul_integer")
def matmul_integer(a: Expr, b: Expr, a_zero_point: Expr, b_zero_point: Expr) -> Call:
    """The int32 product (a - a_zero_point) @ (b - b_zero_point).

    Args:
        a: int8 or uint8, (..., M, K).
        b: int8 or uint8, (..., K, N).
        a_zero_point: a's dtype, a scalar or (M,).
        b_zero_point: b's dtype, a scalar or (N,).

    Returns:
        The call, int32 of shape (..., M, N) (batch dims broadcast).
    """
    return call("qnn.matmul_integer", [a, b, a_zero_point, b_zero_point])


# --- qnn.matmul_integer on AVX-512 VNNI: qnn.matmul_vnni ------------------------------------------

VNNI_LANES = 16  # the int32 lanes of a vpdpbusd; each sums the products of 4 consecutive k


def _word(byte: Any) -> PrimExpr:
    """int32 of the four bytes `byte(j)` (int64 in [0, 256)), byte j at bits 8j: dot4_u8i8's operand."""
    return te.cast(sum((byte(j) * (1 << 8 * j) for j in range(1, 4)), byte(0)), "int32")  # wraps, as the bits


def vnni_packed(b: Expr, k: int, n: int) -> Expr:
    """int8 `b` (K, N) as the words that qnn.matmul_vnni reads: int32 (ceil(N/16), ceil(K/4), 16), byte j
    of word [c, q, l] b[4q + j, 16c + l] (zero past K and N). Made of existing ops, which FoldConstant
    computes at build time when b is a constant."""
    k4, nb = -(-k // 4), -(-n // VNNI_LANES)
    x = nn_pad(cast(reinterpret(b, "uint8"), "int64"), ((0, 4 * k4 - k), (0, VNNI_LANES * nb - n)),
               Constant(np.array(0, np.int64)))
    x = transpose(reshape(x, (k4, 4, nb, VNNI_LANES)), (2, 0, 3, 1))  # (N/16, K/4, 16, 4)
    bits = Constant(np.array([1, 1 << 8, 1 << 16, 1 << 24], np.int64))
    return cast(reduce.sum(multiply(x, bits), axis=-1), "int32")  # the cast wraps: the word's bits


@attrs.frozen
class MatmulVnniAttrs(Attrs):
    """Attributes of qnn.matmul_vnni."""

    units: int = attrs.field(default=1, validator=int_range(1), metadata={
        "doc": "N, the columns of b (its packed form rounds them up to 16)"})


def _matmul_vnni_rel(arg_types: list[Type], attrs: MatmulVnniAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    a, bp, za, zb = tensors
    if str(a.dtype) != "uint8" or a.ndim < 2 or not all(isinstance(d, int) for d in a.shape):
        raise RelationError(f"expected a static uint8 tensor (..., M, K), found {a}", arg=0)
    k, n = a.concrete_shape[-1], attrs.units
    want = (-(-n // VNNI_LANES), -(-k // 4), VNNI_LANES)
    if str(bp.dtype) != "int32" or bp.shape != want:
        raise RelationError(f"expected b packed by vnni_packed, int32 {want} (K={k}, N={n}), found {bp}", arg=1)
    _vector_zero_point(za, a, a.shape[-2], "one per row of a", 2)
    if str(zb.dtype) != "int8" or not (_single(zb.shape) or zb.shape == (n,)):
        raise RelationError(f"expected an int8 zero point, a scalar or ({n},), found {zb}", arg=3)
    return TensorType((*a.shape[:-1], n), "int32")


def _matmul_vnni_ref(attrs: MatmulVnniAttrs, a: Array, bp: Array, za: Array, zb: Array) -> Array:
    nb, k4, _ = bp.shape
    b = bp.view(np.int8).reshape(nb, k4, VNNI_LANES, 4).transpose(1, 3, 0, 2).reshape(4 * k4, -1)
    return _matmul_integer_ref(attrs, a, b[:a.shape[-1], :attrs.units], za, zb)


def _matmul_vnni_compute(attrs: MatmulVnniAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """sum (a - za)(b - zb) = sum a.b - zb * (row sum of a) - za * (column sum of b) + K za zb: the sums of
    a.b are whole dot4_u8i8 words (K padded with zeros), one vpdpbusd per 16 columns and 4 k."""
    a, bp, za, zb = inputs
    *batch, m, k = tensor_shape(a)
    nb, k4, _ = tensor_shape(bp)
    keep = {KEEP: True}

    def a_word(*i: PrimExpr) -> PrimExpr:
        def byte(j: int) -> PrimExpr:
            col = i[-1] * 4 + j
            at = (*i[:-1], clamp(col, k) if k % 4 else col)  # K padded with zeros to whole words
            value = te.cast(a[at], "int64")
            return te.if_then_else(col < k, value, te.const(0, "int64")) if k % 4 else value

        return _word(byte)

    words = te.compute((*batch, m, k4), a_word, name="vnni_a_words", attrs=keep)
    ones = te.const(0x01010101, "int32")  # dot4_u8i8 with it sums the other operand's 4 bytes
    r = [te.reduce_axis((0, k4), name=f"k4_{j}") for j in range(3)]

    def dot(*i: PrimExpr) -> PrimExpr:
        row = (*i[:-2], r[0])
        return te.sum(tx.call("dot4_u8i8", words[row], bp[i[-2], r[0], i[-1]]), axis=r[0])

    def row_sum(*i: PrimExpr) -> PrimExpr:
        row = (*i, r[2])
        return te.sum(tx.call("dot4_u8i8", words[row], ones), axis=r[2])

    sums = te.compute((*batch, m, nb, VNNI_LANES), dot, name="vnni_sums", attrs=keep)
    col_sums = te.compute((nb, VNNI_LANES), lambda j, lane: te.sum(
        tx.call("dot4_u8i8", ones, bp[j, r[1], lane]), axis=r[1]), name="vnni_column_sums", attrs=keep)
    row_sums = te.compute((*batch, m), row_sum, name="vnni_row_sums", attrs=keep)

    def out(*i: PrimExpr) -> PrimExpr:
        row, col = i[-2:]
        zr, zc = _vector_at(za, row), _vector_at(zb, col)
        j, lane = col // VNNI_LANES, col % VNNI_LANES
        at = (*i[:-1], j, lane)
        return sums[at] - zc * row_sums[i[:-1]] - zr * col_sums[j, lane] + zr * zc * k

    return [te.compute(static_shape(out_type), out, name="matmul_vnni",
                       attrs={"vnni": (words, sums, col_sums, row_sums)})]


def _schedule_vnni(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                   target: Any) -> None:
    """Register tiles of up to 4 rows by 4 vectors of 16 sums (16 zmm accumulators), k outermost in the
    tile, its lanes one vpdpbusd (`codegen.llvm_x86`); the tiles of a column panel (64 columns of b,
    reused from cache) are consecutive, the panels on the cores."""
    (c,) = anchor_outs
    words, sums, col_sums, _ = op_attr(c, "vnni")
    schedule_injective_stage(sch, words)
    cs = sch[col_sums]
    cs.reorder(cs.op.axis[0], *cs.op.reduce_axis, cs.op.axis[1])
    cs.vectorize(cs.op.axis[1])
    *_, m, nb, _ = tensor_shape(sums)
    stage = sch[sums]
    tile = sch.cache_write(sums, "local")
    *bat, sm, sj, lane = stage.op.axis
    jo, ji = stage.split(sj, factor=divisor_at_most(nb, 4))
    mo, mi = stage.split(sm, factor=divisor_at_most(m, 4))
    stage.reorder(*bat, jo, mo, mi, ji, lane)
    outer = stage.fuse(*bat, jo, mo)
    if worth_parallel(math.prod(tensor_shape(sums)) * reduce_extent(sums) * 4):
        stage.parallel(outer)
    stage.vectorize(lane)
    inner = sch[tile]
    inner.compute_at(stage, outer)
    *_, tm, tj, tl = inner.op.axis
    inner.reorder(*inner.op.reduce_axis, tm, tj, tl)
    inner.unroll(tm)
    inner.unroll(tj)
    inner.vectorize(tl)
    for t in outs:
        schedule_injective_stage(sch, t)


(register_op("qnn.matmul_vnni")
    .describe("qnn.matmul_integer of uint8 a and int8 b packed (vnni_packed): AVX-512 VNNI's form")
    .add_argument("a", "Tensor", "uint8, (..., M, K)")
    .add_argument("b_packed", "Tensor", "int32 (N/16, K/4, 16), vnni_packed(b) of int8 b (K, N)")
    .add_argument("a_zero_point", "Tensor", "uint8: a scalar, or (M,) one per row")
    .add_argument("b_zero_point", "Tensor", "int8: a scalar, or (N,) one per column")
    .set_attrs_type(MatmulVnniAttrs)
    .add_type_rel("MatmulVnni", _matmul_vnni_rel)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _matmul_vnni_ref)
    .set_attr(attr.FCompute, _matmul_vnni_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_vnni)
    .set_attr(attr.TNonDifferentiable, NO_GRADIENT))


@constructor("qnn.matmul_vnni")
def matmul_vnni(a: Expr, b_packed: Expr, a_zero_point: Expr, b_zero_point: Expr, units: int = 1) -> Call:
    """qnn.matmul_integer(a, b, ...) with b = the int8 matrix that `b_packed` = vnni_packed(b, K, N) holds.

    Args:
        a: uint8, (..., M, K), static.
        b_packed: int32 (ceil(N/16), ceil(K/4), 16), `vnni_packed(b, K, N)`.
        a_zero_point: uint8, a scalar or (M,).
        b_zero_point: int8, a scalar or (N,).
        units: N.

    Returns:
        The call, int32 (..., M, N).
    """
    return call("qnn.matmul_vnni", [a, b_packed, a_zero_point, b_zero_point],
                MatmulVnniAttrs.make("qnn.matmul_vnni", units=units))



# --- qnn.conv_integer -------------------------------------------------------------------------------


@attrs.frozen
class ConvIntegerAttrs(Attrs):
    """Attributes of qnn.conv_integer (1 to 3 spatial dims, NC... layout)."""

    strides: tuple[int, ...] = attrs.field(converter=to_int_tuple, validator=int_tuple(None, lo=1),
                                           metadata={"doc": "one per spatial dim"})
    padding: tuple[int, ...] = attrs.field(converter=to_int_tuple, validator=int_tuple(None, lo=0), metadata={
        "doc": "the begins of the spatial dims, then their ends"})
    dilation: tuple[int, ...] = attrs.field(converter=to_int_tuple, validator=int_tuple(None, lo=1),
                                            metadata={"doc": "one per spatial dim"})
    groups: int = attrs.field(default=1, validator=int_range(1), metadata={"doc": "channel groups"})


def _conv_integer_rel(arg_types: list[Type], attrs: ConvIntegerAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    x, w, zx, zw = tensors
    _product_operand(x, 0)
    _product_operand(w, 1)
    nd = len(attrs.strides)
    if not 1 <= nd <= 3 or len(attrs.dilation) != nd or len(attrs.padding) != 2 * nd:
        raise RelationError(f"strides {attrs.strides}, dilation {attrs.dilation} and padding {attrs.padding} "
                            "must give 1 to 3 spatial dims (padding: 2 per dim)")
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        bad, arg = (x, 0) if x.ndim != nd + 2 else (w, 1)
        raise RelationError(f"expected a tensor of rank {nd + 2} (N or O, C, {nd} spatial dims), found {bad}",
                            arg=arg)
    if isinstance(w.shape[0], int) and w.shape[0] % attrs.groups:
        raise RelationError(f"the weight's {w.shape[0]} output channels do not split into {attrs.groups} groups",
                            arg=1)
    if isinstance(w.shape[1], int) and differ(x.shape[1], w.shape[1] * attrs.groups):
        raise RelationError(f"the input {x} has {x.shape[1]} channels but the weight {w} takes "
                            f"{w.shape[1]} x {attrs.groups} groups", arg=1)
    if not _single(zx.shape) or zx.dtype != x.dtype:
        raise RelationError(f"the input's zero point must be a scalar of dtype {x.dtype}, found {zx}", arg=2)
    _vector_zero_point(zw, w, w.shape[0], "one per output channel", 3)
    spatial: list[Dim] = []
    for j in range(nd):
        k, size = w.shape[2 + j], x.shape[2 + j]
        if not isinstance(k, int) or not isinstance(size, int):
            spatial.append(size)
            continue
        reach = attrs.dilation[j] * (k - 1) + 1
        out = (size + attrs.padding[j] + attrs.padding[nd + j] - reach) // attrs.strides[j] + 1
        if out < 1:
            raise RelationError(f"spatial dim {j} of the output would be {out}: input {x}, weight {w}, "
                                f"padding {attrs.padding}, strides {attrs.strides}, dilation {attrs.dilation}",
                                arg=0)
        spatial.append(out)
    return TensorType((x.shape[0], w.shape[0], *spatial), "int32")


def _conv_integer_ref(attrs: ConvIntegerAttrs, x: Array, w: Array, zx: Array, zw: Array) -> Array:
    nd = len(attrs.strides)
    xi = x.astype(np.int64) - zx.astype(np.int64).reshape(())
    zw64 = zw.astype(np.int64).reshape((-1,) + (1,) * (nd + 1)) if zw.size > 1 else zw.astype(np.int64).reshape(())
    wi = w.astype(np.int64) - zw64
    xi = np.pad(xi, [(0, 0), (0, 0), *zip(attrs.padding[:nd], attrs.padding[nd:], strict=True)])
    n, o, og = x.shape[0], w.shape[0], w.shape[0] // attrs.groups
    cg = w.shape[1]
    kernel = w.shape[2:]
    outs = [(xi.shape[2 + j] - attrs.dilation[j] * (kernel[j] - 1) - 1) // attrs.strides[j] + 1 for j in range(nd)]
    y = np.zeros((n, o, *outs), np.int64)
    for taps in np.ndindex(*kernel):
        window = tuple(slice(t * d, t * d + s * (m - 1) + 1, s)
                       for t, d, s, m in zip(taps, attrs.dilation, attrs.strides, outs, strict=True))
        full = (slice(None), slice(None))
        patch = xi[full + window]  # (N, C, *outs)
        for g in range(attrs.groups):
            index = (slice(g * og, (g + 1) * og), slice(None), *taps)
            wg = wi[index]  # (og, cg)
            y[:, g * og:(g + 1) * og] += np.einsum("oc,nc...->no...", wg, patch[:, g * cg:(g + 1) * cg])
    return np.asarray(y.astype(np.int32))


def _conv_integer_compute(attrs: ConvIntegerAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """out[n, o, p...] = sum over c, taps of (x[n, c', p*s + t*d - pad] - zx) * (w[o, c, t...] - zw[o]), int32.

    The input less its zero point is first copied, in int16 (|x - zx| <= 255), into a padded tensor
    whose border is 0 (the padding holds the zero point): the sums then read it without guards, which
    per lane would have made every load of a vector a gather.
    """
    x, w, zx, zw = inputs
    nd = len(attrs.strides)
    x_shape, w_shape = tensor_shape(x), tensor_shape(w)
    og, cg = w_shape[0] // attrs.groups, w_shape[1]
    rc = te.reduce_axis((0, cg), name="rc")
    taps = [te.reduce_axis((0, k), name=f"r{j}") for j, k in enumerate(w_shape[2:])]
    x_zero = te.cast(zx[tuple(te.const(0) for _ in tensor_shape(zx))], "int16")
    begin, end = attrs.padding[:nd], attrs.padding[nd:]
    padded_shape = (*x_shape[:2], *(size + b + e for size, b, e in zip(x_shape[2:], begin, end, strict=True)))

    def pad(n: PrimExpr, c: PrimExpr, *p: PrimExpr) -> PrimExpr:
        conds: list[PrimExpr] = []
        coords: list[PrimExpr] = []
        for j in range(nd):
            v = p[j] - begin[j]
            size = x_shape[2 + j]
            if begin[j] or end[j]:
                conds += [v >= 0, v < size]
                v = clamp(v, size)  # a select may evaluate both sides: the load stays in bounds
            coords.append(v)
        xi = (n, c, *coords)
        value = te.cast(x[xi], "int16") - x_zero
        return te.if_then_else(tx.all_of(*conds), value, te.const(0, "int16")) if conds else value

    padded = te.compute(padded_shape, pad, name="conv_integer_input", attrs={KEEP: True})

    def product(n: PrimExpr, o: PrimExpr, *p: PrimExpr) -> PrimExpr:
        c = rc if attrs.groups == 1 else o // og * cg + rc
        coords = (p[j] * attrs.strides[j] + taps[j] * attrs.dilation[j] for j in range(nd))
        xi = (n, c, *coords)
        wi = (o, rc, *taps)
        weight = te.cast(w[wi], "int32") - _vector_at(zw, o)
        return te.sum(te.cast(padded[xi], "int32") * weight, axis=[rc, *taps])

    return [te.compute(static_shape(out_type), product, name="conv_integer", attrs={"rows": 1, "pads": (padded,)})]


(register_op("qnn.conv_integer")
    .describe("convolution of (x - x_zero_point) with (w - w_zero_point), accumulated in int32 (1-D to 3-D)")
    .add_argument("data", "Tensor", "int8 / uint8, (N, C, spatial...)")
    .add_argument("weight", "Tensor", "int8 / uint8, (O, C / groups, kernel...)")
    .add_argument("data_zero_point", "Tensor", "data's dtype, a scalar")
    .add_argument("weight_zero_point", "Tensor", "weight's dtype: a scalar, or (O,) one per output channel")
    .set_attrs_type(ConvIntegerAttrs)
    .add_type_rel("ConvInteger", _conv_integer_rel)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _conv_integer_ref)
    .set_attr(attr.FCompute, _conv_integer_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_integer_product)
    .set_attr(attr.TNonDifferentiable, NO_GRADIENT))


@constructor("qnn.conv_integer")
def conv_integer(data: Expr, weight: Expr, data_zero_point: Expr, weight_zero_point: Expr,
                 strides: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int = 1) -> Call:
    """The int32 convolution of (data - data_zero_point) with (weight - weight_zero_point).

    Args:
        data: int8 or uint8, (N, C, spatial...), 1 to 3 spatial dims.
        weight: int8 or uint8, (O, C / groups, kernel...).
        data_zero_point: a scalar of data's dtype; the padding holds it.
        weight_zero_point: weight's dtype, a scalar or (O,).
        strides: one per spatial dim.
        padding: the begins of the spatial dims, then their ends.
        dilation: one per spatial dim.
        groups: channel groups.

    Returns:
        The call, int32 (N, O, out spatial...).
    """
    return call("qnn.conv_integer", [data, weight, data_zero_point, weight_zero_point],
                ConvIntegerAttrs.make("qnn.conv_integer", strides=strides, padding=padding, dilation=dilation,
                                      groups=groups))
