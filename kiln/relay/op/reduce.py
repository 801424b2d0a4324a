"""Reductions: sum, mean, max, min, prod; argmax, argmin.

Every reduction takes `axis` (None for all axes, or a tuple of axes; negative
axes count from the end), `keepdims` (keep each reduced axis as a dim of 1) and
`exclude` (reduce over every axis *not* in `axis`), with TVM's meaning. Each
op is declared in one `register_op` chain (description, argument, attrs,
relation, pattern, numpy reference, compute, schedule) after the functions it
names, in a loop over its family's table; its Python constructor follows,
checked against it (`@constructor`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, bool_value, int_tuple, optional, to_opt_int_tuple
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, Type
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import accumulator
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, tensor_args
from kiln.relay.op._schedule import schedule_reduce
from kiln.relay.op.cuda_reduce import ROW_REDUCE, schedule_rows_cuda
from kiln.target import Target
from kiln.te.ops import Reducer
from kiln.tir import expr as tx
from kiln.tir.expr import IntImm, PrimExpr

Array = np.ndarray[Any, Any]

# TVM's support level of the reduction ops
_LEVEL = 4


@attrs.frozen
class ReduceAttrs(Attrs):
    """Attributes of sum, mean, max, min and prod."""

    axis: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=to_opt_int_tuple,
        validator=optional(int_tuple()),
        metadata={"doc": "the axes to reduce (None: all axes); negative axes count from the end"},
    )
    keepdims: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "keep each reduced axis as a dim of size 1"}
    )
    exclude: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "reduce over the axes NOT in axis instead"}
    )


def _single_axis(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    ok = value is None or (
        isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], int) and not isinstance(value[0], bool)
    )
    if not ok:
        raise FieldError(field.name, "None or a single axis (an arg-reduction reduces one axis or all)", value)


@attrs.frozen
class ArgReduceAttrs(Attrs):
    """Attributes of argmax and argmin."""

    axis: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=to_opt_int_tuple,
        validator=_single_axis,
        metadata={"doc": "the axis to reduce (None: all axes, giving the index into the flattened tensor)"},
    )
    keepdims: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "keep the reduced axis as a dim of size 1"}
    )
    exclude: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "reduce over the axes NOT in axis instead"}
    )
    select_last_index: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "on ties, the last index instead of the first"}
    )


AnyReduceAttrs = ReduceAttrs | ArgReduceAttrs


def reduce_axes(ndim: int, axis: Sequence[int] | None, exclude: bool = False) -> list[int]:
    """The axes a reduction reduces, ascending and non-negative.

    Args:
        ndim: the rank of the reduced tensor.
        axis: the `axis` attribute (None for all axes; negative axes count from the end).
        exclude: whether to reduce the axes not in `axis` instead (ignored when `axis` is None, as in TVM).

    Returns:
        The reduced axes.

    Raises:
        RelationError: an axis is out of range or given twice.
    """
    if axis is None:
        return list(range(ndim))
    seen: dict[int, int] = {}
    for a in axis:
        n = normalize_axis(a, ndim)
        if n in seen:
            raise RelationError(
                f"axis {a} is given twice in axis {tuple(axis)} (it names dim {n} of a tensor of rank {ndim}, "
                f"as axis {seen[n]} does)"
            )
        seen[n] = a
    if exclude:
        return [i for i in range(ndim) if i not in seen]
    return sorted(seen)


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """The shape after reducing `axes` of `shape` (dims of 1 in their place when `keepdims`)."""
    reduced = set(axes)
    if keepdims:
        return tuple(1 if i in reduced else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def _make_relation(
    name: str, numeric: bool, nonempty: bool, out_dtype: str | None = None
) -> Callable[[list[Type], AnyReduceAttrs], Type | None]:
    def relation(arg_types: list[Type], attrs: AnyReduceAttrs) -> Type | None:
        tensors = tensor_args(arg_types)
        if tensors is None:
            return None
        data = tensors[0]
        if numeric and data.dtype.is_bool:
            raise RelationError("expected a numeric tensor, found dtype bool", arg=0)
        axes = reduce_axes(data.ndim, attrs.axis, attrs.exclude)
        if isinstance(attrs, ArgReduceAttrs) and len(axes) not in (1, data.ndim):
            raise RelationError(
                f"{name} reduces one axis or all of them, but axis {attrs.axis} with exclude={attrs.exclude} "
                f"leaves axes {tuple(axes)} of a tensor of rank {data.ndim}"
            )
        if nonempty:
            for a in axes:
                if data.shape[a] == 0:
                    raise RelationError(
                        f"axis {a} of shape {_shape_str(data.shape)} has size 0: "
                        f"the {name} of no elements is undefined",
                        arg=0,
                    )
        dtype = DataType.of(out_dtype) if out_dtype is not None else data.dtype
        return TensorType(reduced_shape(data.shape, axes, attrs.keepdims), dtype)

    relation.__name__ = relation.__qualname__ = f"{name}_rel"
    return relation


def _shape_str(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# --- te computes, shared -----------------------------------------------------------------

# max and min of bools: any and all (the numeric reducers start from the dtype's lowest / highest number)
_BOOL_REDUCERS = {
    "max": te.comm_reducer(tx.any_of, lambda t: tx.const(False), name="any"),
    "min": te.comm_reducer(tx.all_of, lambda t: tx.const(True), name="all"),
}
_REDUCERS: dict[str, Reducer] = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}


def _reducer(kind: str, dtype: str) -> Reducer:
    return _BOOL_REDUCERS[kind] if dtype == "bool" else _REDUCERS[kind]


def _extent(d: PrimExpr) -> int:
    if not isinstance(d, IntImm):
        raise te.TEError(f"a reduction compute needs static shapes; found dim {d}")
    return d.value


def _static(out_type: TensorType) -> tuple[int, ...]:
    return tuple(d for d in out_type.shape if isinstance(d, int))


def _input_index(
    ndim: int, axes: Sequence[int], keepdims: bool, out_index: Sequence[PrimExpr], rvs: Sequence[PrimExpr]
) -> tuple[PrimExpr, ...]:
    """The element of the reduced tensor that output element `out_index` reads at reduction point `rvs`."""
    outs, reds = iter(out_index), iter(rvs)
    index = []
    for d in range(ndim):
        if d in axes:
            index.append(next(reds))
            if keepdims:
                next(outs)  # the kept dim of 1
        else:
            index.append(next(outs))
    return tuple(index)


def _reduce(
    x: te.Tensor, attrs: AnyReduceAttrs, shape: Sequence[int], kind: str, dtype: str, name: str,
    mark: dict[str, Any] | None = None,
) -> te.Tensor:
    """`x` reduced by reducer `kind` over the axes `attrs` names, its elements first cast to `dtype`; `mark`
    becomes the compute's attrs."""
    axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
    rvs = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
    reducer = _reducer(kind, dtype)

    def element(*out_index: PrimExpr) -> PrimExpr:
        value = te.cast(x[_input_index(x.ndim, axes, attrs.keepdims, out_index, rvs)], dtype)
        return reducer(value, axis=rvs) if rvs else value

    return te.compute(tuple(shape), element, name=name, attrs=mark)


def _cuda_mark(x: te.Tensor, attrs: AnyReduceAttrs, cuda: bool) -> dict[str, Any] | None:
    """For the cuda "rows" implementation: the output's mark for `schedule_rows_cuda`, which says whether
    each output's elements are contiguous in `x` (the reduced axes are its last ones)."""
    if not cuda:
        return None
    axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
    return {ROW_REDUCE: axes == list(range(x.ndim - len(axes), x.ndim))}


def _schedule_two_stage(
    sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor], target: Target
) -> None:
    """`schedule_reduce`, with the reduction that mean, argmax and argmin compute first on the cores too."""
    first = [
        t for a in anchor_outs for t in a.op.input_tensors if isinstance(t.op, te.ComputeOp) and t.op.reduce_axis
    ]
    schedule_reduce(sch, [*first, *anchor_outs], outs, target)


# --- sum, mean, max, min, prod ---------------------------------------------------------


def _reduce_reference(fn: Callable[..., Any]) -> Callable[[ReduceAttrs, Array], Array]:
    def reference(attrs: ReduceAttrs, x: Array) -> Array:
        axes = tuple(reduce_axes(x.ndim, attrs.axis, attrs.exclude))
        out = fn(x, axis=axes, keepdims=attrs.keepdims)
        # mean of ints truncates toward zero, as TVM's integer division of the sum
        return np.asarray(out).astype(x.dtype, copy=False)

    reference.__name__ = reference.__qualname__ = f"{getattr(fn, '__name__', 'reduce')}_reference"
    return reference


def _reduce_compute(
    kind: str, cuda: bool = False
) -> Callable[[ReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """The compute of reduction `kind`; with `cuda`, its output marked for `schedule_rows_cuda`."""

    def compute(attrs: ReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape = _static(out_type)
        mark = _cuda_mark(x, attrs, cuda)
        if kind in ("sum", "prod") and tx.is_float(x.dtype) and accumulator(x.dtype) != x.dtype:
            total = _reduce(x, attrs, shape, kind, accumulator(x.dtype), f"T_{kind}_acc")
            return [te.compute(shape, lambda *i: te.cast(total[i], x.dtype), name=f"T_{kind}", attrs=mark)]
        return [_reduce(x, attrs, shape, kind, x.dtype, f"T_{kind}", mark)]

    compute.__name__ = compute.__qualname__ = f"{kind}_{'cuda_' if cuda else ''}compute"
    return compute


def _mean_compute(cuda: bool = False) -> Callable[[ReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """The sum, then divided by the count: of floats in their dtype (float32 for narrower ones); of
    integers summed in int64 and divided truncating (the reference truncates the exact mean toward zero).
    With `cuda`, the output is marked for `schedule_rows_cuda`."""

    def compute(attrs: ReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape, dtype = _static(out_type), x.dtype
        count = int(np.prod([_extent(x.shape[a]) for a in reduce_axes(x.ndim, attrs.axis, attrs.exclude)]))
        acc = accumulator(dtype)
        total = _reduce(x, attrs, shape, "sum", acc, "T_mean_sum")
        n = tx.const(count, acc)
        return [te.compute(shape, lambda *i: te.cast(total[i] / n, dtype), name="T_mean",
                           attrs=_cuda_mark(x, attrs, cuda))]

    compute.__name__ = compute.__qualname__ = f"mean_{'cuda_' if cuda else ''}compute"
    return compute


_REDUCE: list[tuple[str, str, Callable[..., Any], bool, bool, Callable[..., Any], Callable[..., None] | None]] = [
    # name, description, numpy function, numeric only, refuses empty axes, compute (given whether it is the
    # cuda one), CPU schedule (None: the pattern's); sum and prod of narrow floats in two stages: the float32
    # sum, then the cast
    ("sum", "the sum of the elements over the given axes", np.sum, True, False, partial(_reduce_compute, "sum"),
     _schedule_two_stage),
    ("mean", "the mean of the elements over the given axes", np.mean, True, False, _mean_compute,
     _schedule_two_stage),
    ("max", "the largest element over the given axes", np.max, False, True, partial(_reduce_compute, "max"), None),
    ("min", "the smallest element over the given axes", np.min, False, True, partial(_reduce_compute, "min"), None),
    ("prod", "the product of the elements over the given axes", np.prod, True, False,
     partial(_reduce_compute, "prod"), _schedule_two_stage),
]

for _name, _doc, _fn, _numeric, _nonempty, _compute, _schedule in _REDUCE:
    _entry = (
        register_op(_name)
        .describe(_doc)
        .add_argument("data", "Tensor", "the tensor to reduce")
        .set_attrs_type(ReduceAttrs)
        .add_type_rel("Reduce", _make_relation(_name, _numeric, _nonempty))
        .set_support_level(_LEVEL)
        .set_attr(attr.TOpPattern, OpPattern.COMM_REDUCE)
        .set_attr(attr.FReference, _reduce_reference(_fn))
        .set_attr(attr.FCompute, _compute())
        .add_implementation("rows", _compute(cuda=True), schedule_rows_cuda, target="cuda", priority=10)
    )
    if _schedule is not None:  # max and min: the pattern's schedule
        _entry.set_attr(attr.FSchedule["llvm"], _schedule)


def _make_reduce(name: str) -> Callable[..., Call]:
    def fn(
        data: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False, exclude: bool = False
    ) -> Call:
        return call(name, [data], ReduceAttrs.make(name, axis=axis, keepdims=keepdims, exclude=exclude))

    fn.__name__ = fn.__qualname__ = name
    description = Op.get(name).description
    fn.__doc__ = f"""{name}(data, axis=None, keepdims=False, exclude=False): {description}.

    Args:
        data: the tensor to reduce.
        axis: an axis or axes to reduce; None reduces all axes.
        keepdims: keep each reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead.

    Returns:
        The call of `{name}`.
    """
    return constructor(name)(fn)


sum = _make_reduce("sum")
mean = _make_reduce("mean")
max = _make_reduce("max")
min = _make_reduce("min")
prod = _make_reduce("prod")


# --- argmax, argmin --------------------------------------------------------------------


def _arg_reference(fn: Callable[..., Any]) -> Callable[[ArgReduceAttrs, Array], Array]:
    def reference(attrs: ArgReduceAttrs, x: Array) -> Array:
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        # one axis, or every axis: then the index into the row-major flattened tensor
        data, axis = (x, axes[0]) if len(axes) == 1 else (x.reshape(-1), 0)
        if attrs.select_last_index:
            data = np.flip(data, axis=axis)
        idx = np.asarray(fn(data, axis=axis))
        if attrs.select_last_index:
            idx = data.shape[axis] - 1 - idx
        return idx.reshape(reduced_shape(x.shape, axes, attrs.keepdims)).astype(np.int32)

    reference.__name__ = reference.__qualname__ = f"{getattr(fn, '__name__', 'arg')}_reference"
    return reference


def _arg_compute(
    kind: str, cuda: bool = False
) -> Callable[[ArgReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """argmax (`kind` "max") or argmin ("min"): the extreme value first, then the first (or last) index
    holding it, or holding a NaN, as numpy's NaN is the extreme. All axes give the row-major flat index.
    With `cuda`, the output is marked for `schedule_rows_cuda` (both reductions across a row's threads:
    the extreme, then the smallest or largest index holding it; neither depends on the order)."""

    def compute(attrs: ArgReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape = _static(out_type)
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        if not axes:  # a 0-d tensor: its one element
            return [te.compute(shape, lambda *i: tx.const(0), name=f"T_arg{kind}")]
        best = _reduce(x, attrs, shape, kind, x.dtype, f"T_arg{kind}_value")
        extents = [_extent(x.shape[a]) for a in axes]
        rvs = [te.reduce_axis((0, e), name=f"k{a}") for a, e in zip(axes, extents, strict=True)]
        flat: PrimExpr = tx.const(0)
        for rv, e in zip(rvs, extents, strict=True):
            flat = flat * e + rv

        def element(*out_index: PrimExpr) -> PrimExpr:
            v = x[_input_index(x.ndim, axes, attrs.keepdims, out_index, rvs)]
            hit = tx.eq(v, best[out_index])
            if tx.is_float(v.dtype):
                hit = tx.any_of(hit, tx.ne(v, v))
            if attrs.select_last_index:
                return te.max(tx.select(hit, flat, -1), axis=rvs)
            return te.min(tx.select(hit, flat, int(np.prod(extents))), axis=rvs)

        return [te.compute(shape, element, name=f"T_arg{kind}", attrs=_cuda_mark(x, attrs, cuda))]

    compute.__name__ = compute.__qualname__ = f"arg{kind}_{'cuda_' if cuda else ''}compute"
    return compute


for _name, _doc, _fn, _kind in [
    ("argmax", "the index of the largest element along an axis (int32)", np.argmax, "max"),
    ("argmin", "the index of the smallest element along an axis (int32)", np.argmin, "min"),
]:
    (
        register_op(_name)
        .describe(_doc)
        .add_argument("data", "Tensor", "the tensor to search")
        .set_attrs_type(ArgReduceAttrs)
        .add_type_rel("ArgReduce", _make_relation(_name, numeric=False, nonempty=True, out_dtype="int32"))
        .set_support_level(_LEVEL)
        .set_attr(attr.TOpPattern, OpPattern.COMM_REDUCE)
        .set_attr(attr.FReference, _arg_reference(_fn))
        .set_attr(attr.FCompute, _arg_compute(_kind))
        .add_implementation("rows", _arg_compute(_kind, cuda=True), schedule_rows_cuda, target="cuda", priority=10)
        .set_attr(attr.FSchedule["llvm"], _schedule_two_stage)
    )


def _arg_attrs(
    name: str, axis: int | Sequence[int] | None, keepdims: bool, exclude: bool, select_last_index: bool
) -> ArgReduceAttrs:
    return ArgReduceAttrs.make(
        name, axis=axis, keepdims=keepdims, exclude=exclude, select_last_index=select_last_index
    )


@constructor("argmax")
def argmax(
    data: Expr,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    exclude: bool = False,
    select_last_index: bool = False,
) -> Call:
    """The int32 index of the largest element along `axis`.

    Args:
        data: the tensor to search.
        axis: the axis to reduce; None searches the flattened tensor.
        keepdims: keep the reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead (that must leave one axis).
        select_last_index: on ties, the last index instead of the first.

    Returns:
        The call of `argmax`.
    """
    return call("argmax", [data], _arg_attrs("argmax", axis, keepdims, exclude, select_last_index))


@constructor("argmin")
def argmin(
    data: Expr,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    exclude: bool = False,
    select_last_index: bool = False,
) -> Call:
    """The int32 index of the smallest element along `axis`.

    Args:
        data: the tensor to search.
        axis: the axis to reduce; None searches the flattened tensor.
        keepdims: keep the reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead (that must leave one axis).
        select_last_index: on ties, the last index instead of the first.

    Returns:
        The call of `argmin`.
    """
    return call("argmin", [data], _arg_attrs("argmin", axis, keepdims, exclude, select_last_index))
