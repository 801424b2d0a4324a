"""Indexing ops: split, strided_slice, take — the ops that select elements of one tensor.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
The shape helpers at the top are shared with `shape.py`, which re-exports
this module's public names (`relay.split`, `relay.take`, ... have always been
imported from there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import (
    Attrs,
    FieldError,
    int_range,
    int_tuple,
    one_of,
    optional,
    to_int_tuple,
    to_opt_int_tuple,
)
from kiln.ir.types import ANY, Dim, TensorType, TupleType, Type, dim_add, dim_div
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, shape_relation, tensor_args
from kiln.tir import expr as tx

Array = np.ndarray[Any, Any]
Shape = tuple[Dim, ...]

DATA_ARG = ("data", "Tensor", "the input")
# An `end` at least this large means "to the end of the axis" (TVM's and ONNX's idiom).
_END_OF_AXIS = 2**31 - 1


def shape_str(shape: Sequence[Any]) -> str:
    """`shape` as Python prints a tuple: (2, 3), (4,), ()."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_axes(axes: Sequence[int], ndim: int, what: str = "axis") -> list[int]:
    """`axes` normalized; RelationError for an axis out of range or given twice."""
    out: list[int] = []
    for a in axes:
        n = normalize_axis(a, ndim, what)
        if n in out:
            raise RelationError(f"{what} {a} is given twice in {shape_str(axes)} for a tensor of rank {ndim}")
        out.append(n)
    return out


def static_shape(ty: Type | te.Tensor) -> tuple[int, ...]:
    """The static shape of a tensor type or te tensor (lowering only ever passes static ones)."""
    dims = ty.shape if isinstance(ty, (TensorType, te.Tensor)) else None
    assert dims is not None, f"expected a tensor type, got {ty}"
    out: list[int] = []
    for d in dims:
        value = d if isinstance(d, int) else getattr(d, "value", None)
        assert isinstance(value, int), f"dim {d} of {ty} is not static"
        out.append(value)
    return tuple(out)


def unravel(flat: tx.PrimExpr, shape: Sequence[int]) -> tuple[tx.PrimExpr, ...]:
    """The index into a row-major tensor of `shape` of its element number `flat` (in [0, size))."""
    out: list[tx.PrimExpr] = []
    stride = 1
    for d in reversed(shape):
        if d == 1:
            out.append(tx.const(0))
        else:
            out.append((flat // stride if stride != 1 else flat) % d)
        stride *= d
    return tuple(reversed(out))


def clamp(index: tx.PrimExpr, lo: int, hi: int) -> tx.PrimExpr:
    """`index` clamped to [lo, hi]: keeps a load in bounds where the back end may evaluate it anyway."""
    return tx.max_(tx.min_(index, hi), lo)


# --- split ----------------------------------------------------------------------------------


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
                f"axis {axis} of shape {shape_str(data.shape)} has size {dim}, "
                f"which does not split into {cut} equal sections",
                arg=0,
            )
        pieces = [piece] * cut
    else:
        if cut and isinstance(dim, int) and cut[-1] > dim:
            raise RelationError(
                f"split index {cut[-1]} is past the end of axis {axis} of shape {shape_str(data.shape)}", arg=0
            )
        pieces = [b - a for a, b in zip((0, *cut), cut, strict=False)]
        pieces.append(dim_add(dim, -cut[-1]) if cut else dim)
    fields: list[Type] = [TensorType((*data.shape[:axis], p, *data.shape[axis + 1 :]), data.dtype) for p in pieces]
    return TupleType(fields)


def _split_ref(attrs: SplitAttrs, x: Array) -> tuple[Array, ...]:
    cut = attrs.indices_or_sections
    return tuple(np.split(x, cut if isinstance(cut, int) else list(cut), axis=attrs.axis))


def _split_compute(attrs: SplitAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x = inputs[0]
    assert isinstance(out_type, TupleType)
    axis = normalize_axis(attrs.axis, x.ndim)
    outs: list[te.Tensor] = []
    start = 0
    for k, field in enumerate(out_type.fields):
        shape = static_shape(field)

        def piece(*i: tx.PrimExpr, start: int = start) -> tx.PrimExpr:
            index = (*i[:axis], i[axis] + start, *i[axis + 1 :])
            return x[index]

        outs.append(te.compute(shape, piece, name=f"split{k}"))
        start += shape[axis]
    return outs


(register_op("split").describe("cuts a tensor along an axis into a tuple of tensors")
    .add_argument(*DATA_ARG)
    .set_attrs_type(SplitAttrs)
    .add_type_rel("Split", _split_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _split_ref)
    .set_attr(attr.FCompute, _split_compute))


@constructor("split")
def split(data: Expr, indices_or_sections: int | Sequence[int], axis: int = 0) -> Call:
    """`data` cut along `axis` into equal sections (an int) or at ascending indices; its value is a tuple."""
    return call("split", [data], SplitAttrs.make("split", indices_or_sections=indices_or_sections, axis=axis))


# --- strided_slice --------------------------------------------------------------------------


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
        axes = list(range(k)) if self.axes is None else check_axes(self.axes, ndim)
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


def _strided_slice_compute(attrs: StridedSliceAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x = inputs[0]
    dims = static_shape(x)
    # Python's range slicing is numpy's: the first index and the step of each sliced axis
    picked = {axis: range(dims[axis])[begin:end:stride] for axis, begin, end, stride in attrs.slices(x.ndim)}

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(i[a] * picked[a].step + picked[a].start if a in picked else i[a] for a in range(x.ndim))]

    return [te.compute(static_shape(out_type), element, name="strided_slice")]


(register_op("strided_slice").describe("numpy slicing data[begin:end:stride] along some axes")
    .add_argument(*DATA_ARG)
    .set_attrs_type(StridedSliceAttrs)
    .add_type_rel("StridedSlice", shape_relation(_strided_slice_shape))
    .set_support_level(4)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _strided_slice_ref)
    .set_attr(attr.FCompute, _strided_slice_compute))


@constructor("strided_slice")
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


# --- take -----------------------------------------------------------------------------------


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


def _safe_index(index: tx.PrimExpr, size: int, mode: str) -> tx.PrimExpr:
    """A data-dependent `index` into an axis of `size`, made in range as `mode` says, as int32.

    clip clamps to [0, size - 1]; wrap is the floor modulo; fast (indices promised in range)
    counts negative ones from the end, as numpy does, and is clamped as well so that a broken
    promise reads a wrong element instead of memory outside the tensor.
    """
    wide = "int64" if index.dtype in ("int64", "uint64") else "int32"
    index = tx.cast(wide, index)
    if mode == "wrap":
        index = index % size
    else:
        if mode == "fast":
            index = tx.select(index < 0, index + size, index)
        index = clamp(index, 0, size - 1)
    return tx.cast("int32", index)


def _take_compute(attrs: TakeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, indices = inputs
    dims = static_shape(data)
    if attrs.axis is None:
        size = 1
        for d in dims:
            size *= d

        def element(*i: tx.PrimExpr) -> tx.PrimExpr:
            return data[unravel(_safe_index(indices[i], size, attrs.mode), dims)]
    else:
        axis, k = normalize_axis(attrs.axis, data.ndim), indices.ndim

        def element(*i: tx.PrimExpr) -> tx.PrimExpr:
            at = _safe_index(indices[i[axis : axis + k]], dims[axis], attrs.mode)
            index = (*i[:axis], at, *i[axis + k :])
            return data[index]

    return [te.compute(static_shape(out_type), element, name="take")]


(register_op("take").describe("the elements of data at the given indices along an axis")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer indices")
    .set_attrs_type(TakeAttrs)
    .add_type_rel("Take", _take_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _take_ref)
    .set_attr(attr.FCompute, _take_compute))


@constructor("take")
def take(data: Expr, indices: Expr, axis: int | None = None, mode: str = "clip") -> Call:
    """`data` indexed by `indices` along `axis` (None: the flattened data); mode is clip, wrap or fast."""
    return call("take", [data, indices], TakeAttrs.make("take", axis=axis, mode=mode))


