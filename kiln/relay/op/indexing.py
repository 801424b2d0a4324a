"""Indexing ops: split, strided_slice, take, gather_elements, gather_nd, scatter_elements and scatter_nd
— the ops that select elements of one tensor, or write some into it (topk, which orders them, is in
`algorithm.py`).

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
The shape helpers at the top are shared with `shape.py` (and `algorithm.py`); `shape.py`
re-exports this module's public names (`relay.split`, `relay.take`, ... have always been
imported from there).

Indices that come from data are made safe before they address memory: negative
ones count from the end (ONNX's rule) and all are clamped into the axis, so a
bad index reads a wrong element, never memory outside the tensor. A scatter's
output element gathers the updates that land on it (a reduction over the update
positions that can reach it), so that all of them are plain te computes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import (
    Attrs,
    FieldError,
    dims,
    int_range,
    int_tuple,
    one_of,
    optional,
    to_dims,
    to_int_tuple,
    to_opt_int_tuple,
)
from kiln.ir.types import ANY, Dim, TensorType, TupleType, Type, dim_add, dim_div, dim_floordiv, dim_mul
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op import indexing_grad
from kiln.relay.op._nn_util import DimExpr, shape_dims, te_dims
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, shape_relation, tensor_args
from kiln.tir import expr as tx
from kiln.tir.dims import expr_dim

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
    """The static shape of a tensor type or te tensor, for the computes that need every dim (a symbolic
    one raises te.TEError, which lowering reports with the op's name)."""
    dims = ty.shape if isinstance(ty, (TensorType, te.Tensor)) else None
    assert dims is not None, f"expected a tensor type, got {ty}"
    out: list[int] = []
    for d in dims:
        value = d if isinstance(d, int) else getattr(d, "value", None)
        if not isinstance(value, int):
            raise te.TEError(f"needs static shapes; found {ty} (symbolic dims are not supported by this compute yet)")
        out.append(value)
    return tuple(out)





def unravel(flat: tx.PrimExpr, shape: Sequence[DimExpr], bounded: bool = False) -> tuple[tx.PrimExpr, ...]:
    """The index into a row-major tensor of `shape` of its element number `flat` (in [0, size)); `bounded`
    leaves out the modulo of the outermost dim of size other than 1 (which `flat` < size makes a no-op)."""
    out: list[tx.PrimExpr] = []
    stride: DimExpr = 1
    outer = min((k for k, d in enumerate(shape) if not isinstance(d, int) or d != 1), default=-1) if bounded else -1
    for k in range(len(shape) - 1, -1, -1):
        d = shape[k]
        if isinstance(d, int) and d == 1:
            out.append(tx.const(0))
        else:
            q = flat // stride if not isinstance(stride, int) or stride != 1 else flat
            out.append(q if k == outer else q % d)
        stride = stride * d
    return tuple(reversed(out))


def clamp(index: tx.PrimExpr, lo: int, hi: DimExpr) -> tx.PrimExpr:
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
    start: DimExpr = 0  # an expression once a piece before has a symbolic size along the axis
    for k, field in enumerate(out_type.fields):
        shape = shape_dims(field)

        def piece(*i: tx.PrimExpr, start: DimExpr = start) -> tx.PrimExpr:
            index = (*i[:axis], i[axis] + start, *i[axis + 1 :])
            return x[index]

        outs.append(te.compute(shape, piece, name=f"split{k}"))
        size = shape[axis]
        start = start + (size if isinstance(size, int) else te.as_index(size))
    return outs


(register_op("split").describe("cuts a tensor along an axis into a tuple of tensors")
    .add_argument(*DATA_ARG)
    .set_attrs_type(SplitAttrs)
    .add_type_rel("Split", _split_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _split_ref)
    .set_attr(attr.FCompute, _split_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.split_grad))


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
    """numpy slicing, `data[begin:end:stride]` per axis (negative indices count from the end; clamped where
    the dim and bounds are static, checked at run time where one is a size)."""

    begin: tuple[Dim, ...] = attrs.field(
        converter=to_dims, validator=dims(), metadata={"doc": "the first index per axis (an int or a size)"}
    )
    end: tuple[Dim, ...] = attrs.field(
        converter=to_dims, validator=dims(), metadata={"doc": "one past the last index per axis (an int or a size)"}
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

    def slices(self, ndim: int) -> list[tuple[int, Dim, Dim, int]]:
        """(axis, begin, end, stride) per sliced axis of a rank-`ndim` tensor; RelationError for bad axes."""
        k = len(self.begin)
        if self.axes is None and k > ndim:
            raise RelationError(f"begin has {k} entries for a tensor of rank {ndim}", arg=0)
        axes = list(range(k)) if self.axes is None else check_axes(self.axes, ndim)
        strides = list(self.strides or ()) + [1] * (k - len(self.strides or ()))
        return list(zip(axes, self.begin, self.end, strides, strict=True))


def _bounds(dim: Dim, begin: Dim, end: Dim, stride: int) -> tuple[Dim, Dim, int]:
    """(first index, length, step) of a slice of an axis: numpy's (clamped) where all are ints. Where the dim
    or a bound is symbolic (positive strides only), negative ints count from the end and an end past
    `_END_OF_AXIS` is the dim, unclamped: 0 <= first <= end <= dim is checked at run time instead."""
    if isinstance(dim, int) and isinstance(begin, int) and isinstance(end, int):
        r = range(dim)[begin:end:stride]
        return r.start, len(r), r.step
    if stride < 0 or ANY in (dim, begin, end):
        return 0, ANY, stride
    first, stop = (v if not isinstance(v, int) else dim if v >= _END_OF_AXIS else dim_add(dim, v) if v < 0 else v
                   for v in (begin, end))
    length = dim_add(stop, dim_mul(first, -1))
    if isinstance(length, int) and length < 0:
        raise RelationError(f"the slice [{first}:{stop}] of an axis of size {dim} ends before it starts", arg=0)
    return first, dim_floordiv(dim_add(length, stride - 1), stride), stride  # ceil(length / stride)


def _strided_slice_shape(shapes: list[Shape], attrs: StridedSliceAttrs) -> Shape:
    out = list(shapes[0])
    for axis, begin, end, stride in attrs.slices(len(out)):
        out[axis] = _bounds(out[axis], begin, end, stride)[1]
    return tuple(out)


def _strided_slice_checks(attrs: StridedSliceAttrs, arg_types: list[Type]) -> list[tuple[Dim, Dim, str]]:
    assert isinstance(arg_types[0], TensorType)
    shape, checks = arg_types[0].shape, []
    for axis, begin, end, stride in attrs.slices(len(shape)):
        first, length, _ = _bounds(shape[axis], begin, end, 1)  # the span the slice steps through
        if not all(isinstance(v, int) for v in (shape[axis], begin, end)) and length != ANY and stride > 0:
            stop = dim_add(first, length)
            what = f"the slice [{first}:{stop}] of axis {axis}, of size {shape[axis]}"
            checks += [(0, first, what), (first, stop, what), (stop, shape[axis], what)]
    return checks


def _strided_slice_ref(attrs: StridedSliceAttrs, x: Array) -> Array:
    index = [slice(None)] * x.ndim
    for axis, begin, end, stride in attrs.slices(x.ndim):
        index[axis] = slice(begin, end, stride)
    return np.array(x[tuple(index)])


def _strided_slice_compute(attrs: StridedSliceAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, shape = inputs[0], shape_dims(out_type)
    dims = te_dims(x)
    # the first index and the step of each sliced axis (`_bounds`: Python's range slicing, which is numpy's,
    # where all is static; else the unclamped first index, which the size checks keep in range)
    picked: dict[int, tuple[DimExpr, int]] = {}
    for axis, begin, end, stride in attrs.slices(x.ndim):
        d = dims[axis]
        dim = d if isinstance(d, int) else expr_dim(d)
        assert dim is not None
        first, _, step = _bounds(dim, begin, end, stride)
        picked[axis] = (first if isinstance(first, int) else te.as_index(first), step)  # type: ignore[arg-type]

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(i[a] * picked[a][1] + picked[a][0] if a in picked else i[a] for a in range(x.ndim))]

    return [te.compute(shape, element, name="strided_slice")]


(register_op("strided_slice").describe("numpy slicing data[begin:end:stride] along some axes")
    .add_argument(*DATA_ARG)
    .set_attrs_type(StridedSliceAttrs)
    .add_type_rel("StridedSlice", shape_relation(_strided_slice_shape))
    .set_support_level(4)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _strided_slice_ref)
    .set_attr(attr.FCompute, _strided_slice_compute)
    .set_attr(attr.FSizeCheck, _strided_slice_checks)
    .set_attr(attr.FPrimalGradient, indexing_grad.strided_slice_grad))


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


def _safe_index(index: tx.PrimExpr, size: DimExpr, mode: str) -> tx.PrimExpr:
    """A data-dependent `index` into an axis of `size`, made in range as `mode` says, as int32.

    clip clamps to [0, size - 1]; wrap is the floor modulo; fast (indices promised in range)
    counts negative ones from the end, as numpy does, and is clamped as well so that a broken
    promise reads a wrong element instead of memory outside the tensor.
    """
    wide = "int64" if index.dtype in ("int64", "uint64") else "int32"
    index = tx.cast(wide, index)
    if not isinstance(size, int):  # a symbolic size: an int32 expression of the kernel's size variables
        size = tx.cast(wide, size)
    if mode == "wrap":
        index = index % size
    else:
        if mode == "fast":
            index = tx.select(index < 0, index + size, index)
        index = clamp(index, 0, size - 1)
    return tx.cast("int32", index)


def _take_compute(attrs: TakeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, indices = inputs
    dims = te_dims(data)
    if attrs.axis is None:
        size: DimExpr = 1
        for d in dims:
            size = size * d

        def element(*i: tx.PrimExpr) -> tx.PrimExpr:
            return data[unravel(_safe_index(indices[i], size, attrs.mode), dims)]
    else:
        axis, k = normalize_axis(attrs.axis, data.ndim), indices.ndim

        def element(*i: tx.PrimExpr) -> tx.PrimExpr:
            at = _safe_index(indices[i[axis : axis + k]], dims[axis], attrs.mode)
            index = (*i[:axis], at, *i[axis + k :])
            return data[index]

    return [te.compute(shape_dims(out_type), element, name="take")]


(register_op("take").describe("the elements of data at the given indices along an axis")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer indices")
    .set_attrs_type(TakeAttrs)
    .add_type_rel("Take", _take_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _take_ref)
    .set_attr(attr.FCompute, _take_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.take_grad))


@constructor("take")
def take(data: Expr, indices: Expr, axis: int | None = None, mode: str = "clip") -> Call:
    """`data` indexed by `indices` along `axis` (None: the flattened data); mode is clip, wrap or fast."""
    return call("take", [data, indices], TakeAttrs.make("take", axis=axis, mode=mode))


# --- gather_elements, gather_nd ---------------------------------------------------------------


def _index_tensor(t: TensorType, arg: int, what: str = "indices") -> None:
    if not t.dtype.is_int:
        raise RelationError(f"expected integer {what}, found dtype {t.dtype}", arg=arg)


def _in_range(index: tx.PrimExpr, size: DimExpr) -> tx.PrimExpr:
    """A data-dependent `index` into an axis of `size` as int32, negative ones counted from the end (ONNX's
    rule); clamped, so that an index out of range reads a wrong element instead of memory outside the tensor."""
    return _safe_index(index, size, "fast")


def _no_axis_to_index(data: TensorType, axes: Sequence[int], indices: Shape, arg: int) -> None:
    """RelationError when `indices` name elements (the shape has no 0) along an axis of `data` of size 0:
    no index is in range there, and a read would fall outside the tensor."""
    empty = [a for a in axes if data.shape[a] == 0]
    if empty and 0 not in indices:
        raise RelationError(f"data of shape {shape_str(data.shape)} has no elements along axis {empty[0]} for the "
                            f"indices of shape {shape_str(indices)} to pick", arg=arg)


def _normalized(index: Array, size: int, what: str = "index") -> Array:
    """numpy: `index` with negative entries counted from the end; ValueError for one out of [-size, size)."""
    index = np.asarray(index, dtype=np.int64)
    if index.size and (index.min() < -size or index.max() >= size):
        raise ValueError(f"{what} out of range [{-size}, {size})")
    return np.where(index < 0, index + size, index)


def _axis_indices_fit(data: TensorType, indices: TensorType, axis: int) -> None:
    """RelationError unless `indices` (of gather_elements, scatter_elements) have data's rank and fit in it
    off `axis`."""
    if indices.ndim != data.ndim:
        raise RelationError(f"indices have rank {indices.ndim} but data has rank {data.ndim}; they must agree", arg=1)
    axis = normalize_axis(axis, data.ndim)
    for k, (a, b) in enumerate(zip(indices.shape, data.shape, strict=True)):
        if k != axis and isinstance(a, int) and isinstance(b, int) and a > b:
            raise RelationError(f"indices of shape {shape_str(indices.shape)} do not fit data of shape "
                                f"{shape_str(data.shape)}: dim {k} is larger", arg=1)
    _no_axis_to_index(data, [axis], indices.shape, 1)


@attrs.frozen
class AxisIndexAttrs(Attrs):
    """The axis that gather_elements reads along or scatter_elements writes along, and how scatters combine."""

    axis: int = attrs.field(default=0, validator=int_range(), metadata={"doc": "the indexed axis"})
    reduction: str = attrs.field(
        default="none", validator=one_of("none", "add", "mul", "max", "min"),
        metadata={"doc": "scatters: how an update combines with the element it lands on (none: replaces it)"},
    )


def _gather_elements_rel(arg_types: list[Type], attrs: AxisIndexAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, indices = tensors
    _index_tensor(indices, 1)
    _axis_indices_fit(data, indices, attrs.axis)
    return TensorType(indices.shape, data.dtype)


def _gather_elements_ref(attrs: AxisIndexAttrs, x: Array, indices: Array) -> Array:
    axis = normalize_axis(attrs.axis, x.ndim)
    index = _normalized(indices, x.shape[axis])
    window = tuple(slice(None) if k == axis else slice(0, d) for k, d in enumerate(index.shape))
    return np.asarray(np.take_along_axis(x[window], index, axis=axis))


def _gather_elements_compute(attrs: AxisIndexAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, indices = inputs
    axis, dims = normalize_axis(attrs.axis, data.ndim), te_dims(data)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        index = (*i[:axis], _in_range(indices[i], dims[axis]), *i[axis + 1 :])
        return data[index]

    return [te.compute(shape_dims(out_type), element, name="gather_elements")]


(register_op("gather_elements").describe("data[..., indices[i], ...] along an axis, element by element")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer indices of data's rank (negative count from the end)")
    .set_attrs_type(AxisIndexAttrs)
    .add_type_rel("GatherElements", _gather_elements_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _gather_elements_ref)
    .set_attr(attr.FCompute, _gather_elements_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.gather_elements_grad))


@constructor("gather_elements")
def gather_elements(data: Expr, indices: Expr, axis: int = 0) -> Call:
    """ONNX GatherElements: `out[i] = data[i with i[axis] replaced by indices[i]]`."""
    return call("gather_elements", [data, indices], AxisIndexAttrs.make("gather_elements", axis=axis))


@attrs.frozen
class GatherNDAttrs(Attrs):
    """How many leading dims gather_nd treats as batch dims."""

    batch_dims: int = attrs.field(default=0, validator=int_range(0), metadata={"doc": "the leading batch dims"})


def _nd_depth(indices: TensorType, most: int, what: str) -> int:
    """The static last dim of `indices` of gather_nd/scatter_nd: how many dims of data one index tuple names."""
    if indices.ndim < 1:
        raise RelationError("indices must have rank 1 or more", arg=1)
    depth = indices.shape[-1]
    if not isinstance(depth, int):
        raise RelationError(f"the last dim of indices (shape {shape_str(indices.shape)}) must be static", arg=1)
    if not 1 <= depth <= most:
        raise RelationError(
            f"the last dim of indices (shape {shape_str(indices.shape)}) is {depth}; {what} allows 1 to {most}", arg=1)
    return depth


def _and_then(index: Sequence[tx.PrimExpr], j: int) -> tuple[tx.PrimExpr, ...]:
    """`index` followed by the constant `j`: entry j of an index tuple along the last dim of indices."""
    return (*index, tx.const(j))


def _gather_nd_rel(arg_types: list[Type], attrs: GatherNDAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, indices = tensors
    _index_tensor(indices, 1)
    b = attrs.batch_dims
    if b >= min(data.ndim, indices.ndim):
        raise RelationError(f"batch_dims {b} must be less than the ranks of data ({data.ndim}) and indices "
                            f"({indices.ndim})", arg=1)
    pairs = zip(data.shape[:b], indices.shape[:b], strict=True)
    if any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in pairs):
        raise RelationError(f"the {b} batch dims of data {shape_str(data.shape)} and indices "
                            f"{shape_str(indices.shape)} differ", arg=1)
    depth = _nd_depth(indices, data.ndim - b, f"data of rank {data.ndim} with batch_dims {b}")
    _no_axis_to_index(data, range(b, b + depth), indices.shape[:-1], 1)
    return TensorType((*indices.shape[:-1], *data.shape[b + depth :]), data.dtype)


def _gather_nd_ref(attrs: GatherNDAttrs, x: Array, indices: Array) -> Array:
    b, depth = attrs.batch_dims, indices.shape[-1]
    batch = int(np.prod(x.shape[:b], dtype=np.int64))
    xs, idx = x.reshape((batch, *x.shape[b:])), indices.reshape((batch, -1, depth))
    cols = [_normalized(idx[..., j], x.shape[b + j]) for j in range(depth)]
    where = (np.arange(batch)[:, None], *cols)
    out = xs[where]
    return np.asarray(out.reshape((*indices.shape[:-1], *x.shape[b + depth :])))


def _gather_nd_compute(attrs: GatherNDAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    data, indices = inputs
    dims, b, lead = te_dims(data), attrs.batch_dims, indices.ndim - 1
    depth = te_dims(indices)[-1]
    assert isinstance(depth, int)  # the relation requires a static last dim

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        picked = [_in_range(indices[_and_then(i[:lead], j)], dims[b + j]) for j in range(depth)]
        index = (*i[:b], *picked, *i[lead:])
        return data[index]

    return [te.compute(shape_dims(out_type), element, name="gather_nd")]


(register_op("gather_nd").describe("slices of data at index tuples (ONNX GatherND, with batch dims)")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer index tuples along the last dim (negative count from the end)")
    .set_attrs_type(GatherNDAttrs)
    .add_type_rel("GatherND", _gather_nd_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _gather_nd_ref)
    .set_attr(attr.FCompute, _gather_nd_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.gather_nd_grad))


@constructor("gather_nd")
def gather_nd(data: Expr, indices: Expr, batch_dims: int = 0) -> Call:
    """ONNX GatherND: the slices of `data` that the tuples along the last dim of `indices` name."""
    return call("gather_nd", [data, indices], GatherNDAttrs.make("gather_nd", batch_dims=batch_dims))


# --- scatter_elements, scatter_nd -------------------------------------------------------------

_NP_COMBINE: dict[str, Any] = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_rel(arg_types: list[Type], attrs: Any) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, indices, updates = tensors
    _index_tensor(indices, 1)
    if updates.dtype != data.dtype:
        raise RelationError(f"updates have dtype {updates.dtype} but data has {data.dtype}; they must agree", arg=2)
    if isinstance(attrs, AxisIndexAttrs):  # scatter_elements: indices and updates of one shape, data's rank
        expected: Shape = indices.shape
        _axis_indices_fit(data, indices, attrs.axis)
    else:
        depth = _nd_depth(indices, data.ndim, f"data of rank {data.ndim}")
        expected = (*indices.shape[:-1], *data.shape[depth:])
        _no_axis_to_index(data, range(depth), indices.shape[:-1], 1)
    if len(expected) != updates.ndim or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(expected, updates.shape, strict=False)
    ):
        raise RelationError(f"updates have shape {shape_str(updates.shape)}; expected {shape_str(expected)}", arg=2)
    return data


def _scatter_ref(attrs: Any, x: Array, indices: Array, updates: Array) -> Array:
    out = x.copy()
    if isinstance(attrs, AxisIndexAttrs):
        axis = normalize_axis(attrs.axis, x.ndim)
        where: list[Array] = list(np.indices(indices.shape, sparse=False))
        where[axis] = _normalized(indices, x.shape[axis])
        targets = [tuple(int(w[u]) for w in where) for u in np.ndindex(indices.shape)]
        values = [updates[u] for u in np.ndindex(indices.shape)]
    else:
        depth, lead = indices.shape[-1], indices.shape[:-1]
        cols = [_normalized(indices[..., j], x.shape[j]) for j in range(depth)]
        targets = [tuple(int(c[u]) for c in cols) for u in np.ndindex(lead)]
        values = [updates[u] for u in np.ndindex(lead)]
    combine = _NP_COMBINE.get(attrs.reduction)
    for target, value in zip(targets, values, strict=True):  # in order: with duplicates, the last write wins
        out[target] = value if combine is None else combine(out[target], value)
    return np.asarray(out)


def _scatter_compute(attrs: Any, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Each output element gathers the updates that land on it: a reduction over the update positions
    that can reach it (the indexed axis for scatter_elements, the index tuples for scatter_nd)."""
    data, indices, updates = inputs
    dims, upd = static_shape(data), static_shape(updates)
    nd = not isinstance(attrs, AxisIndexAttrs)
    if nd:
        depth = static_shape(indices)[-1]
        lead = static_shape(indices)[:-1]
        count = int(np.prod(lead, dtype=np.int64))
    else:
        axis = normalize_axis(attrs.axis, data.ndim)
        count = upd[axis]
    if count == 0:
        return [te.compute(dims, lambda *i: data[i], name="scatter")]
    k = te.reduce_axis((0, count), name="k")

    def source(i: Sequence[tx.PrimExpr], k: tx.PrimExpr) -> tuple[tuple[tx.PrimExpr, ...], tx.PrimExpr]:
        """The index of update `k` that could land on output element `i`, and whether it does."""
        if nd:
            u = unravel(k, lead)
            hits = [tx.eq(_in_range(indices[_and_then(u, j)], dims[j]), i[j]) for j in range(depth)]
            return (*u, *i[depth:]), tx.all_of(*hits)
        # updates may be smaller than data off the axis: the elements past them take no update
        inside = [i[d] < upd[d] for d in range(data.ndim) if d != axis and upd[d] < dims[d]]
        at = tuple(k if d == axis else (clamp(i[d], 0, upd[d] - 1) if upd[d] < dims[d] else i[d])
                   for d in range(data.ndim))
        return at, tx.all_of(*inside, tx.eq(_in_range(indices[at], dims[axis]), i[axis]))

    if attrs.reduction == "none":
        def last(*i: tx.PrimExpr) -> tx.PrimExpr:
            _, hit = source(i, k.var)
            return te.max(tx.select(hit, k.var, -1), axis=k)

        winner = te.compute(dims, last, name="scatter_winner")

        def replace(*i: tx.PrimExpr) -> tx.PrimExpr:
            at, _ = source(i, clamp(winner[i], 0, count - 1))
            return tx.select(winner[i] >= 0, updates[at], data[i])

        return [te.compute(dims, replace, name="scatter")]
    reducer = {"add": te.sum, "mul": te.prod, "max": te.max, "min": te.min}[attrs.reduction]
    combines: dict[str, Callable[[tx.PrimExpr, tx.PrimExpr], tx.PrimExpr]] = {
        "add": operator.add, "mul": operator.mul, "max": tx.max_, "min": tx.min_}
    combine = combines[attrs.reduction]

    def gathered(*i: tx.PrimExpr) -> tx.PrimExpr:
        at, hit = source(i, k.var)
        return reducer(updates[at], axis=k, where=hit)

    acc = te.compute(dims, gathered, name="scatter_updates")
    return [te.compute(dims, lambda *i: combine(data[i], acc[i]), name="scatter")]


(register_op("scatter_elements").describe("data with updates written (or combined) at indices along an axis")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer indices along the axis, of updates' shape")
    .add_argument("updates", "Tensor", "the values to write")
    .set_attrs_type(AxisIndexAttrs)
    .add_type_rel("ScatterElements", _scatter_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _scatter_ref)
    .set_attr(attr.FCompute, _scatter_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.scatter_elements_grad))


@constructor("scatter_elements")
def scatter_elements(data: Expr, indices: Expr, updates: Expr, axis: int = 0, reduction: str = "none") -> Call:
    """ONNX ScatterElements: `data` with `updates[i]` written at `i` with `i[axis]` replaced by `indices[i]`.

    Args:
        data: the tensor written into.
        indices: integer indices along `axis` (negative count from the end), of `updates`' shape.
        updates: the values.
        axis: the indexed axis.
        reduction: none (an update replaces the element; of duplicates the last wins), add, mul, max or min.

    Returns:
        The call of `scatter_elements`.
    """
    scatter = AxisIndexAttrs.make("scatter_elements", axis=axis, reduction=reduction)
    return call("scatter_elements", [data, indices, updates], scatter)


@attrs.frozen
class ScatterNDAttrs(Attrs):
    """How scatter_nd combines an update with the element it lands on."""

    reduction: str = attrs.field(
        default="none", validator=one_of("none", "add", "mul", "max", "min"),
        metadata={"doc": "none (an update replaces the element), add, mul, max or min"},
    )


(register_op("scatter_nd").describe("data with slices of updates written (or combined) at index tuples")
    .add_argument(*DATA_ARG)
    .add_argument("indices", "Tensor", "integer index tuples along the last dim")
    .add_argument("updates", "Tensor", "the slices: indices.shape[:-1] + data.shape[depth:]")
    .set_attrs_type(ScatterNDAttrs)
    .add_type_rel("ScatterND", _scatter_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _scatter_ref)
    .set_attr(attr.FCompute, _scatter_compute)
    .set_attr(attr.FPrimalGradient, indexing_grad.scatter_nd_grad))


@constructor("scatter_nd")
def scatter_nd(data: Expr, indices: Expr, updates: Expr, reduction: str = "none") -> Call:
    """ONNX ScatterND: `data` with the slices of `updates` written at the index tuples along indices' last dim."""
    return call("scatter_nd", [data, indices, updates], ScatterNDAttrs.make("scatter_nd", reduction=reduction))
