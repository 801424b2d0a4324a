"""Transform ops: reshape, transpose, squeeze, expand_dims, concatenate, stack, split,
strided_slice, take, broadcast_to, nn.batch_flatten, tile; and the creation ops
full, zeros, ones, zeros_like, ones_like, shape_of, arange.

Each op is registered in one chain (description, arguments, attrs, relation,
support level, pattern, numpy reference); its Python constructor sits next to
it. Ops that join several tensors (concatenate, stack) take ONE argument, a
tuple, as in TVM; their numpy reference receives it as a tuple of arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln.ir.attrs import (
    Attrs,
    FieldError,
    float_value,
    int_range,
    int_tuple,
    one_of,
    optional,
    to_dtype,
    to_int_tuple,
    to_opt_int_tuple,
)
from kiln.ir.dtype import DataType
from kiln.ir.types import ANY, Dim, TensorType, TupleType, Type, dim_add, dim_div, dim_mul, dim_prod
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, Tuple, call, const
from kiln.relay.op._rel import (
    RelationError,
    identity_shape,
    normalize_axis,
    same_dtype,
    shape_relation,
    tensor_args,
    tuple_of_tensors,
)

Array = np.ndarray[Any, Any]
Shape = tuple[Dim, ...]

_DATA = ("data", "Tensor", "the input")
_F32 = DataType.of("float32")
# An `end` at least this large means "to the end of the axis" (TVM's and ONNX's idiom).
_END_OF_AXIS = 2**31 - 1


def _shape_str(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _to_opt_dtype(value: Any) -> DataType | None:
    return None if value is None else DataType.of(value)


def _check_axes(axes: Sequence[int], ndim: int, what: str = "axis") -> list[int]:
    """`axes` normalized; RelationError for an axis out of range or given twice."""
    out: list[int] = []
    for a in axes:
        n = normalize_axis(a, ndim, what)
        if n in out:
            raise RelationError(f"{what} {a} is given twice in {_shape_str(axes)} for a tensor of rank {ndim}")
        out.append(n)
    return out


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


# --- reshape, transpose, squeeze, expand_dims ----------------------------------------------


@attrs.frozen
class ReshapeAttrs(Attrs):
    """The new shape of reshape: 0 copies the input dim at that position, -1 is inferred."""

    newshape: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(lo=-1), metadata={"doc": "the new shape (0: copy, -1: infer)"}
    )

    def __attrs_post_init__(self) -> None:
        if self.newshape.count(-1) > 1:
            raise FieldError("newshape", "a shape with at most one -1", self.newshape)


def _reshape_shape(shapes: list[Shape], attrs: ReshapeAttrs) -> Shape:
    shape, newshape = shapes[0], attrs.newshape
    out: list[Dim] = []
    for i, v in enumerate(newshape):
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
    return np.reshape(x, [x.shape[i] if v == 0 else v for i, v in enumerate(attrs.newshape)])


(register_op("reshape").describe("the elements in row-major order, in a new shape (0 copies a dim, -1 is inferred)")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(ReshapeAttrs)
    .add_type_rel("Reshape", shape_relation(_reshape_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _reshape_ref))


def reshape(data: Expr, newshape: int | Sequence[int]) -> Call:
    """`data` in shape `newshape`, where a 0 copies the input dim at that position and one -1 is inferred."""
    return call("reshape", [data], ReshapeAttrs.make("reshape", newshape=newshape))


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


(register_op("transpose").describe("permutes the dims")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(TransposeAttrs)
    .add_type_rel("Transpose", shape_relation(_transpose_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.transpose(x, attrs.axes)))


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
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(SqueezeAttrs)
    .add_type_rel("Squeeze", shape_relation(_squeeze_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.squeeze(x, axis=attrs.axis)))


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
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(ExpandDimsAttrs)
    .add_type_rel("ExpandDims", shape_relation(_expand_dims_shape))
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _expand_dims_ref))


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


(register_op("concatenate").describe("joins a tuple of tensors along an existing axis")
    .set_num_inputs(1).add_argument("data", "Tuple", "the tensors (same rank and dtype; equal dims off the axis)")
    .set_attrs_type(AxisAttrs).add_type_rel("Concatenate", _concatenate_rel)
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, xs: np.concatenate(xs, axis=attrs.axis)))


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


(register_op("stack").describe("joins a tuple of tensors of one shape along a new axis")
    .set_num_inputs(1).add_argument("data", "Tuple", "the tensors (same shape and dtype)")
    .set_attrs_type(AxisAttrs).add_type_rel("Stack", _stack_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, xs: np.stack(xs, axis=attrs.axis)))


def stack(data: Expr | Sequence[Expr], axis: int = 0) -> Call:
    """The tensors in `data` (a list, or a tuple-typed expression) joined along a new axis `axis`."""
    return call("stack", [_as_tuple(data)], AxisAttrs.make("stack", axis=axis))


def _to_sections(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return to_int_tuple(value)
    return int(value) if isinstance(value, np.integer) else value


def _sections_value(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if is_int(value) and value >= 1:
        return
    if isinstance(value, tuple) and all(map(is_int, value)) and all(map(int.__lt__, (0, *value), value)):
        return
    raise FieldError(field.name, "a number of sections >= 1 or a strictly ascending list of indices > 0", value)


@attrs.frozen
class SplitAttrs(Attrs):
    """How split cuts its input."""

    indices_or_sections: int | tuple[int, ...] = attrs.field(
        converter=_to_sections, validator=_sections_value,
        metadata={"doc": "a number of equal sections, or the ascending indices where new pieces start"},
    )
    axis: int = attrs.field(default=0, validator=int_range(), metadata={"doc": "the axis to cut"})


def _split_rel(arg_types: list[Type], attrs: SplitAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data = tensors[0]
    axis = normalize_axis(attrs.axis, data.ndim)
    dim, cut = data.shape[axis], attrs.indices_or_sections
    pieces: list[Dim] = []
    if isinstance(cut, int):
        piece = dim_div(dim, cut)
        if piece is None:
            raise RelationError(
                f"axis {axis} of shape {_shape_str(data.shape)} has size {dim}, "
                f"which does not split into {cut} equal sections",
                arg=0,
            )
        pieces = [piece] * cut
    else:
        if cut and isinstance(dim, int) and cut[-1] > dim:
            raise RelationError(
                f"split index {cut[-1]} is past the end of axis {axis} of shape {_shape_str(data.shape)}", arg=0
            )
        pieces = [b - a for a, b in zip((0, *cut), cut, strict=False)]
        pieces.append(dim_add(dim, -cut[-1]) if cut else dim)
    fields: list[Type] = [TensorType((*data.shape[:axis], p, *data.shape[axis + 1 :]), data.dtype) for p in pieces]
    return TupleType(fields)


def _split_ref(attrs: SplitAttrs, x: Array) -> tuple[Array, ...]:
    cut = attrs.indices_or_sections
    return tuple(np.split(x, cut if isinstance(cut, int) else list(cut), axis=attrs.axis))


(register_op("split").describe("cuts a tensor along an axis into a tuple of tensors")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(SplitAttrs)
    .add_type_rel("Split", _split_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _split_ref))


def split(data: Expr, indices_or_sections: int | Sequence[int], axis: int = 0) -> Call:
    """`data` cut along `axis` into equal sections (an int) or at ascending indices; its value is a tuple."""
    return call("split", [data], SplitAttrs.make("split", indices_or_sections=indices_or_sections, axis=axis))


# --- strided_slice, take -----------------------------------------------------------------


def _nonzero_ints(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    int_tuple()(_, field, value)
    if 0 in value:
        raise FieldError(field.name, "a list of non-zero ints", value)


@attrs.frozen
class StridedSliceAttrs(Attrs):
    """numpy slicing, `data[begin:end:stride]` per axis (negative indices count from the end; clamped)."""

    begin: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(), metadata={"doc": "the first index per axis"}
    )
    end: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(), metadata={"doc": "one past the last index per axis"}
    )
    strides: tuple[int, ...] | None = attrs.field(
        default=None, converter=to_opt_int_tuple, validator=optional(_nonzero_ints),
        metadata={"doc": "the step per axis; missing trailing entries are 1"},
    )
    axes: tuple[int, ...] | None = attrs.field(
        default=None, converter=to_opt_int_tuple, validator=optional(int_tuple()),
        metadata={"doc": "the axes begin/end/strides apply to (None: the leading axes)"},
    )

    def __attrs_post_init__(self) -> None:
        k = len(self.begin)
        if len(self.end) != k:
            raise FieldError("end", f"a list of {k} ints (as many as begin)", self.end)
        if self.strides is not None and len(self.strides) > k:
            raise FieldError("strides", f"a list of at most {k} ints (as many as begin)", self.strides)
        if self.axes is not None and len(self.axes) != k:
            raise FieldError("axes", f"a list of {k} ints (as many as begin)", self.axes)

    def slices(self, ndim: int) -> list[tuple[int, int, int, int]]:
        """(axis, begin, end, stride) per sliced axis of a rank-`ndim` tensor; RelationError for bad axes."""
        k = len(self.begin)
        if self.axes is None and k > ndim:
            raise RelationError(f"begin has {k} entries for a tensor of rank {ndim}", arg=0)
        axes = list(range(k)) if self.axes is None else _check_axes(self.axes, ndim)
        strides = list(self.strides or ()) + [1] * (k - len(self.strides or ()))
        return list(zip(axes, self.begin, self.end, strides, strict=True))


def _slice_dim(dim: Dim, begin: int, end: int, stride: int) -> Dim:
    if isinstance(dim, int):
        return len(range(dim)[begin:end:stride])
    return dim if (stride, begin) == (1, 0) and end >= _END_OF_AXIS else ANY


def _strided_slice_shape(shapes: list[Shape], attrs: StridedSliceAttrs) -> Shape:
    out = list(shapes[0])
    for axis, begin, end, stride in attrs.slices(len(out)):
        out[axis] = _slice_dim(out[axis], begin, end, stride)
    return tuple(out)


def _strided_slice_ref(attrs: StridedSliceAttrs, x: Array) -> Array:
    index = [slice(None)] * x.ndim
    for axis, begin, end, stride in attrs.slices(x.ndim):
        index[axis] = slice(begin, end, stride)
    return np.array(x[tuple(index)])


(register_op("strided_slice").describe("numpy slicing data[begin:end:stride] along some axes")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(StridedSliceAttrs)
    .add_type_rel("StridedSlice", shape_relation(_strided_slice_shape))
    .set_support_level(4).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _strided_slice_ref))


def strided_slice(
    data: Expr,
    begin: Sequence[int],
    end: Sequence[int],
    strides: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
) -> Call:
    """`data[begin:end:stride]` on each of `axes`, as numpy slices.

    Args:
        data: the input.
        begin: the first index per axis (negative counts from the end).
        end: one past the last index per axis (clamped; 2**31 - 1 or more reads "to the end").
        strides: the step per axis (non-zero; missing trailing entries are 1).
        axes: the axes the lists apply to (None: the first len(begin) axes).

    Returns:
        The call of `strided_slice`.
    """
    sliced = StridedSliceAttrs.make("strided_slice", begin=begin, end=end, strides=strides, axes=axes)
    return call("strided_slice", [data], sliced)


@attrs.frozen
class TakeAttrs(Attrs):
    """The axis of take and what it does with out-of-range indices."""

    axis: int | None = attrs.field(
        default=None, validator=optional(int_range()), metadata={"doc": "the axis to index (None: the flattened data)"}
    )
    mode: str = attrs.field(
        default="clip", validator=one_of("clip", "wrap", "fast"),
        metadata={"doc": "out-of-range indices: clip to the ends, wrap around, or assume none (fast)"},
    )


def _take_rel(arg_types: list[Type], attrs: TakeAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, indices = tensors
    if not indices.dtype.is_int:
        raise RelationError(f"expected integer indices, found dtype {indices.dtype}", arg=1)
    if attrs.axis is None:
        return TensorType(indices.shape, data.dtype)
    axis = normalize_axis(attrs.axis, data.ndim)
    return TensorType((*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :]), data.dtype)


def _take_ref(attrs: TakeAttrs, x: Array, indices: Array) -> Array:
    mode: Any = "raise" if attrs.mode == "fast" else attrs.mode  # fast: indices are in range
    return np.asarray(np.take(x, indices, axis=attrs.axis, mode=mode))


(register_op("take").describe("the elements of data at the given indices along an axis")
    .set_num_inputs(2).add_argument(*_DATA).add_argument("indices", "Tensor", "integer indices")
    .set_attrs_type(TakeAttrs).add_type_rel("Take", _take_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _take_ref))


def take(data: Expr, indices: Expr, axis: int | None = None, mode: str = "clip") -> Call:
    """`data` indexed by `indices` along `axis` (None: the flattened data); mode is clip, wrap or fast."""
    return call("take", [data, indices], TakeAttrs.make("take", axis=axis, mode=mode))


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


(register_op("broadcast_to").describe("the input broadcast (numpy rules) to a given shape")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(ShapeAttrs)
    .add_type_rel("BroadcastTo", shape_relation(_broadcast_to_shape))
    .set_support_level(4).set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, lambda attrs, x: np.array(np.broadcast_to(x, attrs.shape))))


def broadcast_to(data: Expr, shape: Sequence[int]) -> Call:
    """`data` broadcast to `shape` with numpy's rules."""
    return call("broadcast_to", [data], ShapeAttrs.make("broadcast_to", shape=shape))


def _batch_flatten_shape(shapes: list[Shape], attrs: Any) -> Shape:
    shape = shapes[0]
    if not shape:
        raise RelationError("expected a tensor of rank >= 1 (its first dim is the batch), found rank 0", arg=0)
    return (shape[0], dim_prod(shape[1:]))


(register_op("nn.batch_flatten").describe("flattens all dims but the first: (N, d1, d2, ...) -> (N, d1*d2*...)")
    .set_num_inputs(1).add_argument("data", "Tensor", "the input, batch first")
    .add_type_rel("BatchFlatten", shape_relation(_batch_flatten_shape))
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.reshape(x, (x.shape[0], math.prod(x.shape[1:])))))


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


(register_op("tile").describe("repeats the whole tensor along each dim (numpy.tile)")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(TileAttrs)
    .add_type_rel("Tile", shape_relation(_tile_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.tile(x, attrs.reps)))


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


(register_op("full").describe("a tensor of a given shape filled with a scalar")
    .set_num_inputs(1).add_argument("fill_value", "Tensor", "the value (a rank-0 tensor)")
    .set_attrs_type(FullAttrs).add_type_rel("Full", _full_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    .set_attr(attr.FReference, _full_ref))


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


for _name, _fill in [("zeros", 0), ("ones", 1)]:
    (register_op(_name).describe(f"a tensor of a given shape and dtype filled with {_fill}")
        .set_num_inputs(0).set_attrs_type(InitAttrs).add_type_rel("InitOp", _init_rel)
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, _fill=_fill: np.full(attrs.shape, _fill, attrs.dtype.numpy())))
    (register_op(f"{_name}_like").describe(f"a tensor of the input's shape and dtype filled with {_fill}")
        .set_num_inputs(1).add_argument("data", "Tensor", "the tensor whose shape and dtype the output takes")
        .add_type_rel("Identity", shape_relation(identity_shape, same_dtype))
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, x, _fill=_fill: np.full_like(x, _fill)))


def zeros(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 0."""
    return call("zeros", [], InitAttrs.make("zeros", shape=shape, dtype=dtype))


def ones(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 1."""
    return call("ones", [], InitAttrs.make("ones", shape=shape, dtype=dtype))


def zeros_like(data: Expr) -> Call:
    """0 in the shape and dtype of `data`."""
    return call("zeros_like", [data])


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


(register_op("shape_of").describe("the shape of a tensor, as a 1-d integer tensor")
    .set_num_inputs(1).add_argument(*_DATA).set_attrs_type(ShapeOfAttrs)
    .add_type_rel("ShapeOf", _shape_of_rel)
    .set_support_level(10).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, lambda attrs, x: np.array(x.shape, dtype=attrs.dtype.numpy())))


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


(register_op("arange").describe("evenly spaced values start, start + step, ... up to stop (excluded)")
    .set_num_inputs(0).set_attrs_type(ArangeAttrs).add_type_rel("Arange", _arange_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _arange_ref))


def arange(start: float, stop: float | None = None, step: float = 1, dtype: Any = "float32") -> Call:
    """Values `start, start + step, ...` up to `stop` (excluded) as `dtype`; `arange(n)` is `arange(0, n)`."""
    if stop is None:
        start, stop = 0, start
    return call("arange", [], ArangeAttrs.make("arange", start=start, stop=stop, step=step, dtype=dtype))
