"""Shape ops: reshape, transpose, squeeze, expand_dims, concatenate, stack,
broadcast_to, nn.batch_flatten, tile; and the creation ops full, zeros, ones,
zeros_like, ones_like, shape_of, arange. (split, strided_slice and take live in
`indexing.py`; they are re-exported here, where they have always been imported from.)

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
Ops that join several tensors (concatenate, stack) take ONE argument, a tuple,
as in TVM; their numpy reference receives it as a tuple of arrays; their
compute receives the tuple's tensors as its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import (
    Attrs,
    FieldError,
    bool_value,
    float_value,
    int_range,
    int_tuple,
    optional,
    to_dtype,
    to_int_tuple,
    to_opt_int_tuple,
)
from kiln.ir.dtype import DataType
from kiln.ir.types import ANY, Dim, TensorType, Type, dim_add, dim_div, dim_mul, dim_prod
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, Tuple, call, const
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import (
    RelationError,
    identity_shape,
    normalize_axis,
    same_dtype,
    shape_relation,
    tensor_args,
    tuple_of_tensors,
)
from kiln.relay.op.indexing import DATA_ARG as _DATA
from kiln.relay.op.indexing import Array, Shape, clamp, static_shape, unravel
from kiln.relay.op.indexing import SplitAttrs as SplitAttrs
from kiln.relay.op.indexing import StridedSliceAttrs as StridedSliceAttrs
from kiln.relay.op.indexing import TakeAttrs as TakeAttrs
from kiln.relay.op.indexing import check_axes as _check_axes
from kiln.relay.op.indexing import shape_str as _shape_str
from kiln.relay.op.indexing import split as split
from kiln.relay.op.indexing import strided_slice as strided_slice
from kiln.relay.op.indexing import take as take
from kiln.tir import expr as tx

_F32 = DataType.of("float32")


def _to_opt_dtype(value: Any) -> DataType | None:
    return None if value is None else DataType.of(value)


def _insert_axis(axis: int, ndim: int, op: str) -> int:
    """The position at which `op` inserts a new dim into a rank-`ndim` tensor: axis in [-ndim-1, ndim]."""
    if not -ndim - 1 <= axis <= ndim:
        raise RelationError(
            f"axis {axis} is out of range for {op} of a tensor of rank {ndim} (allowed: {-ndim - 1} to {ndim})"
        )
    return axis + ndim + 1 if axis < 0 else axis


def _merge_dim(a: Dim, b: Dim) -> Dim | None:
    """The dim two tensors must share; None when static dims differ."""
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return None
    if isinstance(a, int) or isinstance(b, int):
        return a if isinstance(a, int) else b
    return ANY


def _fields_alike(fields: list[TensorType], op: str, skip_axis: int | None = None) -> list[Dim]:
    """Checks the tuple fields share rank, dtype and dims (but `skip_axis`); returns the merged dims."""
    if not fields:
        raise RelationError(f"{op} expects a tuple of at least one tensor, found an empty tuple", arg=0)
    first = fields[0]
    dims = list(first.shape)
    for i, f in enumerate(fields[1:], start=1):
        if f.ndim != first.ndim:
            raise RelationError(f"field {i} has rank {f.ndim} but field 0 has rank {first.ndim}", arg=0)
        if f.dtype != first.dtype:
            raise RelationError(f"field {i} has dtype {f.dtype} but field 0 has dtype {first.dtype}", arg=0)
        for k, d in enumerate(f.shape):
            merged = dims[k] if k == skip_axis else _merge_dim(dims[k], d)
            if merged is None:
                along = f" (only dim {skip_axis}, the axis, may differ)" if skip_axis is not None else ""
                raise RelationError(
                    f"field {i} has shape {_shape_str(f.shape)} but field 0 has {_shape_str(first.shape)}: "
                    f"dim {k} differs{along}",
                    arg=0,
                )
            dims[k] = merged
    return dims


def _ravel(index: Sequence[tx.PrimExpr], shape: Sequence[int]) -> tx.PrimExpr:
    """The element number, in row-major order, of `index` into a tensor of `shape`."""
    flat: tx.PrimExpr = tx.const(0)
    stride = 1
    for i, d in zip(reversed(index), reversed(shape), strict=True):
        if d != 1:
            flat = flat + (i * stride if stride != 1 else i)
        stride *= d
    return flat


def _reshape_tensor(x: te.Tensor, shape: tuple[int, ...], name: str) -> te.Tensor:
    """`x`'s elements in row-major order in `shape` (the compute of reshape and its kin).

    When only dims of size 1 come and go (squeeze, expand_dims, most batch_flattens), each
    output axis reads its input axis directly; otherwise through the element number.
    """
    dims = static_shape(x)
    kept_in = [k for k, d in enumerate(dims) if d != 1]
    kept_out = [k for k, d in enumerate(shape) if d != 1]

    def direct(*i: tx.PrimExpr) -> tx.PrimExpr:
        index: list[tx.PrimExpr] = [tx.const(0)] * len(dims)
        for a, b in zip(kept_in, kept_out, strict=True):
            index[a] = i[b]
        return x[tuple(index)]

    def through_flat(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[unravel(_ravel(i, shape), dims)]

    same = [dims[k] for k in kept_in] == [shape[k] for k in kept_out]
    return te.compute(shape, direct if same else through_flat, name=name)


def _reshape_compute(attrs: Any, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    return [_reshape_tensor(inputs[0], static_shape(out_type), "reshape")]


# --- reshape, transpose, squeeze, expand_dims ----------------------------------------------


@attrs.frozen
class ReshapeAttrs(Attrs):
    """The new shape of reshape: 0 copies the input dim at that position (a size 0 with allowzero), -1 is inferred."""

    newshape: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(lo=-1), metadata={"doc": "the new shape (0: copy, -1: infer)"}
    )
    allowzero: bool = attrs.field(
        default=False, validator=bool_value,
        metadata={"doc": "a 0 in newshape is a dim of size 0 instead of a copy (ONNX's allowzero)"},
    )

    def __attrs_post_init__(self) -> None:
        if self.newshape.count(-1) > 1:
            raise FieldError("newshape", "a shape with at most one -1", self.newshape)
        if self.allowzero and 0 in self.newshape and -1 in self.newshape:
            raise FieldError("newshape", "a shape without both 0 and -1 when allowzero is true", self.newshape)


def _reshape_shape(shapes: list[Shape], attrs: ReshapeAttrs) -> Shape:
    shape, newshape = shapes[0], attrs.newshape
    out: list[Dim] = []
    for i, v in enumerate(newshape):
        if v == 0 and attrs.allowzero:
            out.append(0)
            continue
        if v == 0 and i >= len(shape):
            raise RelationError(
                f"newshape {_shape_str(newshape)} copies dim {i} (a 0 at position {i}) "
                f"but the input shape {_shape_str(shape)} has rank {len(shape)}",
                arg=0,
            )
        out.append(shape[i] if v == 0 else v)
    infer_at = newshape.index(-1) if -1 in newshape else None
    total = dim_prod(shape)
    known = dim_prod(d for i, d in enumerate(out) if i != infer_at)
    mismatch = RelationError(
        f"cannot reshape shape {_shape_str(shape)} ({total} elements) to newshape {_shape_str(newshape)} "
        f"({known} elements{' times the -1 dim' if infer_at is not None else ''})",
        arg=0,
    )
    if infer_at is not None:
        inferred = dim_div(total, known) if known != 0 else None
        if inferred is None:
            raise mismatch
        out[infer_at] = inferred
    elif isinstance(total, int) and isinstance(known, int) and total != known:
        raise mismatch
    return tuple(out)


def _reshape_ref(attrs: ReshapeAttrs, x: Array) -> Array:
    copy = not attrs.allowzero
    return np.reshape(x, [x.shape[i] if v == 0 and copy else v for i, v in enumerate(attrs.newshape)])


(register_op("reshape").describe("the elements in row-major order, in a new shape (0 copies a dim, -1 is inferred)")
    .add_argument(*_DATA).set_attrs_type(ReshapeAttrs)
    .add_type_rel("Reshape", shape_relation(_reshape_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _reshape_ref)
    .set_attr(attr.FCompute, _reshape_compute))


@constructor("reshape")
def reshape(data: Expr, newshape: int | Sequence[int], allowzero: bool = False) -> Call:
    """`data` in shape `newshape`, where a 0 copies the input dim at that position and one -1 is inferred.

    With `allowzero` a 0 is a dim of size 0 (ONNX's Reshape with allowzero=1), and no -1 may come with it.
    """
    return call("reshape", [data], ReshapeAttrs.make("reshape", newshape=newshape, allowzero=allowzero))


@attrs.frozen
class TransposeAttrs(Attrs):
    """The permutation of transpose."""

    axes: tuple[int, ...] | None = attrs.field(
        default=None, converter=to_opt_int_tuple, validator=optional(int_tuple()),
        metadata={"doc": "output dim i is input dim axes[i] (None: reverse the dims)"},
    )


def _transpose_shape(shapes: list[Shape], attrs: TransposeAttrs) -> Shape:
    shape = shapes[0]
    if attrs.axes is None:
        return shape[::-1]
    if len(attrs.axes) != len(shape):
        raise RelationError(
            f"axes {_shape_str(attrs.axes)} has {len(attrs.axes)} entries for a tensor of rank {len(shape)}", arg=0
        )
    return tuple(shape[a] for a in _check_axes(attrs.axes, len(shape)))


def _transpose_compute(attrs: TransposeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x = inputs[0]
    axes = list(range(x.ndim))[::-1] if attrs.axes is None else _check_axes(attrs.axes, x.ndim)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        index: list[tx.PrimExpr] = [tx.const(0)] * x.ndim
        for k, a in enumerate(axes):
            index[a] = i[k]
        return x[tuple(index)]

    return [te.compute(static_shape(out_type), element, name="transpose")]


(register_op("transpose").describe("permutes the dims")
    .add_argument(*_DATA).set_attrs_type(TransposeAttrs)
    .add_type_rel("Transpose", shape_relation(_transpose_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.transpose(x, attrs.axes))
    .set_attr(attr.FCompute, _transpose_compute))


@constructor("transpose")
def transpose(data: Expr, axes: Sequence[int] | None = None) -> Call:
    """`data` with its dims permuted: output dim i is input dim `axes[i]`; None reverses them."""
    return call("transpose", [data], TransposeAttrs.make("transpose", axes=axes))


@attrs.frozen
class SqueezeAttrs(Attrs):
    """The axes squeeze removes."""

    axis: tuple[int, ...] | None = attrs.field(
        default=None, converter=to_opt_int_tuple, validator=optional(int_tuple()),
        metadata={"doc": "the dims of size 1 to remove (None: every static dim of size 1)"},
    )


def _squeeze_shape(shapes: list[Shape], attrs: SqueezeAttrs) -> Shape:
    shape = shapes[0]
    if attrs.axis is None:
        return tuple(d for d in shape if d != 1)
    axes = _check_axes(attrs.axis, len(shape))
    for a in axes:
        if isinstance(shape[a], int) and shape[a] != 1:
            raise RelationError(
                f"cannot squeeze axis {a} of shape {_shape_str(shape)}: its size is {shape[a]}, not 1", arg=0
            )
    return tuple(d for i, d in enumerate(shape) if i not in axes)


(register_op("squeeze").describe("removes dims of size 1")
    .add_argument(*_DATA).set_attrs_type(SqueezeAttrs)
    .add_type_rel("Squeeze", shape_relation(_squeeze_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.squeeze(x, axis=attrs.axis))
    .set_attr(attr.FCompute, _reshape_compute))


@constructor("squeeze")
def squeeze(data: Expr, axis: int | Sequence[int] | None = None) -> Call:
    """`data` without the dims of size 1 in `axis` (None: without every dim of size 1)."""
    return call("squeeze", [data], SqueezeAttrs.make("squeeze", axis=axis))


@attrs.frozen
class ExpandDimsAttrs(Attrs):
    """Where expand_dims inserts dims of size 1, and how many."""

    axis: int = attrs.field(validator=int_range(), metadata={"doc": "the position of the first new dim"})
    num_newaxis: int = attrs.field(default=1, validator=int_range(0), metadata={"doc": "how many dims to insert"})


def _expand_dims_shape(shapes: list[Shape], attrs: ExpandDimsAttrs) -> Shape:
    shape = shapes[0]
    at = _insert_axis(attrs.axis, len(shape), "expand_dims")
    return (*shape[:at], *(1,) * attrs.num_newaxis, *shape[at:])


def _expand_dims_ref(attrs: ExpandDimsAttrs, x: Array) -> Array:
    at = attrs.axis + x.ndim + 1 if attrs.axis < 0 else attrs.axis
    return np.reshape(x, x.shape[:at] + (1,) * attrs.num_newaxis + x.shape[at:])


(register_op("expand_dims").describe("inserts num_newaxis dims of size 1 at axis")
    .add_argument(*_DATA).set_attrs_type(ExpandDimsAttrs)
    .add_type_rel("ExpandDims", shape_relation(_expand_dims_shape))
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _expand_dims_ref)
    .set_attr(attr.FCompute, _reshape_compute))


@constructor("expand_dims")
def expand_dims(data: Expr, axis: int, num_newaxis: int = 1) -> Call:
    """`data` with `num_newaxis` dims of size 1 inserted at `axis` (in [-ndim-1, ndim])."""
    return call("expand_dims", [data], ExpandDimsAttrs.make("expand_dims", axis=axis, num_newaxis=num_newaxis))


# --- concatenate, stack, split ----------------------------------------------------------


@attrs.frozen
class AxisAttrs(Attrs):
    """The axis of concatenate and stack."""

    axis: int = attrs.field(default=0, validator=int_range(), metadata={"doc": "the axis to join along"})


def _as_tuple(data: Expr | Sequence[Expr]) -> Expr:
    return data if isinstance(data, Expr) else Tuple(list(data))


def _concatenate_rel(arg_types: list[Type], attrs: AxisAttrs) -> Type | None:
    fields = tuple_of_tensors(arg_types[0], 0)
    if fields is None:
        return None
    if fields and fields[0].ndim == 0:
        raise RelationError("concatenate cannot join rank-0 tensors (expand_dims them first)", arg=0)
    axis = normalize_axis(attrs.axis, fields[0].ndim) if fields else 0
    dims = _fields_alike(fields, "concatenate", skip_axis=axis)
    total: Dim = 0
    for f in fields:
        total = dim_add(total, f.shape[axis])
    dims[axis] = total
    return TensorType(tuple(dims), fields[0].dtype)


def _concatenate_compute(attrs: AxisAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    axis = normalize_axis(attrs.axis, inputs[0].ndim)
    pieces: list[tuple[te.Tensor, int, int]] = []  # (tensor, first output index on the axis, its size)
    start = 0
    for x in inputs:
        size = static_shape(x)[axis]
        if size:
            pieces.append((x, start, size))
        start += size
    shape = static_shape(out_type)
    if not pieces:  # every input is empty along the axis, and so is the output
        return [te.compute(shape, lambda *i: te.const(0, inputs[0].dtype), name="concatenate")]

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        # both sides of a select may be loaded, so each piece's index is clamped into that piece
        def load(piece: tuple[te.Tensor, int, int]) -> tx.PrimExpr:
            x, first, size = piece
            index = (*i[:axis], clamp(i[axis] - first, 0, size - 1), *i[axis + 1 :])
            return x[index]

        value = load(pieces[-1])
        for piece, after in zip(pieces[-2::-1], pieces[:0:-1], strict=True):
            value = tx.select(i[axis] < after[1], load(piece), value)
        return value

    return [te.compute(shape, element, name="concatenate")]


(register_op("concatenate").describe("joins a tuple of tensors along an existing axis")
    .add_argument("data", "Tuple", "the tensors (same rank and dtype; equal dims off the axis)")
    .set_attrs_type(AxisAttrs).add_type_rel("Concatenate", _concatenate_rel)
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, xs: np.concatenate(xs, axis=attrs.axis))
    .set_attr(attr.FCompute, _concatenate_compute))


@constructor("concatenate")
def concatenate(data: Expr | Sequence[Expr], axis: int = 0) -> Call:
    """The tensors in `data` (a list, or a tuple-typed expression) joined along `axis`."""
    return call("concatenate", [_as_tuple(data)], AxisAttrs.make("concatenate", axis=axis))


def _stack_rel(arg_types: list[Type], attrs: AxisAttrs) -> Type | None:
    fields = tuple_of_tensors(arg_types[0], 0)
    if fields is None:
        return None
    dims = _fields_alike(fields, "stack")
    at = _insert_axis(attrs.axis, len(dims), "stack")
    return TensorType((*dims[:at], len(fields), *dims[at:]), fields[0].dtype)


def _stack_compute(attrs: AxisAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    shape = static_shape(out_type)
    at = normalize_axis(attrs.axis, len(shape))

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        index = (*i[:at], *i[at + 1 :])
        value: tx.PrimExpr = inputs[-1][index]
        for k in range(len(inputs) - 2, -1, -1):
            value = tx.select(tx.eq(i[at], k), inputs[k][index], value)
        return value

    return [te.compute(shape, element, name="stack")]


(register_op("stack").describe("joins a tuple of tensors of one shape along a new axis")
    .add_argument("data", "Tuple", "the tensors (same shape and dtype)")
    .set_attrs_type(AxisAttrs).add_type_rel("Stack", _stack_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, xs: np.stack(xs, axis=attrs.axis))
    .set_attr(attr.FCompute, _stack_compute))


@constructor("stack")
def stack(data: Expr | Sequence[Expr], axis: int = 0) -> Call:
    """The tensors in `data` (a list, or a tuple-typed expression) joined along a new axis `axis`."""
    return call("stack", [_as_tuple(data)], AxisAttrs.make("stack", axis=axis))


# --- broadcast_to, nn.batch_flatten, tile ------------------------------------------------


@attrs.frozen
class ShapeAttrs(Attrs):
    """A static output shape (broadcast_to; the base of the creation ops' attrs)."""

    shape: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(lo=0), metadata={"doc": "the output shape"}
    )


def _broadcast_to_shape(shapes: list[Shape], attrs: ShapeAttrs) -> Shape:
    shape, target = shapes[0], attrs.shape
    problem = f"rank {len(shape)} is above {len(target)}" if len(shape) > len(target) else None
    for k, (d, t) in enumerate(zip(shape[::-1], target[::-1], strict=False)):
        if problem is None and isinstance(d, int) and d not in (1, t):
            problem = f"dim {len(shape) - 1 - k} is {d} against {t}"
    if problem:
        raise RelationError(f"shape {_shape_str(shape)} does not broadcast to {_shape_str(target)}: {problem}", arg=0)
    return target


def _broadcast_to_compute(attrs: ShapeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, shape = inputs[0], static_shape(out_type)
    dims = static_shape(x)
    lead = len(shape) - len(dims)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(tx.const(0) if d == 1 else i[lead + k] for k, d in enumerate(dims))]

    return [te.compute(shape, element, name="broadcast_to")]


(register_op("broadcast_to").describe("the input broadcast (numpy rules) to a given shape")
    .add_argument(*_DATA).set_attrs_type(ShapeAttrs)
    .add_type_rel("BroadcastTo", shape_relation(_broadcast_to_shape))
    .set_support_level(4).set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, lambda attrs, x: np.array(np.broadcast_to(x, attrs.shape)))
    .set_attr(attr.FCompute, _broadcast_to_compute))


@constructor("broadcast_to")
def broadcast_to(data: Expr, shape: Sequence[int]) -> Call:
    """`data` broadcast to `shape` with numpy's rules."""
    return call("broadcast_to", [data], ShapeAttrs.make("broadcast_to", shape=shape))


def _batch_flatten_shape(shapes: list[Shape], attrs: Any) -> Shape:
    shape = shapes[0]
    if not shape:
        raise RelationError("expected a tensor of rank >= 1 (its first dim is the batch), found rank 0", arg=0)
    return (shape[0], dim_prod(shape[1:]))


(register_op("nn.batch_flatten").describe("flattens all dims but the first: (N, d1, d2, ...) -> (N, d1*d2*...)")
    .add_argument("data", "Tensor", "the input, batch first")
    .add_type_rel("BatchFlatten", shape_relation(_batch_flatten_shape))
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.reshape(x, (x.shape[0], math.prod(x.shape[1:]))))
    .set_attr(attr.FCompute, _reshape_compute))


@constructor("nn.batch_flatten")
def batch_flatten(data: Expr) -> Call:
    """`data` of shape (N, d1, d2, ...) as (N, d1*d2*...); relay.nn.batch_flatten."""
    return call("nn.batch_flatten", [data])


@attrs.frozen
class TileAttrs(Attrs):
    """The repetitions of tile."""

    reps: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(lo=0),
        metadata={"doc": "repetitions per dim, aligned to the last dims (numpy.tile)"},
    )


def _tile_shape(shapes: list[Shape], attrs: TileAttrs) -> Shape:
    shape, reps = shapes[0], attrs.reps
    rank = len(shape) if len(shape) > len(reps) else len(reps)
    padded: list[Dim] = [1] * (rank - len(shape)) + list(shape)
    reps_padded = [1] * (rank - len(reps)) + list(reps)
    return tuple(dim_mul(d, r) for d, r in zip(padded, reps_padded, strict=True))


def _tile_compute(attrs: TileAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, shape = inputs[0], static_shape(out_type)
    dims = static_shape(x)
    lead = len(shape) - len(dims)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(
            tx.const(0) if d == 1 else i[lead + k] if shape[lead + k] == d else i[lead + k] % d
            for k, d in enumerate(dims)
        )]

    return [te.compute(shape, element, name="tile")]


(register_op("tile").describe("repeats the whole tensor along each dim (numpy.tile)")
    .add_argument(*_DATA).set_attrs_type(TileAttrs)
    .add_type_rel("Tile", shape_relation(_tile_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.tile(x, attrs.reps))
    .set_attr(attr.FCompute, _tile_compute))


@constructor("tile")
def tile(data: Expr, reps: int | Sequence[int]) -> Call:
    """`data` repeated `reps[i]` times along dim i (reps aligned to the last dims, as numpy.tile)."""
    return call("tile", [data], TileAttrs.make("tile", reps=reps))


# --- full, zeros, ones, zeros_like, ones_like, shape_of, arange ---------------------------


@attrs.frozen
class FullAttrs(ShapeAttrs):
    """Output shape and dtype of full."""

    dtype: DataType | None = attrs.field(
        default=None, converter=_to_opt_dtype, metadata={"doc": "the output dtype (None: fill_value's)"}
    )


def _full_rel(arg_types: list[Type], attrs: FullAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    if tensors[0].ndim != 0:
        raise RelationError(f"expected a scalar (rank-0) fill_value, found {tensors[0]}", arg=0)
    return TensorType(attrs.shape, attrs.dtype or tensors[0].dtype)


def _full_ref(attrs: FullAttrs, value: Array) -> Array:
    return np.full(attrs.shape, value, dtype=attrs.dtype.numpy() if attrs.dtype else value.dtype)


def _full_compute(attrs: FullAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    value = inputs[0]
    assert isinstance(out_type, TensorType)
    dtype = str(out_type.dtype)
    return [te.compute(static_shape(out_type), lambda *i: te.cast(value[()], dtype), name="full")]


(register_op("full").describe("a tensor of a given shape filled with a scalar")
    .add_argument("fill_value", "Tensor", "the value (a rank-0 tensor)")
    .set_attrs_type(FullAttrs).add_type_rel("Full", _full_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    .set_attr(attr.FReference, _full_ref)
    .set_attr(attr.FCompute, _full_compute))


@constructor("full")
def full(fill_value: Expr | float, shape: Sequence[int], dtype: Any = None) -> Call:
    """A tensor of `shape` and `dtype` (None: fill_value's) filled with `fill_value` (rank-0, or a number)."""
    full_attrs = FullAttrs.make("full", shape=shape, dtype=dtype)
    value = fill_value if isinstance(fill_value, Expr) else const(fill_value, full_attrs.dtype)
    return call("full", [value], full_attrs)


@attrs.frozen
class InitAttrs(ShapeAttrs):
    """Output shape and dtype of zeros and ones."""

    dtype: DataType = attrs.field(default=_F32, converter=to_dtype, metadata={"doc": "the output dtype"})


def _init_rel(arg_types: list[Type], attrs: InitAttrs) -> Type:
    return TensorType(attrs.shape, attrs.dtype)


def _fill_compute(fill: int, out_type: Type) -> list[te.Tensor]:
    """The compute of zeros, ones, zeros_like and ones_like: `fill` in the output's type."""
    assert isinstance(out_type, TensorType)
    value = te.const(fill, str(out_type.dtype))
    return [te.compute(static_shape(out_type), lambda *i: value, name="fill")]


for _name, _fill in [("zeros", 0), ("ones", 1)]:
    (register_op(_name).describe(f"a tensor of a given shape and dtype filled with {_fill}")
        .set_num_inputs(0).set_attrs_type(InitAttrs).add_type_rel("InitOp", _init_rel)
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, _fill=_fill: np.full(attrs.shape, _fill, attrs.dtype.numpy()))
        .set_attr(attr.FCompute, lambda attrs, inputs, out_type, _fill=_fill: _fill_compute(_fill, out_type)))
    (register_op(f"{_name}_like").describe(f"a tensor of the input's shape and dtype filled with {_fill}")
        .add_argument("data", "Tensor", "the tensor whose shape and dtype the output takes")
        .add_type_rel("Identity", shape_relation(identity_shape, same_dtype))
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, x, _fill=_fill: np.full_like(x, _fill))
        .set_attr(attr.FCompute, lambda attrs, inputs, out_type, _fill=_fill: _fill_compute(_fill, out_type)))


@constructor("zeros")
def zeros(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 0."""
    return call("zeros", [], InitAttrs.make("zeros", shape=shape, dtype=dtype))


@constructor("ones")
def ones(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 1."""
    return call("ones", [], InitAttrs.make("ones", shape=shape, dtype=dtype))


@constructor("zeros_like")
def zeros_like(data: Expr) -> Call:
    """0 in the shape and dtype of `data`."""
    return call("zeros_like", [data])


@constructor("ones_like")
def ones_like(data: Expr) -> Call:
    """1 in the shape and dtype of `data`."""
    return call("ones_like", [data])


def _int_dtype(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if value.kind != "int":
        raise FieldError(field.name, "a signed integer dtype such as 'int32' or 'int64'", str(value))


@attrs.frozen
class ShapeOfAttrs(Attrs):
    """The dtype of shape_of's output."""

    dtype: DataType = attrs.field(
        default=DataType.of("int32"), converter=to_dtype, validator=_int_dtype, metadata={"doc": "the output dtype"}
    )


def _shape_of_rel(arg_types: list[Type], attrs: ShapeOfAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    return None if tensors is None else TensorType((tensors[0].ndim,), attrs.dtype)


def _shape_of_compute(attrs: ShapeOfAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    dims, dtype = static_shape(inputs[0]), str(attrs.dtype)

    def element(i: tx.PrimExpr) -> tx.PrimExpr:
        value = te.const(dims[-1] if dims else 0, dtype)
        for k in range(len(dims) - 2, -1, -1):
            value = tx.select(tx.eq(i, k), te.const(dims[k], dtype), value)
        return value

    return [te.compute(static_shape(out_type), element, name="shape_of")]


(register_op("shape_of").describe("the shape of a tensor, as a 1-d integer tensor")
    .add_argument(*_DATA).set_attrs_type(ShapeOfAttrs)
    .add_type_rel("ShapeOf", _shape_of_rel)
    .set_support_level(10).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, lambda attrs, x: np.array(x.shape, dtype=attrs.dtype.numpy()))
    .set_attr(attr.FCompute, _shape_of_compute))


@constructor("shape_of")
def shape_of(data: Expr, dtype: Any = "int32") -> Call:
    """The shape of `data` as a 1-d tensor of `dtype`."""
    return call("shape_of", [data], ShapeOfAttrs.make("shape_of", dtype=dtype))


def _nonzero_number(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    float_value(_, field, value)
    if value == 0:
        raise FieldError(field.name, "a non-zero number", value)


@attrs.frozen
class ArangeAttrs(Attrs):
    """The range of arange: start, start + step, ... up to but not including stop."""

    start: float = attrs.field(validator=float_value, metadata={"doc": "the first value"})
    stop: float = attrs.field(validator=float_value, metadata={"doc": "the end (excluded)"})
    step: float = attrs.field(default=1, validator=_nonzero_number, metadata={"doc": "the spacing (non-zero)"})
    dtype: DataType = attrs.field(default=_F32, converter=to_dtype, metadata={"doc": "the output dtype"})

    @property
    def length(self) -> int:
        """How many values the range holds: max(0, ceil((stop - start) / step))."""
        n = math.ceil((self.stop - self.start) / self.step)
        return n if n > 0 else 0


def _arange_rel(arg_types: list[Type], attrs: ArangeAttrs) -> Type:
    return TensorType((attrs.length,), attrs.dtype)


def _arange_ref(attrs: ArangeAttrs) -> Array:
    # start + i * step, then cast: TVM's definition (numpy.arange differs for int dtypes with float starts)
    return (attrs.start + np.arange(attrs.length, dtype=np.float64) * attrs.step).astype(attrs.dtype.numpy())


def _arange_compute(attrs: ArangeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    start, step = te.const(float(attrs.start), "float64"), te.const(float(attrs.step), "float64")
    dtype = str(attrs.dtype)

    def element(i: tx.PrimExpr) -> tx.PrimExpr:
        return te.cast(start + te.cast(i, "float64") * step, dtype)

    return [te.compute(static_shape(out_type), element, name="arange")]


(register_op("arange").describe("evenly spaced values start, start + step, ... up to stop (excluded)")
    .set_num_inputs(0).set_attrs_type(ArangeAttrs).add_type_rel("Arange", _arange_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _arange_ref)
    .set_attr(attr.FCompute, _arange_compute))


@constructor("arange")
def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = "float32") -> Call:
    """Values `start, start + step, ...` up to `stop` (excluded) as `dtype`; `arange(n)` is `arange(0, n)`."""
    if stop is None:
        start, stop = 0, start
    return call("arange", [], ArangeAttrs.make("arange", start=start, stop=stop, step=step, dtype=dtype))
