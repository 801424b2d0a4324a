"""Shape ops: reshape, transpose, squeeze, expand_dims, concatenate, stack,
broadcast_to, nn.batch_flatten, tile. (split, strided_slice and take live in
`indexing.py`; they are re-exported here, where they have always been imported from.
The creation ops full, zeros, ones, zeros_like, ones_like, shape_of and arange live
in `creation.py`.)

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
Ops that join several tensors (concatenate, stack) take ONE argument, a tuple,
as in TVM; their numpy reference receives it as a tuple of arrays; their
compute receives the tuple's tensors as its inputs.
"""

from __future__ import annotations

import itertools
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
    dims,
    int_range,
    int_tuple,
    optional,
    to_dims,
    to_int_tuple,
    to_opt_int_tuple,
)
from kiln.ir.types import ANY, Dim, SumDim, SymDim, TensorType, Type, dim_add, dim_div, dim_floordiv, dim_mul, dim_prod
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, Tuple, TupleGetItem, call
from kiln.relay.op._grad import collapse_sum_to, shape_of
from kiln.relay.op._nn_util import DimExpr, shape_dims, te_dims
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import (
    RelationError,
    normalize_axis,
    shape_relation,
    tuple_of_tensors,
)
from kiln.relay.op._schedule import op_attr, schedule_injective, static_size, vector_lanes, worth_parallel
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
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.dims import expr_dim
from kiln.tir.transform import PARTITION_SELECTS

# --- gradients (FPrimalGradient): each op's is named in its chain below ---------------------------


def _attrs(call: Call) -> Any:
    """The call's attrs, of its op's attrs class."""
    return call.attrs


def _as_input(call: Call, grad: Expr) -> list[Expr | None]:
    """reshape, squeeze, expand_dims, nn.batch_flatten: the gradient in the input's shape."""
    return [reshape(grad, shape_of(call.args[0]))]


def _transpose_grad(call: Call, grad: Expr) -> list[Expr | None]:
    ndim = len(shape_of(call.args[0]))
    axes = _attrs(call).axes if _attrs(call).axes is not None else tuple(range(ndim - 1, -1, -1))
    return [transpose(grad, [int(i) for i in np.argsort([a % ndim for a in axes])])]


def _field_shapes(call: Call) -> list[tuple[int, ...]]:
    """The static shapes of the tensors in the tuple argument of concatenate or stack."""
    return [tuple(int(d) for d in t.shape) for t in call.args[0].checked_type.fields]  # type: ignore[attr-defined]


def _concatenate_grad(call: Call, grad: Expr) -> list[Expr | None]:
    """The gradient split where the inputs were joined: a tuple, one field per input."""
    shapes = _field_shapes(call)
    axis = _attrs(call).axis % len(shapes[0])
    ends = list(itertools.accumulate(s[axis] for s in shapes))
    pieces = split(grad, ends[:-1], axis) if len(shapes) > 1 else None
    return [Tuple([TupleGetItem(pieces, i) if pieces is not None else grad for i in range(len(shapes))])]


def _stack_grad(call: Call, grad: Expr) -> list[Expr | None]:
    """The gradient cut into one slice per input along the new axis, each without that axis."""
    shapes = _field_shapes(call)
    pieces = split(grad, len(shapes), _attrs(call).axis)
    return [Tuple([reshape(TupleGetItem(pieces, i), s) for i, s in enumerate(shapes)])]


def _broadcast_to_grad(call: Call, grad: Expr) -> list[Expr | None]:
    """The gradient summed over the axes that broadcasting added or stretched."""
    return [collapse_sum_to(grad, shape_of(call), shape_of(call.args[0]))]


def _tile_grad(call: Call, grad: Expr) -> list[Expr | None]:
    """The gradient's copies summed: each output dim (reps, dim) as two dims, the reps summed away."""
    out, dims = shape_of(call), shape_of(call.args[0])
    padded = (1,) * (len(out) - len(dims)) + dims
    pairs = [(o // d if d else 1, d) for o, d in zip(out, padded, strict=True)]
    split_shape = tuple(v for p in pairs for v in p)
    summed = collapse_sum_to(reshape(grad, split_shape), split_shape, tuple(v for _, d in pairs for v in (1, d)))
    return [reshape(summed, dims)]


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


def _ravel(index: Sequence[tx.PrimExpr], shape: Sequence[DimExpr]) -> tx.PrimExpr:
    """The element number, in row-major order, of `index` into a tensor of `shape`."""
    flat: tx.PrimExpr = tx.const(0)
    stride: DimExpr = 1
    for i, d in zip(reversed(index), reversed(shape), strict=True):
        if not isinstance(d, int) or d != 1:
            flat = flat + (i * stride if not isinstance(stride, int) or stride != 1 else i)
        stride = stride * d
    return flat


def _as_dim(d: DimExpr) -> Dim:
    """A te dim as a relay dim (`kiln.tir.dims.expr_dim`), or ANY for an expression of another kind."""
    dim = d if isinstance(d, int) else expr_dim(d)
    return ANY if dim is None else dim


def _dims_alike(a: te.Tensor, b: te.Tensor) -> bool:
    """Whether two te tensors are known to have one shape."""
    da, db = [_as_dim(d) for d in te_dims(a)], [_as_dim(d) for d in te_dims(b)]
    return da == db and ANY not in da


def _reshape_groups(src: Sequence[Dim], dst: Sequence[Dim]) -> list[tuple[int, int]]:
    """Where a reshape from `src` to `dst` may be cut into independent reshapes: the pairs (k, m), from (0, 0)
    to (len(src), len(dst)), at which the products of src[:k] and of dst[:m] agree."""
    cuts = [(0, 0)]
    ps: Dim = 1
    for k in range(1, len(src)):
        ps = dim_mul(ps, src[k - 1])
        if ps == ANY or ps == 0:
            break
        pd: Dim = 1
        for m in range(1, len(dst)):
            pd = dim_mul(pd, dst[m - 1])
            if m > cuts[-1][1] and pd == ps:
                cuts.append((k, m))
                break
    cuts.append((len(src), len(dst)))
    return cuts


def _reshape_symbolic(x: te.Tensor, shape: tuple[int | SymDim | SumDim, ...], name: str) -> te.Tensor:
    """`_reshape_tensor` with symbolic dims: cut into groups of dims whose products agree (`_reshape_groups`),
    each axis of a group of one dim on each side (or of equal dims but 1s) read directly, a group whose dims
    differ (768 as 12 x 64) through its element number (in the group, so with a static group no division
    by a size variable)."""
    src = te_dims(x)
    src_dims = [_as_dim(d) for d in src]
    dst = [d if isinstance(d, int) else te.as_index(d) for d in shape]
    cuts = _reshape_groups(src_dims, shape)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        index: list[tx.PrimExpr] = []
        for (a, c), (b, d) in itertools.pairwise(cuts):
            kept_in = [k for k in range(a, b) if src_dims[k] != 1]
            kept_out = [k for k in range(c, d) if shape[k] != 1]
            if [src_dims[k] for k in kept_in] == [shape[k] for k in kept_out]:
                part: list[tx.PrimExpr] = [tx.const(0)] * (b - a)
                for k_in, k_out in zip(kept_in, kept_out, strict=True):
                    part[k_in - a] = i[k_out]
                index.extend(part)
            else:
                index.extend(unravel(_ravel(i[c:d], dst[c:d]), src[a:b], bounded=True))
        return x[tuple(index)]

    return te.compute(shape, element, name=name)


def _reshape_tensor(x: te.Tensor, out_shape: tuple[int | SymDim | SumDim, ...], name: str) -> te.Tensor:
    """`x`'s elements in row-major order in `out_shape` (the compute of reshape and its kin).

    When only dims of size 1 come and go (squeeze, expand_dims, most batch_flattens), each
    output axis reads its input axis directly; otherwise through the element number.
    Symbolic shapes go through `_reshape_symbolic`.
    """
    shape = tuple(d for d in out_shape if isinstance(d, int))
    if len(shape) < len(out_shape) or not all(isinstance(d, tx.IntImm) for d in x.shape):
        return _reshape_symbolic(x, out_shape, name)
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
    return [_reshape_tensor(inputs[0], shape_dims(out_type), "reshape")]


# --- reshape, transpose, squeeze, expand_dims ----------------------------------------------


@attrs.frozen
class ReshapeAttrs(Attrs):
    """The new shape of reshape: 0 copies the input dim at that position (a size 0 with allowzero), -1 is inferred."""

    newshape: tuple[Dim, ...] = attrs.field(
        converter=to_dims, validator=dims(lo=-1),
        metadata={"doc": "the new shape (0: copy, -1: infer, a size such as n: that size)"}
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
        if inferred == ANY and isinstance(known, int) and total != ANY:
            inferred = dim_floordiv(total, known)  # exact only at some sizes: `_reshape_checks` says which
        out[infer_at] = inferred
    elif isinstance(total, int) and isinstance(known, int) and total != known:
        raise mismatch  # (symbolic counts that differ may agree at some sizes: `_reshape_checks`)
    return tuple(out)


def _reshape_checks(attrs: ReshapeAttrs, arg_types: list[Type]) -> list[tuple[Dim, Dim, str]]:
    """The element counts agree where the types cannot tell: a -1 inferred as a quotient (floordiv(n*s, 4)) fits
    only the sizes it divides; a shape of sizes ((n, floordiv(s, 2), 64) of (n, s, 32)) only some sizes."""
    assert isinstance(arg_types[0], TensorType)
    shape = arg_types[0].shape
    total, filled = dim_prod(shape), dim_prod(_reshape_shape([shape], attrs))
    if total == filled or ANY in (total, filled):
        return []
    what = f"the reshape of {_shape_str(shape)} to {_shape_str(attrs.newshape)} (its {total} elements)"
    return [(total, filled, what), (filled, total, what)]


def _reshape_ref(attrs: ReshapeAttrs, x: Array) -> Array:
    copy = not attrs.allowzero
    return np.reshape(x, [x.shape[i] if v == 0 and copy else v for i, v in enumerate(attrs.newshape)])


(register_op("reshape").describe("the elements in row-major order, in a new shape (0 copies a dim, -1 is inferred)")
    .add_argument(*_DATA).set_attrs_type(ReshapeAttrs)
    .add_type_rel("Reshape", shape_relation(_reshape_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _reshape_ref)
    .set_attr(attr.FCompute, _reshape_compute)
    .set_attr(attr.FSizeCheck, _reshape_checks)
    .set_attr(attr.FPrimalGradient, _as_input))


@constructor("reshape")
def reshape(data: Expr, newshape: int | Sequence[Dim | str], allowzero: bool = False) -> Call:
    """`data` in shape `newshape`, where a 0 copies the input dim at that position and one -1 is inferred.

    A dim may be symbolic (`SizeVar("n")`, or the text "n", "2*n"): a size of the input's shape.

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

    return [te.compute(shape_dims(out_type), element, name="transpose")]


(register_op("transpose").describe("permutes the dims")
    .add_argument(*_DATA).set_attrs_type(TransposeAttrs)
    .add_type_rel("Transpose", shape_relation(_transpose_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.transpose(x, attrs.axes))
    .set_attr(attr.FCompute, _transpose_compute)
    .set_attr(attr.FPrimalGradient, _transpose_grad))


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
    .set_attr(attr.FCompute, _reshape_compute)
    .set_attr(attr.FPrimalGradient, _as_input))


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
    .set_attr(attr.FCompute, _reshape_compute)
    .set_attr(attr.FPrimalGradient, _as_input))


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
    # (tensor, first output index on the axis, its size): expressions of the size variables where symbolic
    pieces: list[tuple[te.Tensor, DimExpr, DimExpr]] = []
    start: DimExpr = 0
    for x in inputs:
        size = te_dims(x)[axis]
        if not isinstance(size, int) or size:
            pieces.append((x, start, size))
        start = start + size
    shape = shape_dims(out_type)
    if not pieces:  # every input is empty along the axis, and so is the output
        return [te.compute(shape, lambda *i: te.const(0, inputs[0].dtype), name="concatenate")]

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        # both sides of a select may be loaded, so each piece's index is clamped into that piece
        def load(piece: tuple[te.Tensor, DimExpr, DimExpr]) -> tx.PrimExpr:
            x, first, size = piece
            index = (*i[:axis], clamp(i[axis] - first, 0, size - 1), *i[axis + 1 :])
            return x[index]

        value = load(pieces[-1])
        for piece, after in zip(pieces[-2::-1], pieces[:0:-1], strict=True):
            value = tx.select(i[axis] < after[1], load(piece), value)
        return value

    return [te.compute(shape, element, name="concatenate", attrs={_CONCAT_AXIS: axis})]


_CONCAT_AXIS = "concatenate.axis"  # attr of concatenate's compute: the axis it joins along


def _schedule_concatenate(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                          target: Target) -> None:
    """The loop over the joined axis is cut where one piece ends and the next begins (loop partitioning
    at the select's flips), so each piece is a plain copy: the axes inside the joined one fused and
    vectorized, the joined axis (with the ones outside it) on the cores.

    As the generic injective schedule, every select of the pieces was taken per element, and both
    sides' loads with it: SqueezeNet's concatenations ran at 3 GB/s. A group whose output is not the
    concatenation itself (a fused elementwise op after it keeps its shape and axes) is scheduled the
    same way when its output has the concatenation's shape, else generically.
    """
    out = outs[0]
    cat = _producer_with(out, _CONCAT_AXIS)  # the concatenation, or an elementwise op after it
    if len(outs) != 1 or cat is None or not _dims_alike(out, cat):
        schedule_injective(sch, anchor_outs, outs, target)
        return
    axis: int = op_attr(cat, _CONCAT_AXIS)
    stage = sch[out]
    axes = list(stage.op.axis)
    joined = axes[axis]
    inside = axes[axis + 1:]
    lanes = vector_lanes(out.dtype)
    last = te_dims(out)[-1]
    if inside and (not isinstance(last, int) or last >= lanes):  # a symbolic row: split, the tail guarded
        # the last axis alone in vectors (splitting the fused inner axes would leave a tail guard in
        # quotients, `(o * 16 + i) // 55 < 55`, which loop partitioning does not take out)
        _, vec = stage.split(inside[-1], factor=lanes)
        stage.vectorize(vec)
    elif inside:  # short rows (13 wide): the inner axes as one contiguous loop, vectorized whole
        stage.vectorize(inside[0] if len(inside) == 1 else stage.fuse(*inside))
    if axis and (not inside or any(not isinstance(d, int) for d in te_dims(out)[:axis + 1])):
        # the last axis joined, or symbolic outer axes: the outer axes fused among themselves (on the
        # cores), the joined axis its own loop inside them, cut at the pieces' ends. Fused with it, the
        # partition could not cut it (a select per element: (8, 128, 768 + 64) took 1.28 ms, now 0.12) and
        # a symbolic index was a division by a size variable
        rows = stage.fuse(*axes[:axis]) if axis > 1 else axes[0]
        stage.pragma(joined, PARTITION_SELECTS)
        size = static_size(out)
        if size is None or worth_parallel(size):
            stage.parallel(rows)
        return
    outer = stage.fuse(*axes[:axis + 1]) if axis else joined
    stage.pragma(outer, PARTITION_SELECTS)
    if worth_parallel(static_size(out)):
        stage.parallel(outer)


def _producer_with(t: te.Tensor, key: str) -> te.Tensor | None:
    """`t` or the first compute it reads, transitively, that carries attr `key`."""
    stack, seen = [t], set()
    while stack:
        cur = stack.pop()
        if id(cur.op) in seen or not isinstance(cur.op, te.ComputeOp):
            continue
        seen.add(id(cur.op))
        if op_attr(cur, key) is not None:
            return cur
        stack.extend(cur.op.input_tensors)
    return None


(register_op("concatenate").describe("joins a tuple of tensors along an existing axis")
    .add_argument("data", "Tuple", "the tensors (same rank and dtype; equal dims off the axis)")
    .set_attrs_type(AxisAttrs).add_type_rel("Concatenate", _concatenate_rel)
    .set_support_level(1).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, xs: np.concatenate(xs, axis=attrs.axis))
    .set_attr(attr.FCompute, _concatenate_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_concatenate)
    .set_attr(attr.FPrimalGradient, _concatenate_grad))


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
    shape = shape_dims(out_type)
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
    .set_attr(attr.FCompute, _stack_compute)
    .set_attr(attr.FPrimalGradient, _stack_grad))


@constructor("stack")
def stack(data: Expr | Sequence[Expr], axis: int = 0) -> Call:
    """The tensors in `data` (a list, or a tuple-typed expression) joined along a new axis `axis`."""
    return call("stack", [_as_tuple(data)], AxisAttrs.make("stack", axis=axis))


# --- broadcast_to, nn.batch_flatten, tile ------------------------------------------------


@attrs.frozen
class ShapeAttrs(Attrs):
    """An output shape (broadcast_to; the base of the creation ops' attrs): ints, or sizes such as n."""

    shape: tuple[Dim, ...] = attrs.field(
        converter=to_dims, validator=dims(lo=0), metadata={"doc": "the output shape"}
    )


def _broadcast_to_shape(shapes: list[Shape], attrs: ShapeAttrs) -> Shape:
    shape, target = shapes[0], attrs.shape
    problem = f"rank {len(shape)} is above {len(target)}" if len(shape) > len(target) else None
    for k, (d, t) in enumerate(zip(shape[::-1], target[::-1], strict=False)):
        if problem is None and isinstance(d, int) and isinstance(t, int) and d not in (1, t):
            problem = f"dim {len(shape) - 1 - k} is {d} against {t}"
    if problem:
        raise RelationError(f"shape {_shape_str(shape)} does not broadcast to {_shape_str(target)}: {problem}", arg=0)
    return target


def _broadcast_to_compute(attrs: ShapeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, shape = inputs[0], shape_dims(out_type)
    dims = te_dims(x)  # a symbolic dim equals its target dim (the relation says so)
    lead = len(shape) - len(dims)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(tx.const(0) if isinstance(d, int) and d == 1 else i[lead + k] for k, d in enumerate(dims))]

    return [te.compute(shape, element, name="broadcast_to")]


def _broadcast_to_checks(attrs: ShapeAttrs, arg_types: list[Type]) -> list[tuple[Dim, Dim, str]]:
    """A dim of the data that is not 1 equals its target dim: `n` broadcast to 4 needs n = 4."""
    assert isinstance(arg_types[0], TensorType)
    shape, target = arg_types[0].shape, attrs.shape
    out = []
    for k, (d, t) in enumerate(zip(shape[::-1], target[::-1], strict=False)):
        if d not in (1, t) and not (isinstance(d, int) and isinstance(t, int)):
            what = f"broadcasting dim {len(shape) - 1 - k} of the data ({d}) to {t}"
            out += [(d, t, what), (t, d, what)]
    return out


(register_op("broadcast_to").describe("the input broadcast (numpy rules) to a given shape")
    .add_argument(*_DATA).set_attrs_type(ShapeAttrs)
    .add_type_rel("BroadcastTo", shape_relation(_broadcast_to_shape))
    .set_support_level(4).set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, lambda attrs, x: np.array(np.broadcast_to(x, attrs.shape)))
    .set_attr(attr.FCompute, _broadcast_to_compute)
    .set_attr(attr.FSizeCheck, _broadcast_to_checks)
    .set_attr(attr.FPrimalGradient, _broadcast_to_grad))


@constructor("broadcast_to")
def broadcast_to(data: Expr, shape: Sequence[Dim | str]) -> Call:
    """`data` broadcast to `shape` with numpy's rules (a dim may be a size, such as n)."""
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
    .set_attr(attr.FCompute, _reshape_compute)
    .set_attr(attr.FPrimalGradient, _as_input))


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
    x, shape = inputs[0], shape_dims(out_type)
    dims = te_dims(x)
    lead = len(shape) - len(dims)

    def element(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[tuple(
            tx.const(0) if isinstance(d, int) and d == 1 else i[lead + k] if shape[lead + k] == _as_dim(d)
            else i[lead + k] % d
            for k, d in enumerate(dims)
        )]

    return [te.compute(shape, element, name="tile")]


(register_op("tile").describe("repeats the whole tensor along each dim (numpy.tile)")
    .add_argument(*_DATA).set_attrs_type(TileAttrs)
    .add_type_rel("Tile", shape_relation(_tile_shape))
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, lambda attrs, x: np.tile(x, attrs.reps))
    .set_attr(attr.FCompute, _tile_compute)
    .set_attr(attr.FPrimalGradient, _tile_grad))


@constructor("tile")
def tile(data: Expr, reps: int | Sequence[int]) -> Call:
    """`data` repeated `reps[i]` times along dim i (reps aligned to the last dims, as numpy.tile)."""
    return call("tile", [data], TileAttrs.make("tile", reps=reps))
